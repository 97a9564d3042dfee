"""The file readers: IDX (plain or gzip), npz and CIFAR batches, refusing
damaged files with messages naming the file and the fault.
"""

import gzip
import pathlib
import pickle
import re

import numpy as np
import pytest

from fedjax_agg import data
from tests.data._util import _batch
from tests.data._util import _idx_bytes
from tests.data._util import _npz_arrays
from tests.data._util import _py2_style_pickle
from tests.data._util import _write_mnist_idx


def _write_idx(path: pathlib.Path, array: np.ndarray, gz: bool):
  header = bytes([0, 0, 8, array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  raw = header + array.astype(np.uint8).tobytes()
  if gz:
    path = path.with_name(path.name + ".gz")
    path.write_bytes(gzip.compress(raw))
  else:
    path.write_bytes(raw)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_files_in_data_dir(tmp_path, gz):
  rng = np.random.default_rng(0)
  train_x = rng.integers(0, 256, (7, 28, 28))
  test_x = rng.integers(0, 256, (3, 28, 28))
  train_y, test_y = rng.integers(0, 10, 7), rng.integers(0, 10, 3)
  folder = tmp_path / "mnist"
  folder.mkdir()
  _write_idx(folder / "train-images-idx3-ubyte", train_x, gz)
  _write_idx(folder / "train-labels-idx1-ubyte", train_y, gz)
  _write_idx(folder / "t10k-images-idx3-ubyte", test_x, gz)
  _write_idx(folder / "t10k-labels-idx1-ubyte", test_y, gz)
  ds = data.load("mnist", source="files", data_dir=str(tmp_path))
  np.testing.assert_allclose(ds.train_x[..., 0] * 255, train_x, atol=1e-3)
  np.testing.assert_array_equal(ds.train_y, train_y)
  np.testing.assert_array_equal(ds.test_y, test_y)
  assert ds.source.startswith("files:")


def test_truncated_gz_idx_names_the_file(tmp_path):
  paths = _write_mnist_idx(tmp_path, gz=True)
  raw = paths[0].read_bytes()
  paths[0].write_bytes(raw[:len(raw) // 2])
  with pytest.raises(ValueError, match=re.escape(
      f"{paths[0]}: truncated or corrupt gzip file")):
    data.load("mnist", source="files", data_dir=str(tmp_path))


def test_corrupt_gz_idx_names_the_file(tmp_path):
  path = tmp_path / "train-labels-idx1-ubyte.gz"
  raw = bytearray(gzip.compress(_idx_bytes(np.arange(10))))
  raw[-6] ^= 0xFF  # The CRC no longer matches.
  path.write_bytes(bytes(raw))
  with pytest.raises(ValueError, match=re.escape(f"{path}: truncated or "
                                                 "corrupt gzip file")):
    data.read_idx(path)


@pytest.mark.parametrize("change", ["truncated", "padded", "header_only"])
def test_idx_header_disagreeing_with_length(tmp_path, change):
  raw = _idx_bytes(np.zeros((3, 28, 28)))
  raw = {"truncated": raw[:-5], "padded": raw + b"\x00" * 7,
         "header_only": raw[:10]}[change]
  path = tmp_path / "t10k-images-idx3-ubyte"
  path.write_bytes(raw)
  message = (r"IDX header with 3 dimensions needs 16 bytes" if
             change == "header_only" else r"header says shape \(3, 28, 28\)")
  with pytest.raises(ValueError, match=re.escape(str(path)) + ".*" + message):
    data.read_idx(path)


def test_idx_wrong_magic_names_the_file(tmp_path):
  path = tmp_path / "train-images-idx3-ubyte"
  path.write_bytes(b"\x00\x00\x0d\x01" + (3).to_bytes(4, "big") + b"abc")
  with pytest.raises(ValueError, match=re.escape(str(path)) +
                     " is not an unsigned-byte IDX file"):
    data.read_idx(path)


@pytest.mark.parametrize("key", ["x_train", "y_test"])
def test_npz_missing_key(tmp_path, key):
  path = tmp_path / "mnist.npz"
  np.savez(path, **_npz_arrays(**{key: None}))
  with pytest.raises(ValueError, match=re.escape(f"{path} lacks arrays "
                                                 f"['{key}']")):
    data.load("mnist", source="files", data_dir=str(tmp_path))


@pytest.mark.parametrize("key,empty", [
    ("x_test", np.zeros((0, 28, 28), np.uint8)),
    ("y_train", np.zeros(0, np.int64)),
    ("y_test", np.array(3))])
def test_npz_empty_split(tmp_path, key, empty):
  path = tmp_path / "mnist.npz"
  np.savez(path, **_npz_arrays(**{key: empty}))
  with pytest.raises(ValueError, match=re.escape(f"{path}: {key} is empty")):
    data.load("mnist", source="files", data_dir=str(tmp_path))


def test_npz_needing_pickles_is_refused(tmp_path):
  path = tmp_path / "mnist.npz"
  np.savez(path, **_npz_arrays(y_train=np.array([0, 1, None, 3, 4],
                                                dtype=object)))
  with pytest.raises(ValueError, match=re.escape(str(path)) + ".*npz"):
    data.load("mnist", source="files", data_dir=str(tmp_path))
  # A pickle renamed to .npz is not unpickled either.
  path.write_bytes(pickle.dumps(_npz_arrays()))
  with pytest.raises(ValueError, match=re.escape(str(path))):
    data.load("mnist", source="files", data_dir=str(tmp_path))


def test_truncated_npz_names_the_file(tmp_path):
  path = tmp_path / "mnist.npz"
  np.savez_compressed(path, **_npz_arrays())
  raw = path.read_bytes()
  path.write_bytes(raw[:len(raw) // 2])
  with pytest.raises(ValueError, match=re.escape(str(path))):
    data.load("mnist", source="files", data_dir=str(tmp_path))


def test_truncated_and_malformed_batches_name_the_file(tmp_path):
  raw = _py2_style_pickle(_batch(np.random.default_rng(0), 2, b"labels", 10))
  path = tmp_path / "data_batch_1"
  path.write_bytes(raw[:len(raw) // 2])
  with pytest.raises(ValueError, match=re.escape(f"{path}: truncated")):
    data.read_cifar_batch(path, b"labels")
  path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)},
                                protocol=2))
  with pytest.raises(ValueError, match=r"lacks entries \[b'labels'\]"):
    data.read_cifar_batch(path, b"labels")
  path.write_bytes(pickle.dumps([1, 2], protocol=2))
  with pytest.raises(ValueError, match="expected a pickled dict"):
    data.read_cifar_batch(path, b"labels")
  path.write_bytes(pickle.dumps({b"data": np.zeros((2, 10), np.uint8),
                                 b"labels": [0, 1]}, protocol=2))
  with pytest.raises(ValueError, match="3072"):
    data.read_cifar_batch(path, b"labels")
