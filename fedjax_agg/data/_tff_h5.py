"""TensorFlow Federated's HDF5 client files (EMNIST, Shakespeare, CIFAR-100).

TFF's simulation datasets (``fed_emnist_train.h5``, ``shakespeare_train.h5``,
``fed_cifar100_train.h5`` and their ``_test`` twins) hold a group
``examples`` with one subgroup per client id; a client's datasets share
their first dimension (its examples):

* ``emnist``: ``pixels`` [n, 28, 28] float in [0, 1] (kept as stored,
  where 1.0 is the background), ``label`` [n] in ``[0, 62)``.
* ``shakespeare``: ``snippets`` [n] byte strings, one per speaking line.
* ``cifar100``: ``image`` [n, 32, 32, 3] uint8, ``label`` [n] in
  ``[0, 100)`` (``coarse_label`` is ignored).

Pixels follow the package's rule: uint8 is divided by 255, floats must be
finite and in [0, 1], any other dtype is refused. The per-client
converters here are shared with ``load_fedjax_sqlite`` (FedJAX stores the
same features).

Sizes are checked before anything is read: a dataset must be stored in
the file, and may declare (shape x itemsize) at most the bytes the file
stores for it, or ``MAX_COMPRESSION_RATIO`` times that when filtered
(compressed); a client's datasets may declare at most
``MAX_CLIENT_BYTES`` (2 GiB) together, variable-length strings counted
as they are read. A client's raw arrays are thus at most 2 GiB and
``MAX_COMPRESSION_RATIO`` times the file's size (float32 pixels made from
uint8 take 4 times their bytes).

Test clients are matched to training clients by id. TFF's CIFAR-100 test
file numbers its 100 clients from ``0`` as the training file numbers its
500, though they hold other partitions of the test images: its pooled
test rows are right, its per-client test rows pair unrelated data.
"""

import math
import os
from typing import Optional

import numpy as np

from fedjax_agg.data import _text
from fedjax_agg.data._leaf import assemble
from fedjax_agg.data._leaf import int_labels
from fedjax_agg.data._natural import check_federation
from fedjax_agg.data._natural import NaturalFederation

DATASETS = ("emnist", "shakespeare", "cifar100")
"""The datasets ``load_tff_h5`` (and ``load_fedjax_sqlite``) read."""
REQUIRED = {"emnist": ("pixels", "label"), "shakespeare": ("snippets",),
            "cifar100": ("image", "label")}
"""The features each dataset needs."""
NUM_CLASSES = {"emnist": 62, "shakespeare": 80, "cifar100": 100}
INPUT_SHAPES = {"emnist": (28, 28, 1), "shakespeare": (80,),
                "cifar100": (32, 32, 3)}
_IMAGES = {"emnist": ("pixels", (28, 28)), "cifar100": ("image", (32, 32, 3))}
_EXTRA = "pip install -e \".[text]\""
MAX_CLIENT_BYTES = 1 << 31
"""The most bytes one client's arrays may take as read (2 GiB), in HDF5
and in FedJAX's SQLite files."""
MAX_COMPRESSION_RATIO = 1032
"""Deflate's largest ratio: a filtered dataset may declare at most this
many times the bytes the file stores for it."""
_BLOCK = 4096  # Variable-length strings read at a time.


def infer_dataset(names, where: str) -> str:
  """The dataset whose features ``names`` holds (snippets, pixels, image).

  Raises:
    ValueError: naming ``where`` when no dataset fits.
  """
  for dataset, key in (("shakespeare", "snippets"), ("emnist", "pixels"),
                       ("cifar100", "image")):
    if key in names:
      return dataset
  raise ValueError(f"{where}: cannot tell the dataset from its features "
                   f"{sorted(names)}; pass dataset= one of {DATASETS}")


def _images(array: np.ndarray, shape: tuple, where: str) -> np.ndarray:
  """Images -> float32 in [0, 1] (uint8 / 255; floats checked)."""
  if array.ndim != 1 + len(shape) or tuple(array.shape[1:]) != shape:
    raise ValueError(f"{where} must have shape [n, {', '.join(map(str, shape))}"
                     f"], got {array.shape}")
  if array.dtype == np.uint8:
    return array.astype(np.float32) / 255.0
  if array.dtype.kind != "f":
    raise ValueError(f"{where} must be uint8 or float pixels, got dtype "
                     f"{array.dtype}")
  bad = ~np.isfinite(array) | (array < 0) | (array > 1)
  if bad.any():
    i = int(np.argwhere(bad)[0][0])
    raise ValueError(f"{where}[{i}] holds {array[bad][0]}; float pixels "
                     "must be finite and in [0, 1]")
  return array.astype(np.float32)


def _snippets(array: np.ndarray, where: str):
  """Byte-string snippets -> next-character rows and dropped characters."""
  if array.ndim != 1 or not (array.dtype.kind == "S" or (
      array.dtype == object and all(isinstance(s, bytes) for s in array))):
    raise ValueError(f"{where} must be a 1-D array of byte strings, got "
                     f"dtype {array.dtype} and shape {array.shape}")
  xs, ys, dropped = [], [], 0
  for i, raw in enumerate(array):
    try:
      text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as error:
      raise ValueError(f"{where}[{i}] is not UTF-8 ({error})") from error
    tokens, lost = _text.encode_characters(_text.normalize_text(text),
                                           drop_unknown=True)
    dropped += lost
    # Each snippet is cut on its own, so no row spans two speaking lines.
    x, y = _text.next_token_sequences(tokens, _text.SEQUENCE_LENGTH)
    xs.append(x)
    ys.append(y)
  # A client whose snippets are all too short still concatenates, to
  # [0, 80].
  empty = np.zeros((0, _text.SEQUENCE_LENGTH), np.int32)
  return np.concatenate([empty] + xs), np.concatenate([empty] + ys), dropped


def convert_client(dataset: str, arrays: dict, where: str):
  """One client's feature arrays -> ``(x, y, dropped characters)``.

  Args:
    dataset: one of ``DATASETS``.
    arrays: feature name -> numpy array (first dimension: examples).
    where: names the client (file and key) in messages; the feature name
      is appended.

  Returns:
    ``x`` float32 images or int32 tokens ``[R, 80]``, ``y`` int32 labels
    ``[R]`` or targets ``[R, 80]``, and the characters dropped as outside
    LEAF's set (Shakespeare; 0 otherwise).

  Raises:
    ValueError: a missing feature, features of different lengths, a
      wrong shape or dtype, labels out of range, non-finite or
      out-of-range pixels.
  """
  missing = [k for k in REQUIRED[dataset] if k not in arrays]
  if missing:
    raise ValueError(f"{where} lacks {missing} (a {dataset} "
                     f"client holds {list(REQUIRED[dataset])})")
  lengths = {k: (v.shape[0] if v.ndim else None) for k, v in arrays.items()}
  if len(set(lengths.values())) > 1 or None in lengths.values():
    raise ValueError(f"{where}: ragged client, datasets of different "
                     f"lengths {lengths}")
  if dataset == "shakespeare":
    return _snippets(arrays["snippets"], f"{where}/snippets")
  key, shape = _IMAGES[dataset]
  x = _images(arrays[key], shape, f"{where}/{key}")
  y = int_labels(arrays["label"], NUM_CLASSES[dataset], f"{where}/label")
  return x.reshape((-1,) + INPUT_SHAPES[dataset]), y, 0


def build(fmt: str, dataset: str, train: dict, test: dict, paths: tuple,
          dropped_characters: int, group: str) -> NaturalFederation:
  """The checked federation of converted clients, with its provenance.

  Args:
    fmt: the format's name in provenance (``tff_h5``, ``fedjax_sqlite``).
    dataset: one of ``DATASETS``.
    train, test: client id -> ``(x, y)``, in client order.
    paths: the train and test paths as given.
    dropped_characters: Shakespeare characters outside LEAF's set.
    group: where the files keep their clients (named in errors).

  Returns:
    The federation named ``<tff|fedjax>:<dataset>``.
  """
  unknown = [c for c in test if c not in train]
  if unknown:
    raise ValueError(f"{paths[1]}: unknown users {unknown[:5]} in "
                     f"'{group}' (not in {os.path.basename(paths[0])}; "
                     f"{len(unknown)} in all)")
  prefix = {"tff_h5": "tff", "fedjax_sqlite": "fedjax"}[fmt]
  fed, dropped = assemble(
      f"{prefix}:{dataset}", train, test, num_classes=NUM_CLASSES[dataset],
      input_shape=INPUT_SHAPES[dataset],
      task="sequence" if dataset == "shakespeare" else "classification",
      test_where=str(paths[1]))
  provenance = {
      "format": fmt, "dataset": dataset,
      "paths": {"train": os.fspath(paths[0]), "test": os.fspath(paths[1])},
      "files": {"train": [os.path.basename(paths[0])],
                "test": [os.path.basename(paths[1])]},
      "clients": fed.num_clients, "train_rows": int(len(fed.train_x)),
      "test_rows": int(len(fed.test_x)), "dropped_clients": dropped}
  if dataset == "shakespeare":
    provenance["dropped_characters"] = int(dropped_characters)
  return check_federation(fed._replace(provenance=provenance))


def _declared_bytes(ds, file_size: int, where: str) -> int:
  """The bytes HDF5 dataset ``ds`` declares (shape x itemsize), checked.

  Raises:
    ValueError: naming ``where``, when ``ds`` is stored outside the file
      or declares more than the file stores for it (times
      ``MAX_COMPRESSION_RATIO`` when filtered).
  """
  # External or virtual data lives in other files, whose size is not this
  # file's to bound.
  if ds.external or ds.is_virtual:
    raise ValueError(f"{where} is stored outside the file (an external or "
                     "virtual dataset); TFF files hold their data")
  # A null dataspace (h5py.Empty) has no shape and holds nothing.
  declared = 0 if ds.shape is None else math.prod(ds.shape) * (
      ds.dtype.itemsize)
  # Both numbers come from the file's own metadata; the stored size is
  # held against the real file size too.
  stored = ds.id.get_storage_size()
  ratio = MAX_COMPRESSION_RATIO if ds.id.get_create_plist().get_nfilters(
      ) else 1
  if stored > file_size or declared > stored * ratio:
    bound = f" (x{ratio} when compressed)" if ratio > 1 else ""
    raise ValueError(f"{where} declares shape {ds.shape} of {ds.dtype} "
                     f"({declared} bytes) but the file ({file_size} bytes) "
                     f"stores {stored} bytes of it{bound}")
  return declared


def _item_bytes(item) -> int:
  """Bytes of one variable-length item (string or array) as read."""
  if isinstance(item, np.ndarray):
    return item.nbytes
  return len(item) if isinstance(item, (bytes, str)) else 0


def _read_client(datasets: dict, file_size: int, where: str) -> dict:
  """A client's HDF5 datasets -> numpy arrays, sizes checked first."""
  total = 0
  for key, ds in datasets.items():
    # Declared sizes are summed before anything is read: a hostile shape is
    # refused without being allocated.
    total += _declared_bytes(ds, file_size, f"{where}/{key}")
    if total > MAX_CLIENT_BYTES:
      raise ValueError(f"{where}/{key}: the client's datasets declare "
                       f"{total} bytes, past the {MAX_CLIENT_BYTES} bytes "
                       "(2 GiB) one client may hold")
  arrays = {}
  for key, ds in datasets.items():
    if ds.dtype.kind != "O" or ds.ndim != 1:
      arrays[key] = np.asarray(ds[()])
      continue
    # Variable-length: the strings' bytes are known only once read.
    blocks = [np.empty(0, object)]
    for start in range(0, ds.shape[0], _BLOCK):
      block = np.asarray(ds[start:start + _BLOCK], object)
      blocks.append(block)
      total += sum(map(_item_bytes, block))
      if total > MAX_CLIENT_BYTES:
        raise ValueError(f"{where}/{key}: the client's datasets hold more "
                         f"than {MAX_CLIENT_BYTES} bytes (2 GiB), past what "
                         "one client may hold")
    arrays[key] = np.concatenate(blocks)
  return arrays


def _read_h5(h5py, path, dataset: Optional[str]):
  """-> (dataset, {client: (x, y)}, dropped characters) of one HDF5 file.

  Clients are converted as they are read, so one client's raw arrays are
  held at a time.
  """
  try:
    f = h5py.File(path, "r")
  except OSError as error:
    raise ValueError(f"{path}: not a readable HDF5 file ({error})") from error
  with f:
    group = f.get("examples")
    if not isinstance(group, h5py.Group):
      raise ValueError(f"{path} lacks the group 'examples' (TFF client "
                       "files hold examples/<client id>/<feature>)")
    members = list(group.items())
    for client, member in members:
      if not isinstance(member, h5py.Group):
        raise ValueError(f"{path}: examples/{client} is not a group of "
                         "datasets")
    if dataset is None:
      # The union of all clients' features: an empty first client does not
      # decide the dataset.
      names = set().union(*(member.keys() for _, member in members))
      dataset = infer_dataset(names, f"{path}: examples")
    clients, dropped, file_size = {}, 0, f.id.get_filesize()
    for client, member in members:
      where = f"{path}: examples/{client}"
      datasets = dict(member.items())
      for key, ds in datasets.items():
        if not isinstance(ds, h5py.Dataset):
          raise ValueError(f"{where}/{key} is not a dataset")
      arrays = _read_client(datasets, file_size, where)
      x, y, lost = convert_client(dataset, arrays, where)
      clients[client] = (x, y)
      dropped += lost
  return dataset, clients, dropped


def load_tff_h5(train_path, test_path,
                dataset: Optional[str] = None) -> NaturalFederation:
  """Reads TFF's HDF5 train and test client files.

  Shakespeare: each snippet is decoded from UTF-8, normalised by
  ``normalize_text``, stripped of characters outside LEAF's set (counted
  in provenance as ``dropped_characters``) and cut by
  ``next_token_sequences(tokens, 80)`` on its own; a client's rows are its
  snippets' rows in order. Clients left without training rows are
  dropped (``dropped_clients``).

  Args:
    train_path: the training file (e.g. ``fed_emnist_train.h5``).
    test_path: the test file; its clients must be training clients, and
      a training client absent from it gets no test rows.
    dataset: one of ``DATASETS``, or None to infer it from the features
      (``snippets``, ``pixels`` or ``image``).

  Returns:
    The ``NaturalFederation`` named ``tff:<dataset>`` with clients in the
    training file's order; provenance holds ``format`` (``tff_h5``), the
    dataset, the paths as given, the files' basenames and the counts.

  Raises:
    ImportError: h5py is not installed.
    ValueError: a file that is not HDF5 or lacks ``examples``, a client
      with a missing feature, ragged features, a wrong dtype or shape,
      labels out of range, non-finite pixels, test clients not in the
      training file, a dataset declaring more than the file stores or a
      client past ``MAX_CLIENT_BYTES`` (the message names the file and
      the key).
  """
  try:
    import h5py  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError(f"load_tff_h5 needs h5py: {_EXTRA}") from error
  if dataset is not None and dataset not in DATASETS:
    raise ValueError(f"dataset must be one of {DATASETS} or None, got "
                     f"{dataset!r}")
  dataset, train, lost_train = _read_h5(h5py, train_path, dataset)
  _, test, lost_test = _read_h5(h5py, test_path, dataset)
  return build("tff_h5", dataset, train, test, (train_path, test_path),
               lost_train + lost_test, "examples")
