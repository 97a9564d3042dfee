"""load_fedjax_sqlite: FedJAX's SQLite client files written into tmp_path.

The writer below follows FedJAX's format (``federated_data`` table, zlib
compressed msgpack maps, array extensions 1 and 4) without FedJAX.
"""

import sqlite3
import zlib

import msgpack
import numpy as np
import pytest

from fedjax_agg.data._fedjax_sqlite import load_fedjax_sqlite
from fedjax_agg.data._natural import PAD_TARGET
from fedjax_agg.data._natural import summary
from fedjax_agg.data._text import decode_characters
from tests.data._util import check_rows

_SCHEMA = ("CREATE TABLE federated_data (client_id BLOB NOT NULL PRIMARY KEY,"
           " data BLOB NOT NULL, num_examples INTEGER NOT NULL);")


def _ext(value):
  if isinstance(value, np.ndarray) and value.dtype == object:
    payload = msgpack.packb((value.shape, list(value.ravel())),
                            use_bin_type=True)
    return msgpack.ExtType(4, payload)
  if isinstance(value, np.ndarray):
    payload = msgpack.packb((value.shape, value.dtype.name,
                             value.tobytes("C")), use_bin_type=True)
    return msgpack.ExtType(1, payload)
  raise TypeError(type(value))


def _blob(arrays):
  return zlib.compress(msgpack.packb(arrays, default=_ext,
                                     strict_types=True))


def _write(path, clients, schema=_SCHEMA, counts=None):
  """{client id: {feature: array} or raw blob bytes} -> a database."""
  connection = sqlite3.connect(path)
  with connection:
    connection.execute(schema)
    for client, arrays in clients.items():
      blob = arrays if isinstance(arrays, bytes) else _blob(arrays)
      count = (counts or {}).get(client)
      if count is None:
        count = len(next(iter(arrays.values()))) if isinstance(
            arrays, dict) else 1
      connection.execute("INSERT INTO federated_data VALUES (?, ?, ?);",
                         [client.encode(), blob, count])
  connection.close()
  return path


def _emnist(rng, n):
  return {"pixels": rng.random((n, 28, 28)).astype(np.float32),
          "label": rng.integers(0, 62, n).astype(np.int32)}


def test_emnist_rows_in_rowid_order(tmp_path):
  rng = np.random.default_rng(0)
  train = {"zz:f0003_10": _emnist(rng, 3), "aa:f0001_41": _emnist(rng, 1),
           "mm:f0002_07": _emnist(rng, 2)}
  test = {"mm:f0002_07": _emnist(rng, 2)}
  fed = load_fedjax_sqlite(
      str(_write(tmp_path / "federated_emnist_train.sqlite", train)),
      _write(tmp_path / "federated_emnist_test.sqlite", test))
  assert fed.name == "fedjax:emnist"
  assert fed.client_ids == tuple(train)  # Insertion (rowid) order.
  for split, source in (("train", train), ("test", test)):
    check_rows(fed, split, source,
               lambda arrays: (arrays["pixels"][..., None], arrays["label"]))
  prov = fed.provenance
  assert prov["format"] == "fedjax_sqlite" and prov["dataset"] == "emnist"
  assert prov["files"] == {"train": ["federated_emnist_train.sqlite"],
                           "test": ["federated_emnist_test.sqlite"]}
  assert (prov["clients"], prov["train_rows"], prov["test_rows"]) == (3, 6, 2)
  assert summary(fed)["clients_without_test_rows"] == 2


def test_shakespeare_bytes_arrays(tmp_path):
  snippets = np.empty(2, object)
  snippets[:] = [b"What light through yonder window breaks?", b"Ay me."]
  path = _write(tmp_path / "shakespeare_train.sqlite",
                {"ROMEO": {"snippets": snippets}})
  fed = load_fedjax_sqlite(path, path)
  assert fed.name == "fedjax:shakespeare" and fed.input_shape == (80,)
  assert len(fed.train_x) == 2
  # Inputs: all characters but the last (then padding), targets shifted.
  first = snippets[0].decode()
  assert decode_characters(fed.train_x[0, :len(first) - 1]) == first[:-1]
  assert decode_characters(fed.train_y[1]) == "y me."
  assert fed.train_y[1, 5] == PAD_TARGET
  assert fed.provenance["dropped_characters"] == 0


def _good(tmp_path):
  path = tmp_path / "good.sqlite"
  if path.exists():
    return path
  return _write(path, {"c1": _emnist(np.random.default_rng(1), 1)})


def _packed(payload_parts, code=1):
  return zlib.compress(msgpack.packb(
      {"pixels": msgpack.ExtType(code, msgpack.packb(payload_parts,
                                                     use_bin_type=True)),
       "label": msgpack.ExtType(1, msgpack.packb(
           ((1,), "int32", b"\0" * 4), use_bin_type=True))}))


@pytest.mark.parametrize("blob, message", [
    (b"not zlib", r"'data' is not zlib-compressed"),
    (zlib.compress(b"\xc1"), r"'data' is not a FedJAX msgpack map"),
    (zlib.compress(msgpack.packb([1, 2])), r"'data' must be a map"),
    (_packed(((1, 28, 28), "float32", b"\0" * 7)),
     r"7 bytes for shape \(1, 28, 28\)"),
    (_packed(((1,), "O", b"\0" * 8)), r"dtype object is not numeric"),
    (_packed(((1,), "no_such_dtype", b"\0" * 8)), r"unknown dtype"),
    (_packed(((1,), "float64", b"\0" * 8), code=3),
     r"msgpack extension type 3 is not an array"),
])
def test_bad_blobs(tmp_path, blob, message):
  path = _write(tmp_path / "bad.sqlite", {"c1": blob})
  where = r"bad\.sqlite: federated_data\['c1'\]: .*"
  with pytest.raises(ValueError, match=where + message):
    load_fedjax_sqlite(path, _good(tmp_path), "emnist")


def test_bad_features_are_refused_as_in_tff(tmp_path):
  bad = {"pixels": np.zeros((2, 28, 28), np.float32),
         "label": np.asarray([0, 99], np.int32)}
  path = _write(tmp_path / "bad.sqlite", {"c1": bad})
  with pytest.raises(ValueError, match=r"bad\.sqlite: federated_data\['c1'\]"
                     r"/label\[1\] = 99 is outside \[0, 62\)"):
    load_fedjax_sqlite(path, _good(tmp_path))
  ragged = {"pixels": np.zeros((2, 28, 28), np.float32),
            "label": np.zeros(1, np.int32)}
  path = _write(tmp_path / "ragged.sqlite", {"c1": ragged})
  with pytest.raises(ValueError, match=r"ragged\.sqlite: federated_data"
                     r"\['c1'\]: ragged client"):
    load_fedjax_sqlite(path, _good(tmp_path))


def test_num_examples_disagreeing(tmp_path):
  path = _write(tmp_path / "bad.sqlite",
                {"c1": _emnist(np.random.default_rng(2), 2)},
                counts={"c1": 5})
  with pytest.raises(ValueError, match=r"bad\.sqlite: federated_data\['c1'\]"
                     r": 'num_examples' says 5 but the arrays hold \[2\]"):
    load_fedjax_sqlite(path, _good(tmp_path))


def test_missing_table_column_and_not_sqlite(tmp_path):
  path = tmp_path / "other.sqlite"
  connection = sqlite3.connect(path)
  connection.execute("CREATE TABLE examples (client_id TEXT);")
  connection.close()
  with pytest.raises(ValueError, match=r"other\.sqlite lacks the table "
                     "'federated_data'"):
    load_fedjax_sqlite(path, _good(tmp_path))
  path = _write(tmp_path / "cols.sqlite", {}, schema=(
      "CREATE TABLE federated_data (client_id BLOB, data BLOB);"))
  with pytest.raises(ValueError, match=r"cols\.sqlite: table "
                     r"'federated_data' lacks column\(s\) \['num_examples'\]"):
    load_fedjax_sqlite(path, _good(tmp_path))
  (tmp_path / "text.sqlite").write_text("not a database at all" * 50)
  with pytest.raises(ValueError, match=r"text\.sqlite: not an SQLite "
                     "database"):
    load_fedjax_sqlite(_good(tmp_path), tmp_path / "text.sqlite")
  with pytest.raises(ValueError, match=r"missing\.sqlite: no such file"):
    load_fedjax_sqlite(tmp_path / "missing.sqlite", _good(tmp_path))
  assert not (tmp_path / "missing.sqlite").exists()


def test_unknown_test_client(tmp_path):
  rng = np.random.default_rng(3)
  test = _write(tmp_path / "test.sqlite", {"c7": _emnist(rng, 1)})
  with pytest.raises(ValueError, match=r"test\.sqlite: unknown users "
                     r"\['c7'\] in 'federated_data' \(not in good\.sqlite"):
    load_fedjax_sqlite(_good(tmp_path), test)
