"""Shared inputs of the dataset tests: IDX, npz and CIFAR files written
from numpy arrays.
"""

import gzip
import io
import pathlib
import pickle
import struct

import numpy as np


IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _idx_bytes(array: np.ndarray) -> bytes:
  header = bytes([0, 0, 8, array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  return header + array.astype(np.uint8).tobytes()


def _write_mnist_idx(folder: pathlib.Path, train_y=None, test_y=None,
                     gz: bool = False):
  rng = np.random.default_rng(0)
  arrays = (rng.integers(0, 256, (6, 28, 28)),
            rng.integers(0, 10, 6) if train_y is None else train_y,
            rng.integers(0, 256, (4, 28, 28)),
            rng.integers(0, 10, 4) if test_y is None else test_y)
  folder.mkdir(exist_ok=True)
  paths = []
  for stem, array in zip(IDX_FILES, arrays, strict=True):
    raw = _idx_bytes(np.asarray(array))
    path = folder / (stem + (".gz" if gz else ""))
    path.write_bytes(gzip.compress(raw) if gz else raw)
    paths.append(path)
  return paths


def _npz_arrays(**overrides):
  rng = np.random.default_rng(1)
  arrays = {"x_train": rng.integers(0, 256, (5, 28, 28), dtype=np.uint8),
            "y_train": np.array([0, 1, 2, 3, 9]),
            "x_test": rng.integers(0, 256, (2, 28, 28), dtype=np.uint8),
            "y_test": np.array([4, 5])}
  arrays.update(overrides)
  return {k: v for k, v in arrays.items() if v is not None}


class _Py2StylePickler(pickle._Pickler):  # pylint: disable=protected-access
  """Writes every str and bytes as a Python 2 ``str`` (BINSTRING opcodes).

  The original CIFAR archives were written by Python 2's cPickle with
  protocol 2: keys, file names and numpy's dtype arguments are Python 2
  strings, which ``encoding="bytes"`` reads back as bytes.
  """

  dispatch = dict(pickle._Pickler.dispatch)  # pylint: disable=protected-access

  def save_py2_str(self, obj):
    raw = obj.encode("latin-1") if isinstance(obj, str) else obj
    if len(raw) < 256:
      self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
    else:
      self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
    self.memoize(obj)

  dispatch[bytes] = save_py2_str
  dispatch[str] = save_py2_str


def _py2_style_pickle(obj) -> bytes:
  buffer = io.BytesIO()
  _Py2StylePickler(buffer, protocol=2).dump(obj)
  # numpy 1 (which wrote the archives) lived in numpy.core.
  return buffer.getvalue().replace(b"cnumpy._core.multiarray\n",
                                   b"cnumpy.core.multiarray\n")


def _batch(rng, num_images: int, label_key: bytes, num_classes: int):
  return {
      b"batch_label": b"training batch 1 of 5",
      label_key: [int(v) for v in rng.integers(0, num_classes, num_images)],
      b"data": rng.integers(0, 256, (num_images, 3072), dtype=np.uint8),
      b"filenames": [f"img_{i}.png".encode() for i in range(num_images)],
  }


def check_rows(fed, split, source, convert):
  """Each client's rows of ``split`` equal ``convert`` of its source
  arrays; a client missing from ``source`` has none."""
  x, y = getattr(fed, f"{split}_x"), getattr(fed, f"{split}_y")
  for cid, rows in zip(fed.client_ids, getattr(fed, f"{split}_clients"),
                       strict=True):
    if cid not in source:
      assert len(rows) == 0
      continue
    want_x, want_y = convert(source[cid])
    np.testing.assert_array_equal(x[rows], want_x)
    np.testing.assert_array_equal(y[rows], want_y)
