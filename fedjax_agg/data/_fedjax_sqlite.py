"""FedJAX's SQLite client files, read without FedJAX.

FedJAX (``fedjax.core.sqlite_federated_data.SQLiteFederatedData``) keeps a
federated split in one SQLite database with one table::

  CREATE TABLE federated_data (
    client_id BLOB NOT NULL PRIMARY KEY,
    data BLOB NOT NULL,
    num_examples INTEGER NOT NULL
  );

Clients are read in ``rowid`` order, as FedJAX lists them. ``data`` is a
zlib-compressed msgpack map from feature name to array, each array a
msgpack extension: type 1 a numeric array, itself the msgpack triple
``(shape, dtype name, C-order bytes)``; type 4 an array of byte strings,
the pair ``(shape, flat list of bytes)``. Nothing is unpickled: this
reader decodes those two extensions (numeric dtypes only, sizes checked)
and refuses any other.

FedJAX's EMNIST, Shakespeare and CIFAR-100 files carry TFF's features
(EMNIST ``pixels``/``label``, Shakespeare ``snippets``, CIFAR-100
``image``/``label``), converted here by the rules of ``load_tff_h5``.
Stack Overflow and FedJAX's script-built files (Sent140, Cornell movie
dialogs) are not read.
"""

import math
import pathlib
import sqlite3
import zlib
from typing import Optional

import numpy as np

from fedjax_agg.data import _tff_h5
from fedjax_agg.data._natural import NaturalFederation

_TABLE = "federated_data"
_COLUMNS = ("client_id", "data", "num_examples")
_NDARRAY, _BYTES_NDARRAY = 1, 4
_MAX_BYTES = _tff_h5.MAX_CLIENT_BYTES
"""The most bytes one client's ``data`` may decompress to (2 GiB)."""


def _shape(value, what: str) -> tuple:
  if not isinstance(value, (list, tuple)) or not all(
      isinstance(d, int) and not isinstance(d, bool) and d >= 0
      for d in value):
    raise ValueError(f"{what}: shape must be a list of non-negative ints, "
                     f"got {value!r}")
  return tuple(value)


def _ext_hook(msgpack):
  """msgpack's ``ext_hook``: FedJAX's two array extensions, nothing else."""
  def hook(code, payload):
    if code == _NDARRAY:
      parts = msgpack.unpackb(payload, raw=True)
      if not isinstance(parts, (list, tuple)) or len(parts) != 3:
        raise ValueError("array extension must be (shape, dtype, bytes)")
      shape = _shape(parts[0], "array extension")
      name, buffer = parts[1], parts[2]
      if not isinstance(name, bytes) or not isinstance(buffer, bytes):
        raise ValueError("array extension: dtype name and data must be "
                         "bytes")
      try:
        dtype = np.dtype(name.decode("ascii"))
      except (TypeError, UnicodeDecodeError) as error:
        raise ValueError(f"array extension: unknown dtype {name!r}") from error
      # Numeric kinds only: an object array built from raw bytes would be
      # pointers.
      if dtype.kind not in "biuf":
        raise ValueError(f"array extension: dtype {dtype} is not numeric")
      # The exact byte count, checked before frombuffer, which would otherwise
      # read a prefix or fail without naming the client.
      if len(buffer) != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"array extension: {len(buffer)} bytes for shape "
                         f"{shape} of {dtype}")
      return np.frombuffer(buffer, dtype).reshape(shape)
    if code == _BYTES_NDARRAY:
      parts = msgpack.unpackb(payload, raw=True)
      if not isinstance(parts, (list, tuple)) or len(parts) != 2:
        raise ValueError("bytes-array extension must be (shape, items)")
      shape, flat = _shape(parts[0], "bytes-array extension"), parts[1]
      if (not isinstance(flat, list) or len(flat) != math.prod(shape)
          or not all(isinstance(s, bytes) for s in flat)):
        raise ValueError("bytes-array extension: items must be "
                         f"{math.prod(shape)} byte strings")
      # Filled element by element: np.array(flat) would make a fixed-width "S"
      # array, which strips trailing NUL bytes from the strings.
      out = np.empty(len(flat), object)
      out[:] = flat
      return out.reshape(shape)
    raise ValueError(f"msgpack extension type {code} is not an array")
  return hook


def _decode(msgpack, blob, where: str) -> dict:
  """One client's ``data`` blob -> {feature: array}."""
  if not isinstance(blob, bytes):
    raise ValueError(f"{where}: 'data' must be a BLOB, got "
                     f"{type(blob).__name__}")
  inflater = zlib.decompressobj()
  try:
    # max_length bounds the output: a zlib bomb stops at _MAX_BYTES, and the
    # unconsumed tail below refuses it; it is never inflated in full.
    raw = inflater.decompress(blob, _MAX_BYTES)
  except zlib.error as error:
    raise ValueError(f"{where}: 'data' is not zlib-compressed ({error})"
                     ) from error
  if inflater.unconsumed_tail:
    raise ValueError(f"{where}: 'data' inflates past {_MAX_BYTES} bytes")
  if not inflater.eof:
    raise ValueError(f"{where}: 'data' is a truncated zlib stream")
  try:
    examples = msgpack.unpackb(raw, ext_hook=_ext_hook(msgpack), raw=False)
  except (ValueError, TypeError) as error:
    raise ValueError(f"{where}: 'data' is not a FedJAX msgpack map of "
                     f"arrays ({error})") from error
  if not isinstance(examples, dict) or not all(
      isinstance(k, str) and isinstance(v, np.ndarray)
      for k, v in examples.items()):
    raise ValueError(f"{where}: 'data' must be a map from feature names to "
                     "arrays")
  return examples


def _client_id(value, path, row: int) -> str:
  if isinstance(value, bytes):
    try:
      return value.decode("utf-8")
    except UnicodeDecodeError as error:
      raise ValueError(f"{path}: 'client_id' of row {row} is not UTF-8 "
                       f"({value!r})") from error
  if isinstance(value, str):
    return value
  raise ValueError(f"{path}: 'client_id' of row {row} must be bytes or text, "
                   f"got {type(value).__name__}")


def _read(msgpack, path, dataset: Optional[str]):
  """-> (dataset, {client: (x, y)}, dropped characters) of one file.

  Clients are converted as they are read (one raw client at a time); the
  dataset, when None, is inferred from the first client's features.
  """
  file = pathlib.Path(path)
  if not file.is_file():
    raise ValueError(f"{path}: no such file")
  # Read-only: never create or change the database.
  uri = file.resolve().as_uri() + "?mode=ro"
  connection = sqlite3.connect(uri, uri=True)
  try:
    try:
      columns = [info[1] for info in
                 connection.execute(f"PRAGMA table_info({_TABLE})")]
    except sqlite3.DatabaseError as error:
      raise ValueError(f"{path}: not an SQLite database ({error})"
                       ) from error
    if not columns:
      raise ValueError(f"{path} lacks the table '{_TABLE}' (FedJAX files "
                       f"hold {_TABLE}({', '.join(_COLUMNS)}))")
    missing = [c for c in _COLUMNS if c not in columns]
    if missing:
      raise ValueError(f"{path}: table '{_TABLE}' lacks column(s) {missing}")
    clients, dropped = {}, 0
    rows = connection.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM {_TABLE} ORDER BY rowid")
    for row, (raw_id, blob, count) in enumerate(rows):
      client = _client_id(raw_id, path, row)
      where = f"{path}: {_TABLE}[{client!r}]"
      # client_id is FedJAX's PRIMARY KEY, but a file from another writer may
      # still repeat one.
      if client in clients:
        raise ValueError(f"{where}: 'client_id' appears twice")
      arrays = _decode(msgpack, blob, where)
      lengths = {len(a) for a in arrays.values() if a.ndim}
      if isinstance(count, bool) or not isinstance(count, int) or (
          len(lengths) == 1 and count not in lengths):
        raise ValueError(f"{where}: 'num_examples' says {count!r} but the "
                         f"arrays hold {sorted(lengths)} examples")
      if dataset is None:
        dataset = _tff_h5.infer_dataset(arrays, where)
      x, y, lost = _tff_h5.convert_client(dataset, arrays, where)
      clients[client] = (x, y)
      dropped += lost
    return dataset, clients, dropped
  except sqlite3.DatabaseError as error:
    raise ValueError(f"{path}: cannot read table '{_TABLE}' ({error})"
                     ) from error
  finally:
    connection.close()


def load_fedjax_sqlite(train_path, test_path,
                       dataset: Optional[str] = None) -> NaturalFederation:
  """Reads FedJAX's SQLite train and test files (no FedJAX needed).

  Args:
    train_path: the training database (e.g.
      ``federated_emnist_train.sqlite``).
    test_path: the test database; its clients must be training clients,
      and a training client absent from it gets no test rows.
    dataset: one of ``emnist``, ``shakespeare``, ``cifar100``, or None to
      infer it from the features (``snippets``, ``pixels`` or ``image``).

  Returns:
    The ``NaturalFederation`` named ``fedjax:<dataset>``, clients in the
    training file's ``rowid`` order, converted as by ``load_tff_h5``;
    provenance holds ``format`` (``fedjax_sqlite``), the dataset, the
    paths as given, the files' basenames and the counts.

  Raises:
    ImportError: msgpack is not installed.
    ValueError: a file that is not SQLite or lacks the table or a column,
      a blob that is not zlib-compressed msgpack of arrays, a
      ``num_examples`` that disagrees with the arrays, and everything
      ``load_tff_h5`` refuses (the message names the file, the client and
      the key).
  """
  try:
    import msgpack  # pylint: disable=g-import-not-at-top
  except ImportError as error:
    raise ImportError("load_fedjax_sqlite needs msgpack: pip install -e "
                      "\".[text]\"") from error
  if dataset is not None and dataset not in _tff_h5.DATASETS:
    raise ValueError(f"dataset must be one of {_tff_h5.DATASETS} or None, "
                     f"got {dataset!r}")
  dataset, train, lost_train = _read(msgpack, train_path, dataset)
  if dataset is None:
    raise ValueError(f"{train_path}: table '{_TABLE}' holds no clients")
  _, test, lost_test = _read(msgpack, test_path, dataset)
  return _tff_h5.build("fedjax_sqlite", dataset, train, test,
                       (train_path, test_path), lost_train + lost_test,
                       _TABLE)
