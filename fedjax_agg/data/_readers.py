"""Readers of the on-disk dataset layouts: IDX (optionally gzipped), npz and
the CIFAR python batches.

Each reader returns images and labels as they are on disk (uint8 images
for IDX and CIFAR; an npz archive's arrays keep their stored dtype) and
raises ``ValueError`` naming the file and what is wrong with it (truncated
gzip stream, IDX header that disagrees with the data, missing or empty npz
array, batch without its arrays); ``load`` checks shapes, label ranges and
the images' dtype and scale afterwards for every source.
"""

import functools
import gzip
import math
import pathlib
import zipfile
import zlib
from typing import Optional, Sequence

import numpy as np

from fedjax_agg.data import _safe_unpickle

# (train_x, train_y, test_x, test_y) as read from disk.
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

# Both spellings are in circulation: the original "train-images-idx3-ubyte"
# and the dotted "train-images.idx3-ubyte" of some mirrors.
_IDX_STEMS = {
    "train_x": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_y": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_x": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_y": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")
# name -> (folder, training batches, test batch, label key).
CIFAR_LAYOUTS = {
    "cifar10": ("cifar-10-batches-py",
                tuple(f"data_batch_{i}" for i in range(1, 6)), "test_batch",
                b"labels"),
    # CIFAR-100's 100-class task reads its fine labels (coarse_labels are
    # the 20 superclasses).
    "cifar100": ("cifar-100-python", ("train",), "test", b"fine_labels"),
}
_CIFAR_ROW = 3 * 32 * 32


def _read_bytes(path: pathlib.Path) -> bytes:
  if path.suffix != ".gz":
    return path.read_bytes()
  try:
    with gzip.open(path, "rb") as f:
      return f.read()
  except (EOFError, OSError, zlib.error) as error:
    # EOFError: the stream ends early; BadGzipFile (an OSError) or
    # zlib.error: it is damaged.
    raise ValueError(f"{path}: truncated or corrupt gzip file "
                     f"({error})") from error


def read_idx(path) -> np.ndarray:
  """Reads one IDX file (optionally gzipped) into a uint8 array.

  Raises:
    ValueError: not an unsigned-byte IDX file, a truncated gzip stream, or
      a header whose shape disagrees with the number of data bytes (the
      message names the file).
  """
  path = pathlib.Path(path)
  raw = _read_bytes(path)
  # IDX magic: two zero bytes, 0x08 for unsigned bytes, then the number of
  # dimensions; the sizes follow as big-endian uint32.
  if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
    raise ValueError(f"{path} is not an unsigned-byte IDX file (magic "
                     f"{raw[:4].hex() or 'missing'})")
  ndim = raw[3]
  header = 4 + 4 * ndim
  if ndim == 0 or len(raw) < header:
    raise ValueError(f"{path}: IDX header with {ndim} dimensions needs "
                     f"{header} bytes, the file has {len(raw)}")
  dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
  expected, held = math.prod(dims), len(raw) - header
  if held != expected:
    raise ValueError(f"{path}: header says shape {dims} ({expected} bytes "
                     f"of data), the file holds {held} (truncated or "
                     "padded)")
  # A read-only view of the bytes, not a copy; ``load`` copies when it
  # scales the images to float32.
  return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def _find(directory: pathlib.Path,
          stems: Sequence[str]) -> Optional[pathlib.Path]:
  for stem in stems:
    for suffix in ("", ".gz"):
      path = directory / (stem + suffix)
      if path.is_file():
        return path
  return None


def read_idx_dir(directory: pathlib.Path) -> Optional[Arrays]:
  """The four MNIST-style IDX files in ``directory``, or None if absent."""
  paths = tuple(_find(directory, stems) for stems in _IDX_STEMS.values())
  if any(p is None for p in paths):
    return None
  stamps = tuple(p.stat().st_mtime_ns for p in paths)
  return _read_idx_files(paths, stamps)


@functools.lru_cache(maxsize=2)
def _read_idx_files(paths, stamps):
  # Cached per process (keyed on modification times): decompressing the
  # gzipped IDX files dominates a load. The arrays are read-only.
  del stamps
  arrays = tuple(read_idx(p) for p in paths)
  for array in arrays:
    array.flags.writeable = False
  return arrays


def read_npz(path) -> Arrays:
  """``x_train, y_train, x_test, y_test`` of an npz archive (no pickles).

  Raises:
    ValueError: the file is not a readable npz archive, lacks one of the
      four arrays, holds an object array, or one of them is empty (the
      message names the file and the array).
  """
  path = pathlib.Path(path)
  try:
    # allow_pickle=False: an object array in an npz is a pickle, and is
    # refused before anything in it runs.
    with np.load(path, allow_pickle=False) as f:
      present = set(f.files)
      arrays = tuple(f[key] for key in NPZ_KEYS if key in present)
  except (ValueError, TypeError, OSError, EOFError, zipfile.BadZipFile,
          zlib.error) as error:
    # Pickled or object arrays, a lone .npy array, a damaged zip, a
    # truncated member.
    raise ValueError(f"{path}: not a readable npz archive of numeric "
                     f"arrays ({error})") from error
  missing = [key for key in NPZ_KEYS if key not in present]
  if missing:
    raise ValueError(f"{path} lacks arrays {missing} (needs "
                     f"{list(NPZ_KEYS)})")
  for key, array in zip(NPZ_KEYS, arrays, strict=True):
    if array.ndim == 0 or len(array) == 0:
      raise ValueError(f"{path}: {key} is empty (shape {array.shape})")
  return arrays


def read_npz_dir(directory: pathlib.Path, name: str) -> Optional[Arrays]:
  """``<name>.npz`` in ``directory`` read by ``read_npz``, or None."""
  path = directory / f"{name}.npz"
  return read_npz(path) if path.is_file() else None


def read_cifar_batch(path, label_key: bytes
                     ) -> tuple[np.ndarray, np.ndarray]:
  """One CIFAR python batch: ([M, 32, 32, 3] uint8 images, [M] labels).

  The file is unpickled with the restricted ``SafeUnpickler``.

  Raises:
    ForbiddenPickleError: the pickle references anything but numpy arrays
      and builtin containers.
    ValueError: the batch is truncated or lacks its arrays (the message
      names the file).
  """
  path = pathlib.Path(path)
  batch = _safe_unpickle.load(path, encoding="bytes")
  if not isinstance(batch, dict):
    raise ValueError(f"{path}: expected a pickled dict, got "
                     f"{type(batch).__name__}")
  missing = [key for key in (b"data", label_key) if key not in batch]
  if missing:
    raise ValueError(f"{path} lacks entries {missing}")
  flat, labels = batch[b"data"], np.asarray(batch[label_key])
  if (not isinstance(flat, np.ndarray) or flat.dtype != np.uint8
      or flat.ndim != 2 or flat.shape[1] != _CIFAR_ROW):
    raise ValueError(f"{path}: b'data' must be a [M, {_CIFAR_ROW}] uint8 "
                     f"array, got {getattr(flat, 'shape', type(flat))}")
  if labels.shape != (len(flat),):
    raise ValueError(f"{path}: {len(flat)} images but labels of shape "
                     f"{labels.shape}")
  # Rows are the R, G and B planes of a 32x32 image.
  images = flat.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return images, labels


def read_cifar_dir(directory: pathlib.Path, name: str) -> Optional[Arrays]:
  """The extracted CIFAR python archive under ``directory``, or None."""
  folder, train_files, test_file, label_key = CIFAR_LAYOUTS[name]
  folder = directory / folder
  train_paths = [folder / f for f in train_files]
  if not all(p.is_file() for p in train_paths + [folder / test_file]):
    return None
  train = [read_cifar_batch(p, label_key) for p in train_paths]
  test_x, test_y = read_cifar_batch(folder / test_file, label_key)
  return (np.concatenate([x for x, _ in train]),
          np.concatenate([y for _, y in train]), test_x, test_y)
