"""load_tff_h5: TFF's HDF5 client files written into tmp_path."""

import sys
import zlib

import numpy as np
import pytest

from fedjax_agg.data import _fedjax_sqlite
from fedjax_agg.data import _tff_h5
from fedjax_agg.data._natural import PAD_TARGET
from fedjax_agg.data._natural import summary
from fedjax_agg.data._text import decode_characters
from fedjax_agg.data._text import LEAF_CHARACTERS
from fedjax_agg.data._tff_h5 import load_tff_h5
from tests.data._util import check_rows

h5py = pytest.importorskip("h5py")


def _write(path, clients, track_order=False):
  """An HDF5 file of examples/<client>/<feature> from {client: {k: v}}."""
  with h5py.File(path, "w") as f:
    examples = f.create_group("examples", track_order=track_order)
    for client, arrays in clients.items():
      group = examples.create_group(client)
      for key, value in arrays.items():
        if isinstance(value, list):  # Snippets: variable-length bytes.
          group.create_dataset(key, data=np.asarray(value, object),
                               dtype=h5py.special_dtype(vlen=bytes))
        else:
          group.create_dataset(key, data=value)
  return path


def _emnist(rng, n, first_label=0):
  return {"pixels": rng.random((n, 28, 28)).astype(np.float32),
          "label": (np.arange(n) + first_label).astype(np.int32)}


@pytest.fixture
def emnist(tmp_path):
  rng = np.random.default_rng(0)
  train = {"f0003_10": _emnist(rng, 3), "f0001_41": _emnist(rng, 2, 59),
           "f0002_07": _emnist(rng, 1, 5)}
  test = {"f0001_41": _emnist(rng, 2, 30), "f0003_10": _emnist(rng, 1)}
  paths = (_write(tmp_path / "fed_emnist_train.h5", train, True),
           _write(tmp_path / "fed_emnist_test.h5", test))
  return paths, train, test


def test_emnist_arrays_client_order_and_provenance(emnist):
  (train_path, test_path), train, test = emnist
  fed = load_tff_h5(str(train_path), test_path)
  assert fed.name == "tff:emnist" and fed.task == "classification"
  assert fed.client_ids == tuple(train)  # The file's (creation) order.
  assert fed.num_classes == 62 and fed.input_shape == (28, 28, 1)
  assert fed.train_x.dtype == np.float32 and fed.train_y.dtype == np.int32
  convert = lambda a: (a["pixels"][..., None], a["label"])
  check_rows(fed, "train", train, convert)
  check_rows(fed, "test", test, convert)
  assert fed.provenance == {
      "format": "tff_h5", "dataset": "emnist",
      "paths": {"train": str(train_path), "test": str(test_path)},
      "files": {"train": ["fed_emnist_train.h5"],
                "test": ["fed_emnist_test.h5"]},
      "clients": 3, "train_rows": 6, "test_rows": 3, "dropped_clients": 0}
  stats = summary(fed)
  assert stats["train_rows"] == {"min": 1, "median": 2.0, "mean": 2.0,
                                 "max": 3, "total": 6}
  assert stats["clients_without_test_rows"] == 1


def test_alphabetical_order_without_tracked_order(tmp_path):
  rng = np.random.default_rng(1)
  clients = {"b": _emnist(rng, 1), "a": _emnist(rng, 1)}
  path = _write(tmp_path / "t.h5", clients)
  fed = load_tff_h5(path, path, "emnist")
  assert fed.client_ids == ("a", "b")


def test_cifar100_uint8_scaled_coarse_label_ignored(tmp_path):
  rng = np.random.default_rng(2)
  def client(n):
    return {"image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            "label": rng.integers(0, 100, n).astype(np.int64),
            "coarse_label": rng.integers(0, 20, n).astype(np.int64)}
  train = {"0": client(2), "1": client(3)}
  test = {"0": client(1)}
  fed = load_tff_h5(_write(tmp_path / "fed_cifar100_train.h5", train),
                    _write(tmp_path / "fed_cifar100_test.h5", test))
  assert fed.name == "tff:cifar100" and fed.num_classes == 100
  assert fed.input_shape == (32, 32, 3)
  convert = lambda a: (a["image"].astype(np.float32) / 255, a["label"])
  check_rows(fed, "train", train, convert)
  check_rows(fed, "test", test, convert)


def _snippet_rows(snippets):
  """Each snippet's next-character rows, built without the loader."""
  xs, ys = [], []
  for raw in snippets:
    text = raw.decode("utf-8").replace("\u2019", "'")
    ids = [LEAF_CHARACTERS.index(c) for c in text if c in LEAF_CHARACTERS]
    # Inputs: every character that has a next one; targets: that one.
    for start in range(0, len(ids) - 1, 80):
      x = ids[:-1][start:start + 80]
      y = ids[1:][start:start + 80]
      xs.append(x + [0] * (80 - len(x)))
      ys.append(y + [PAD_TARGET] * (80 - len(y)))
  return (np.asarray(xs, np.int32).reshape(-1, 80),
          np.asarray(ys, np.int32).reshape(-1, 80))


def test_shakespeare_each_snippet_on_its_own(tmp_path):
  long = ("Now is the winter of our discontent made glorious summer by "
          "this sun of York; " * 3).encode()
  train = {
      "KING_RICHARD": {"snippets": [long, "It\u2019s @ me".encode(), b"!"]},
      "ANNE": {"snippets": [b"Foul devil, for God's sake, hence!"]},
      "SILENT": {"snippets": [b"x", b""]},  # No next character: dropped.
  }
  test = {"ANNE": {"snippets": [b"Avaunt, thou dreadful minister of hell!",
                                b"No."]}}
  fed = load_tff_h5(_write(tmp_path / "shakespeare_train.h5", train, True),
                    _write(tmp_path / "shakespeare_test.h5", test))
  assert fed.name == "tff:shakespeare" and fed.task == "sequence"
  assert fed.client_ids == ("KING_RICHARD", "ANNE")
  assert fed.num_classes == 80 and fed.input_shape == (80,)
  convert = lambda a: _snippet_rows(a["snippets"])
  check_rows(fed, "train", train, convert)
  check_rows(fed, "test", test, convert)
  # The long snippet's first row reads its first 80 characters.
  assert decode_characters(fed.train_x[0]) == long.decode()[:80]
  assert fed.provenance["dropped_clients"] == 1
  assert fed.provenance["dropped_characters"] == 1  # The '@'.
  # Fixed-length byte strings read the same.
  fixed = {"ANNE": {"snippets": np.asarray(test["ANNE"]["snippets"], "S")}}
  again = load_tff_h5(tmp_path / "shakespeare_train.h5",
                      _write(tmp_path / "fixed.h5", fixed))
  np.testing.assert_array_equal(again.test_x, fed.test_x)


def _one(tmp_path, arrays, name="bad.h5"):
  return _write(tmp_path / name, {"c1": arrays})


@pytest.mark.parametrize("arrays, message", [
    ({"pixels": np.zeros((3, 28, 28), np.float32),
      "label": np.zeros(2, np.int32)},
     r"bad\.h5: examples/c1: ragged client, datasets of different lengths"),
    ({"pixels": np.zeros((2, 28, 28), np.float32)},
     r"bad\.h5: examples/c1 lacks \['label'\]"),
    ({"pixels": np.zeros((2, 28, 28), np.float32),
      "label": np.asarray([1.0, 2.5])},
     r"bad\.h5: examples/c1/label\[1\] = .*2\.5.* is not an integer label"),
    ({"pixels": np.zeros((2, 28, 28), "S1"), "label": np.zeros(2, np.int32)},
     r"bad\.h5: examples/c1/pixels must be uint8 or float pixels, got dtype "
     r"\|S1"),
    ({"pixels": np.zeros((1, 28, 28), np.float32),
      "label": np.asarray([62], np.int32)},
     r"bad\.h5: examples/c1/label\[0\] = 62 is outside \[0, 62\)"),
    ({"pixels": np.full((1, 28, 28), np.nan, np.float32),
      "label": np.zeros(1, np.int32)},
     r"bad\.h5: examples/c1/pixels\[0\] holds nan; float pixels must be "
     "finite"),
    ({"pixels": np.zeros((1, 28, 27), np.float32),
      "label": np.zeros(1, np.int32)},
     r"bad\.h5: examples/c1/pixels must have shape \[n, 28, 28\]"),
    ({"pixels": np.zeros((1, 28, 28), np.int16),
      "label": np.zeros(1, np.int32)},
     r"examples/c1/pixels must be uint8 or float pixels, got dtype int16"),
])
def test_bad_emnist_client(tmp_path, arrays, message):
  good = _write(tmp_path / "good.h5", {"c1": _emnist(np.random.default_rng(),
                                                     1)})
  with pytest.raises(ValueError, match=message):
    load_tff_h5(_one(tmp_path, arrays), good, "emnist")
  # The same refusal from the test file.
  with pytest.raises(ValueError, match=message):
    load_tff_h5(good, _one(tmp_path, arrays), "emnist")


def test_bad_snippets(tmp_path):
  good = _write(tmp_path / "good.h5", {"c1": {"snippets": [b"ab"]}})
  path = _one(tmp_path, {"snippets": [b"ok", b"\xff\xfe"]})
  with pytest.raises(ValueError, match=r"bad\.h5: examples/c1/snippets\[1\] "
                     "is not UTF-8"):
    load_tff_h5(path, good)
  path = _one(tmp_path, {"snippets": np.zeros(2, np.float32)})
  with pytest.raises(ValueError, match=r"bad\.h5: examples/c1/snippets must "
                     "be a 1-D array of byte strings"):
    load_tff_h5(path, good, "shakespeare")


def test_missing_examples_group_and_not_hdf5(tmp_path):
  with h5py.File(tmp_path / "flat.h5", "w") as f:
    f.create_dataset("pixels", data=np.zeros((1, 28, 28)))
  good = _write(tmp_path / "good.h5", {"c1": _emnist(np.random.default_rng(),
                                                     1)})
  with pytest.raises(ValueError, match=r"flat\.h5 lacks the group "
                     "'examples'"):
    load_tff_h5(tmp_path / "flat.h5", good)
  (tmp_path / "text.h5").write_text("not hdf5")
  with pytest.raises(ValueError, match=r"text\.h5: not a readable HDF5 "
                     "file"):
    load_tff_h5(good, tmp_path / "text.h5")


def test_unknown_test_client(tmp_path):
  rng = np.random.default_rng(3)
  train = _write(tmp_path / "train.h5", {"c1": _emnist(rng, 1)})
  test = _write(tmp_path / "test.h5", {"c1": _emnist(rng, 1),
                                       "c9": _emnist(rng, 1)})
  with pytest.raises(ValueError, match=r"test\.h5: unknown users \['c9'\] "
                     r"in 'examples' \(not in train\.h5"):
    load_tff_h5(train, test)


def test_dataset_inference_and_refusals(tmp_path):
  path = _write(tmp_path / "odd.h5", {"c1": {"tokens": np.zeros(2)}})
  with pytest.raises(ValueError, match=r"odd\.h5: examples: cannot tell the "
                     r"dataset from its features \['tokens'\]; pass dataset="):
    load_tff_h5(path, path)
  with pytest.raises(ValueError, match="dataset must be one of"):
    load_tff_h5(path, path, "mnist")


def test_missing_h5py_names_the_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "h5py", None)
  with pytest.raises(ImportError, match=r'pip install -e "\.\[text\]"'):
    load_tff_h5(tmp_path / "a.h5", tmp_path / "b.h5")


@pytest.mark.parametrize("chunks", [True, None])
def test_declared_size_past_what_the_file_stores(tmp_path, chunks):
  # 1.5 GB of uint8 (5.84 GiB once float32) declared, nothing written:
  # HDF5 allocates lazily, so the file stays a few KB. The labels are
  # real (compressed zeros), so only the pixels are wrong.
  path = tmp_path / "huge.h5"
  with h5py.File(path, "w") as f:
    client = f.create_group("examples/c1")
    client.create_dataset("pixels", shape=(2_000_000, 28, 28),
                          dtype=np.uint8, chunks=chunks)
    client.create_dataset("label", data=np.zeros(2_000_000, np.int32),
                          compression="gzip", compression_opts=9)
  assert path.stat().st_size < 50_000
  good = _write(tmp_path / "good.h5", {"c1": _emnist(np.random.default_rng(),
                                                     1)})
  message = (r"huge\.h5: examples/c1/pixels declares shape \(2000000, 28, "
             r"28\) of uint8 \(1568000000 bytes\) but the file \(\d+ bytes\) "
             r"stores 0 bytes of it")
  with pytest.raises(ValueError, match=message):
    load_tff_h5(path, good, "emnist")
  with pytest.raises(ValueError, match=message):
    load_tff_h5(good, path)


def test_client_past_two_gib_is_refused_before_reading(tmp_path):
  # Real deflate chunks of zeros: a 2 MB file that inflates to 2.2 GB.
  rows, per_chunk = 2_800_000, 10_000
  chunk = zlib.compress(bytes(per_chunk * 28 * 28), 9)
  path = tmp_path / "zeros.h5"
  with h5py.File(path, "w") as f:
    client = f.create_group("examples/c1")
    pixels = client.create_dataset("pixels", shape=(rows, 28, 28),
                                   dtype=np.uint8,
                                   chunks=(per_chunk, 28, 28),
                                   compression="gzip")
    for start in range(0, rows, per_chunk):
      pixels.id.write_direct_chunk((start, 0, 0), chunk)
    client.create_dataset("label", data=np.zeros(2, np.int32))
    stored = pixels.id.get_storage_size()
  declared = rows * 28 * 28
  assert declared > _tff_h5.MAX_CLIENT_BYTES == 2 ** 31
  # Within deflate's ratio: the file does store it, it is just too big.
  assert declared <= stored * _tff_h5.MAX_COMPRESSION_RATIO
  good = _write(tmp_path / "good.h5", {"c1": _emnist(np.random.default_rng(),
                                                     1)})
  # The label's 8 bytes are counted first (alphabetical order).
  with pytest.raises(ValueError, match=r"zeros\.h5: examples/c1/pixels: the "
                     rf"client's datasets declare {declared + 8} bytes, past "
                     r"the 2147483648 bytes \(2 GiB\) one client may hold"):
    load_tff_h5(path, good, "emnist")
  # The FedJAX SQLite reader caps a client at the same 2 GiB.
  assert _fedjax_sqlite._MAX_BYTES is _tff_h5.MAX_CLIENT_BYTES


def test_compressed_datasets_within_the_ratio_still_load(tmp_path):
  rng = np.random.default_rng(4)
  arrays = {"pixels": np.zeros((300, 28, 28), np.float32),
            "label": rng.integers(0, 62, 300).astype(np.int32)}
  arrays["pixels"][:, 3, 4] = rng.random(300)
  path = tmp_path / "gzip.h5"
  with h5py.File(path, "w") as f:
    client = f.create_group("examples/c1")
    for key, value in arrays.items():
      client.create_dataset(key, data=value, compression="gzip",
                            compression_opts=9, shuffle=True)
    assert client["pixels"].id.get_storage_size() < arrays["pixels"].nbytes
  fed = load_tff_h5(path, path, "emnist")
  np.testing.assert_array_equal(fed.train_x[..., 0], arrays["pixels"])
  np.testing.assert_array_equal(fed.train_y, arrays["label"])


def test_dataset_stored_outside_the_file_is_refused(tmp_path):
  raw = tmp_path / "pixels.raw"
  raw.write_bytes(bytes(2 * 28 * 28 * 4))
  path = tmp_path / "external.h5"
  with h5py.File(path, "w") as f:
    client = f.create_group("examples/c1")
    client.create_dataset("pixels", shape=(2, 28, 28), dtype=np.float32,
                          external=[(str(raw), 0, raw.stat().st_size)])
    client.create_dataset("label", data=np.zeros(2, np.int32))
  with pytest.raises(ValueError, match=r"external\.h5: examples/c1/pixels is "
                     "stored outside the file"):
    load_tff_h5(path, path, "emnist")


def test_snippet_bytes_count_toward_the_client_limit(tmp_path, monkeypatch):
  snippets = [b"To be, or not to be: that is the question."] * 5000
  path = _write(tmp_path / "lines.h5", {"HAMLET": {"snippets": snippets}})
  # Read in blocks, the snippets come back whole and in order.
  fed = load_tff_h5(path, path)
  np.testing.assert_array_equal(fed.train_x,
                                _snippet_rows(snippets)[0])
  # The pointers declare 8 bytes a snippet; the bytes are counted as read.
  monkeypatch.setattr(_tff_h5, "MAX_CLIENT_BYTES", 100_000)
  with pytest.raises(ValueError, match=r"lines\.h5: examples/HAMLET/snippets"
                     r": the client's datasets hold more than 100000 bytes"):
    load_tff_h5(path, path)
