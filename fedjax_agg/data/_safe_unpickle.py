"""A pickle reader that builds numpy arrays and builtin containers only.

The CIFAR-10/100 "python version" archives are pickled dicts of a uint8
array, lists of ints and byte strings. ``pickle.load`` would call whatever
a file names (a crafted ``data_batch_1`` could run ``os.system``), so these
files are read through ``SafeUnpickler``, which resolves only the few
globals such a batch references: numpy's array reconstructors, ``ndarray``
and ``dtype`` (object dtypes refused), and ``_codecs.encode`` restricted to
latin-1, which Python 3 writes for ``bytes`` under pickle protocol 2.
Dicts, lists, tuples, str, bytes, int and float need no global at all.
Anything else raises ``ForbiddenPickleError`` naming the file and the
global. This module is the library's only use of ``pickle``.
"""

import codecs
import pathlib
import pickle

import numpy as np

__all__ = ["ForbiddenPickleError", "SafeUnpickler", "load"]


class ForbiddenPickleError(pickle.UnpicklingError):
  """A pickle asks for something genuine CIFAR batches never need."""


def _dtype(*args, **kwargs) -> np.dtype:
  dtype = np.dtype(*args, **kwargs)
  # An object dtype would let the array's payload be arbitrary pickled
  # objects.
  if dtype.hasobject:
    raise ForbiddenPickleError(f"refusing object dtype {dtype}")
  return dtype


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
  # Python 3 pickles ``bytes`` under protocol 2 as encode(text, "latin1").
  if codecs.lookup(encoding).name != "iso8859-1":
    raise ForbiddenPickleError(f"refusing _codecs.encode to {encoding!r}")
  return text.encode("latin-1")


_EMPTY = np.zeros(0, np.uint8)

# (module, name) -> object, for every global a CIFAR batch may reference.
# numpy 1 writes numpy.core.*, numpy 2 numpy._core.*; the original
# archives were written by Python 2 with numpy 1.
_ALLOWED = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _dtype,
    ("_codecs", "encode"): _latin1_encode,
}
for _core in ("numpy.core", "numpy._core"):
  # Taken from a real array's reduction: the reconstructor numpy itself
  # uses, wherever this numpy version defines it.
  _ALLOWED[(f"{_core}.multiarray", "_reconstruct")] = _EMPTY.__reduce__()[0]
  # Protocol 5 pickles of contiguous arrays.
  _ALLOWED[(f"{_core}.numeric", "_frombuffer")] = _EMPTY.__reduce_ex__(5)[0]
del _core


class SafeUnpickler(pickle.Unpickler):
  """``pickle.Unpickler`` that resolves only the globals in ``_ALLOWED``."""

  def find_class(self, module: str, name: str):
    try:
      return _ALLOWED[(module, name)]
    except KeyError:
      raise ForbiddenPickleError(
          f"refusing to unpickle {module}.{name}; only numpy arrays and "
          "builtin containers of numbers and strings are allowed") from None

  # A persistent id would hand object lookup to code outside find_class.
  def persistent_load(self, pid):
    raise ForbiddenPickleError(f"refusing persistent id {pid!r}")


def load(path, encoding: str = "bytes"):
  """Unpickles the file at ``path`` with ``SafeUnpickler``.

  Args:
    path: file name.
    encoding: how Python 2 ``str`` objects are decoded ("bytes" keeps
      them as bytes, as the CIFAR archives need).

  Returns:
    The unpickled object.

  Raises:
    ForbiddenPickleError: the pickle asks for a global outside the allowed
      few (the message names the file and the global).
    ValueError: the file is truncated or not a pickle (the message names
      the file).
  """
  path = pathlib.Path(path)
  with open(path, "rb") as f:
    try:
      return SafeUnpickler(f, encoding=encoding).load()
    except ForbiddenPickleError as error:
      raise ForbiddenPickleError(f"{path}: {error}") from None
    # A damaged pickle fails in many ways (bad opcodes, short reads, a
    # reconstructor given the wrong arguments); all mean "not a CIFAR batch".
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError,
            IndexError, KeyError, AttributeError) as error:
      raise ValueError(f"{path}: truncated or corrupt pickle "
                       f"({type(error).__name__}: {error})") from error
