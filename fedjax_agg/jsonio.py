"""Strict JSON files: what the library writes can be read by any parser.

``json.dump`` writes NaN and infinities as the bare tokens ``NaN`` and
``Infinity``, which are not JSON, and fails on numpy and JAX values.
``jsonable`` turns a value into plain JSON data (non-finite floats become
``null``, arrays become nested lists) and ``dump_json`` writes it
atomically: to a temporary file in the same folder, then renamed over the
destination, so a reader never sees half a file and a crash never leaves
one.
"""

import json
import math
import os
from typing import Any
import uuid

import numpy as np

__all__ = ["dump_json", "jsonable", "write_text"]


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
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, dict):
    return {_key(key): jsonable(item) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return [jsonable(item) for item in value]
  if isinstance(value, np.generic) or hasattr(value, "__array__"):
    array = np.asarray(value)
    if array.dtype.kind == "V":  # bfloat16 and other extension floats
      array = array.astype(np.float64)
    return jsonable(array.tolist())
  return str(value)


def _key(key: Any) -> str:
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
  text = json.dumps(jsonable(obj), indent=indent, allow_nan=False)
  return write_text(path, text + "\n")


def write_text(path: str, text: str) -> str:
  """Writes ``text`` to ``path`` atomically: to a temporary file in the same
  folder (created if missing), then renamed over ``path``. Returns
  ``path``."""
  # A name of our own rather than ``tempfile.mkstemp``, whose 0600 mode the
  # rename would carry over: the file gets the umask's permissions.
  directory, name = os.path.split(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  temporary = os.path.join(directory,
                           f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
  try:
    with open(temporary, "x", newline="") as f:
      f.write(text)
    os.replace(temporary, path)
  except BaseException:
    if os.path.exists(temporary):
      os.remove(temporary)
    raise
  return str(path)
