"""Strict JSON files: what the library writes can be read by any parser,
and what it reads says one thing.

``json.dump`` writes NaN and infinities as the bare tokens ``NaN`` and
``Infinity``, which are not JSON, and fails on numpy and JAX values.
``jsonable`` turns a value into plain JSON data (non-finite floats become
``null``, arrays become nested lists) and ``dump_json`` writes it
atomically: to a temporary file in the same folder, then renamed over the
destination, so a reader never sees half a file and a crash never leaves
one. A file written into a run's claimed folder is recorded in its
``manifest``. ``load_json`` reads a file a user wrote (a config) and
refuses an object that gives a key twice, naming its path
(``train.rounds``), where ``json.load`` would keep the last value.
"""

import json
import math
from typing import Any, Callable

import numpy as np

from fedjax_agg import manifest

__all__ = ["DuplicateKeyError", "dump_json", "jsonable", "load_json",
           "write_file", "write_text"]


def jsonable(value: Any) -> Any:
  """``value`` as plain JSON data.

  Mappings become dicts with string keys, sequences and arrays (numpy, JAX,
  anything with ``__array__``) become lists, numpy scalars become Python
  numbers, NaN and infinities become None. Anything else is written as its
  ``str``.
  """
  if value is None or isinstance(value, (bool, str)):
    return value
  if isinstance(value, int):
    return value
  # Strict JSON has no NaN or infinity; null keeps the file readable by any
  # parser, and readers of a history take null as NaN.
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, dict):
    return {_key(key): jsonable(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [jsonable(item) for item in value]
  if isinstance(value, np.generic) or hasattr(value, "__array__"):
    array = np.asarray(value)
    # ``tolist`` of such a dtype gives objects json cannot write; float64 holds
    # every bfloat16 value exactly.
    if array.dtype.kind == "V":  # bfloat16 and other extension floats
      array = array.astype(np.float64)
    return jsonable(array.tolist())
  # Last resort (a callable, a dataclass): a config echo must never fail on one
  # odd value; what it was stays readable.
  return str(value)


def _key(key: Any) -> str:
  # JSON keys are strings: a number or tuple key becomes its JSON text, as
  # json.dumps itself writes an int key.
  if isinstance(key, str):
    return key
  plain = jsonable(key)
  return plain if isinstance(plain, str) else json.dumps(plain)


def dump_json(obj: Any, path: str, indent: int | None = 2) -> str:
  """Writes ``jsonable(obj)`` to ``path`` atomically. Returns ``path``.

  Args:
    obj: what to write (see ``jsonable``).
    path: the file; its folder is created if missing.
    indent: spaces per nesting level (None: one line).
  """
  # allow_nan=False: ``jsonable`` removed every non-finite float, so one that
  # gets through is a bug to raise, never a bare NaN token in the file.
  text = json.dumps(jsonable(obj), indent=indent, allow_nan=False)
  return write_text(path, text + "\n")


def write_text(path: str, text: str) -> str:
  """Writes ``text`` to ``path`` atomically (``write_file``). Returns
  ``path``."""
  def write(temporary):
    # newline="": the text is written as given (csv ends its rows with \r\n
    # itself; no platform translation on top). "x": the temporary's name is
    # unique, so an existing file means a collision, never ours to write into.
    with open(temporary, "x", newline="") as f:
      f.write(text)
  return write_file(path, write)


def write_file(path: str, write: Callable[[str], None]) -> str:
  """Calls ``write(temporary)`` to write a temporary file in ``path``'s
  folder (created if missing), then renames it over ``path``: a reader
  never sees half a file (``manifest.write_atomically``). The file is
  recorded in a claimed run folder's ``manifest``. Returns ``path``."""
  manifest.write_atomically(path, write)
  manifest.note(path)
  return str(path)


class DuplicateKeyError(ValueError):
  """A JSON object that gives a key twice.

  Attributes:
    path: the key's dotted path in the document, e.g. "train.rounds",
      "algorithms.FedAvg", "a[2].b" (list items by index).
  """

  def __init__(self, path: str, message: str):
    super().__init__(message)
    self.path = path


class _Repeated(dict):
  """An object that gave ``key`` twice (``first``, then ``second``)."""

  def __init__(self, pairs, key, first, second):
    super().__init__(pairs)
    self.repeat = (key, first, second)


def _distinct_keys(pairs):
  """``object_pairs_hook``: a dict, or a ``_Repeated`` marking the first
  key given twice (its path is only known once the whole file is read)."""
  out = {}
  for key, value in pairs:
    # Not raised here: the hook sees one object and not where it sits; the path
    # is found once the whole document is parsed.
    if key in out:
      return _Repeated(pairs, key, out[key], value)
    out[key] = value
  return out


def _first_repeat(document) -> tuple[str, tuple] | None:
  """(path of the object, its repeat) of the first ``_Repeated`` in
  document order, or None; walked without recursion."""
  stack = [(document, "")]
  while stack:
    node, path = stack.pop()
    if isinstance(node, _Repeated):
      return path, node.repeat
    if isinstance(node, dict):
      items = [(value, f"{path}.{key}" if path else str(key))
               for key, value in node.items()]
    elif isinstance(node, list):
      items = [(value, f"{path}[{i}]") for i, value in enumerate(node)]
    else:
      continue
    # Reversed onto the stack so items pop in document order, and the repeat
    # reported is the first one in the file. A stack, not recursion: a deeply
    # nested config must not fail in this walk.
    stack.extend(reversed(items))
  return None


def load_json(path: str) -> Any:
  """Reads the JSON file ``path``, refusing an object with a key given
  twice.

  Raises:
    DuplicateKeyError: naming the key's path and both values.
    ValueError: the file is not JSON (``json.JSONDecodeError``).
    OSError: the file cannot be read.
  """
  repeated = []

  def hook(pairs):
    built = _distinct_keys(pairs)
    if isinstance(built, _Repeated):
      repeated.append(True)
    return built

  # The flag spares the walk over the document in the usual case of no repeat.
  with open(path) as f:
    document = json.load(f, object_pairs_hook=hook)
  if not repeated:
    return document
  where, (key, first, second) = _first_repeat(document)
  full = f"{where}.{key}" if where else str(key)
  raise DuplicateKeyError(
      full, f"{full}: given twice ({_short(first)}, then {_short(second)}); "
      "each key of a JSON object may appear once")


def _short(value: Any) -> str:
  text = json.dumps(value)
  return text if len(text) <= 40 else text[:37] + "..."
