"""Stable descriptions of what decides a run's results, for checkpoints.

``describe`` turns settings (numbers, strings, arrays, functions with the
values their closures hold, jitted functions, partials, NamedTuples,
dataclasses) into JSON that is equal across processes exactly when the
settings are; ``data_fingerprint`` does so for the content of a run's
data; ``config_differences`` names every entry in which two descriptions
differ. ``fedjax_agg.checkpoint`` stores a run's description and refuses
to resume another's.
"""

import dataclasses
import functools
import types
import zlib
from typing import Any, Optional

import jax
import numpy as np

__all__ = ["config_differences", "data_fingerprint", "describe"]


def _crc(array: np.ndarray) -> int:
  # The bytes, whatever the dtype; ``view`` needs contiguous memory (a
  # transposed or sliced array is copied first).
  return zlib.crc32(np.ascontiguousarray(array).view(np.uint8).reshape(-1))


def describe(value: Any, _depth: int = 0, _seen: Optional[set] = None):
  """A JSON-able description of ``value`` that is stable across processes.

  Scalars and strings are kept; arrays become shape, dtype and CRC-32;
  functions become ``module.qualname`` and the description of the values
  their closures hold (so ``fedadp(alpha=5.0)`` and ``fedadp(alpha=3.0)``
  differ), jitted or decorated functions those of the function they wrap
  (so a local update's own training settings are covered);
  ``functools.partial`` its function and arguments; NamedTuples, lists and
  dicts their described items; anything else its type's name.
  """
  seen = set() if _seen is None else _seen
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, np.generic):
    # A numpy scalar describes as the Python number it holds: JSON-able, and
    # equal to a plain number holding the same value.
    return value.item()
  if isinstance(value, (np.ndarray, jax.Array)):
    # Typed keys cannot become numpy arrays; their raw data can.
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
      value = jax.random.key_data(value)
    host = np.asarray(value)
    return {"shape": list(host.shape), "dtype": str(host.dtype),
            "crc32": _crc(host)}
  if isinstance(value, jax.ShapeDtypeStruct):
    return {"shape": list(value.shape), "dtype": str(value.dtype)}
  # Cycles (a recursive function holds itself in its closure) and very deep
  # object graphs end in a fixed marker. ``seen`` is per path, not global: a
  # value shared by two branches is described in both, so the result does not
  # depend on the order of the walk.
  if _depth > 12 or id(value) in seen:
    return "..."
  seen = seen | {id(value)}
  recurse = functools.partial(describe, _depth=_depth + 1, _seen=seen)
  if isinstance(value, functools.partial):
    return {"partial": recurse(value.func),
            "args": [recurse(a) for a in value.args],
            "kwargs": {k: recurse(v) for k, v in sorted(
                value.keywords.items())}}
  if isinstance(value, types.FunctionType):
    # Named, never ``repr``'d: a function's repr holds its memory address, which
    # differs between the killed process and the resumed one.
    out = {"function": f"{value.__module__}.{value.__qualname__}"}
    closure = value.__closure__ or ()
    for name, cell in zip(value.__code__.co_freevars, closure, strict=True):
      try:
        out[name] = recurse(cell.cell_contents)
      except ValueError:  # an empty cell
        out[name] = "<empty>"
    return out
  # Before the plain tuple case: a NamedTuple keeps its field names.
  if isinstance(value, tuple) and hasattr(value, "_fields"):
    return {"type": type(value).__qualname__,
            **{f: recurse(getattr(value, f)) for f in value._fields}}
  # ``is_dataclass`` is also true of the class itself, which is not a setting.
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {"type": type(value).__qualname__,
            **{f.name: recurse(getattr(value, f.name))
               for f in dataclasses.fields(value)}}
  if isinstance(value, (list, tuple)):
    return [recurse(v) for v in value]
  if isinstance(value, dict):
    return {str(k): recurse(v) for k, v in value.items()}
  wrapped = getattr(value, "__wrapped__", None)
  if callable(value) and callable(wrapped):
    # A jitted or decorated function: what it wraps (and its closure).
    return recurse(wrapped)
  if callable(value) and hasattr(value, "__qualname__"):
    return {"function": f"{getattr(value, '__module__', '')}."
                        f"{value.__qualname__}"}
  # Only the type: an arbitrary object's repr may hold an address, and two
  # processes would then never agree.
  return {"type": f"{type(value).__module__}.{type(value).__qualname__}"}


def data_fingerprint(data) -> Any:
  """Content fingerprint of a ``FederatedData`` or of (x, y) arrays.

  Shapes, dtypes and CRC-32s of the pooled examples (so another dataset or
  another preprocessing differs), of every client's index row and count
  (so another partition with the same sizes differs) and of the
  validation split. Computed once per run (one pass over the arrays).
  """
  # ``FederatedData`` is a NamedTuple, hence a tuple: only a plain tuple or list
  # is an (x, y) pair.
  if isinstance(data, (tuple, list)) and not hasattr(data, "_fields"):
    return [describe(np.asarray(a)) for a in data]
  out = {"num_clients": int(data.num_clients),
         "x": describe(np.asarray(data.x)),
         "y": describe(np.asarray(data.y)),
         "client_indices": describe(np.asarray(data.client_indices)),
         "num_examples": describe(np.asarray(data.num_examples))}
  validation = getattr(data, "validation", None)
  if validation is not None:
    out["validation"] = {
        "client_indices": describe(np.asarray(validation.client_indices)),
        "num_examples": describe(np.asarray(validation.num_examples))}
  return out


def _flatten_dict(tree, prefix="") -> dict:
  if isinstance(tree, dict):
    out = {}
    for key, value in tree.items():
      out.update(_flatten_dict(value, f"{prefix}{key}."))
    return out
  return {prefix[:-1]: tree}


def _short(value, width: int = 160) -> str:
  text = repr(value)
  return text if len(text) <= width else text[:width - 3] + "..."


def config_differences(saved: dict, current: dict, limit: int = 12
                       ) -> list[str]:
  """'key: checkpoint X, now Y' for every entry that differs."""
  saved, current = _flatten_dict(saved), _flatten_dict(current)
  lines = []
  for key in sorted(set(saved) | set(current)):
    # A key only one side has is a difference too (a setting added or dropped).
    old, new = saved.get(key, "<absent>"), current.get(key, "<absent>")
    if old != new:
      lines.append(f"{key}: checkpoint {_short(old)}, now {_short(new)}")
  if len(lines) > limit:
    lines = lines[:limit] + [f"... and {len(lines) - limit} more"]
  return lines
