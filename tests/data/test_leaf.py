"""load_leaf: LEAF's JSON layout written into tmp_path, and what it refuses."""

import json
import re

import numpy as np
import pytest

from fedjax_agg.data._leaf import load_leaf
from fedjax_agg.data._natural import PAD_TARGET
from fedjax_agg.data._natural import summary
from fedjax_agg.data._text import decode_characters
from fedjax_agg.data._text import LEAF_CHARACTERS


def _file(users):
  """A LEAF JSON object of {user: (xs, ys)}, users in the dict's order."""
  return {"users": list(users),
          "num_samples": [len(xs) for xs, _ in users.values()],
          "user_data": {u: {"x": xs, "y": ys}
                        for u, (xs, ys) in users.items()}}


def _write(root, split, name, obj):
  folder = root / split
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / name
  path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
  return path


def _pixels(rng, n):
  return [[float(v) for v in row] for row in rng.random((n, 784)).round(3)]


@pytest.fixture
def femnist(tmp_path):
  """Two train files, one test file; user 'f_b' has no test rows."""
  rng = np.random.default_rng(0)
  users = {"f_z": (_pixels(rng, 3), [0, 61, 5]),
           "f_a": (_pixels(rng, 2), [7, 7]),
           "f_b": (_pixels(rng, 1), [3])}
  tests = {"f_a": (_pixels(rng, 1), [9]), "f_z": (_pixels(rng, 2), [1, 2])}
  _write(tmp_path, "train", "part_0.json",
         _file({u: users[u] for u in ("f_z", "f_a")}))
  _write(tmp_path, "train", "part_1.json", {**_file({"f_b": users["f_b"]}),
                                            "hierarchies": ["writer"]})
  _write(tmp_path, "test", "all.json", _file(tests))
  return tmp_path, users, tests


def test_femnist_arrays_clients_and_provenance(femnist):
  root, users, tests = femnist
  fed = load_leaf(str(root))
  assert fed.name == "leaf:femnist" and fed.task == "classification"
  assert fed.client_ids == ("f_z", "f_a", "f_b")
  assert fed.num_classes == 62 and fed.input_shape == (28, 28, 1)
  assert fed.train_x.dtype == np.float32 and fed.train_y.dtype == np.int32
  for split, source in (("train", users), ("test", tests)):
    x, y = getattr(fed, f"{split}_x"), getattr(fed, f"{split}_y")
    for cid, rows in zip(fed.client_ids, getattr(fed, f"{split}_clients"),
                         strict=True):
      xs, ys = source.get(cid, ([], []))
      want = np.asarray(xs, np.float32).reshape(-1, 28, 28, 1)
      np.testing.assert_array_equal(x[rows], want)
      np.testing.assert_array_equal(y[rows], np.asarray(ys, np.int32))
  assert len(fed.test_clients[2]) == 0
  assert fed.provenance == {
      "format": "leaf", "dataset": "femnist", "directory": str(root),
      "files": {"train": ["part_0.json", "part_1.json"],
                "test": ["all.json"]},
      "clients": 3, "train_rows": 6, "test_rows": 3, "min_samples": 0,
      "dropped_users": 0}
  stats = summary(fed)
  assert stats["train_rows"] == {"min": 1, "median": 2.0, "mean": 2.0,
                                 "max": 3, "total": 6}
  assert stats["test_rows"]["total"] == 3
  assert stats["clients_without_test_rows"] == 1
  assert stats["top_targets"][0] == [7, pytest.approx(2 / 6)]


def test_min_samples_drops_users_and_their_test_rows(femnist):
  root, users, _ = femnist
  fed = load_leaf(root, "femnist", min_samples=2)
  assert fed.client_ids == ("f_z", "f_a")
  assert fed.provenance["dropped_users"] == 1
  assert fed.provenance["min_samples"] == 2
  assert len(fed.train_x) == 5 and len(fed.test_x) == 3


def _snippet(i):
  text = (f"To be, or not to be{i}: that is the question; "
          "whether 'tis nobler in the mind\n")
  return (text * 2)[:80]


def test_shakespeare_tokens_decode_to_the_strings_written(tmp_path):
  curly = "\u2019" + _snippet(9)[1:]  # Normalised to an apostrophe.
  users = {"THE_TEMPEST_MIRANDA": ([_snippet(0), _snippet(1), curly],
                                   ["a", "?", "\u201c"]),
           "HAMLET_HAMLET": ([_snippet(2)], ["\n"])}
  tests = {"HAMLET_HAMLET": ([_snippet(3), _snippet(4)], ["Z", "}"])}
  _write(tmp_path, "train", "train.json", _file(users))
  _write(tmp_path, "test", "test.json", _file(tests))
  fed = load_leaf(tmp_path)
  assert fed.name == "leaf:shakespeare" and fed.task == "sequence"
  assert fed.client_ids == tuple(users)
  assert fed.num_classes == 80 and fed.input_shape == (80,)
  for split, source in (("train", users), ("test", tests)):
    x, y = getattr(fed, f"{split}_x"), getattr(fed, f"{split}_y")
    assert x.dtype == np.int32 and y.dtype == np.int32
    for cid, rows in zip(fed.client_ids, getattr(fed, f"{split}_clients"),
                         strict=True):
      xs, ys = source.get(cid, ([], []))
      assert len(rows) == len(xs)
      for row, s, c in zip(rows, xs, ys, strict=True):
        want = s.replace("\u2019", "'")
        assert decode_characters(x[row]) == want
        assert np.all(y[row, :-1] == PAD_TARGET)
        assert LEAF_CHARACTERS[y[row, -1]] == c.replace("\u201c", '"')
  assert len(fed.test_clients[0]) == 0
  stats = summary(fed)
  assert stats["train_tokens"] == {"min": 1, "median": 2.0, "mean": 2.0,
                                   "max": 3, "total": 4}


def _tweet(text):
  return ["1467810369", "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user",
          text]


def test_sent140_vocabulary_from_training_rows_only(tmp_path):
  users = {"alice": ([_tweet("Bob likes cats. CATS!"), _tweet("dogs, cats")],
                     [1, 0]),
           "bob": ([_tweet("Ants and bees don't like dogs")], [0])}
  tests = {"bob": ([_tweet("zebras like cats and ants"), _tweet("")], [1, 0])}
  _write(tmp_path, "train", "t.json", _file(users))
  _write(tmp_path, "test", "t.json", _file(tests))
  fed = load_leaf(tmp_path, vocabulary_size=6, max_words=4)
  assert fed.name == "leaf:sent140" and fed.input_shape == (4,)
  assert fed.num_classes == 2 and fed.task == "classification"
  # Training counts: cats 3, dogs 2, the rest 1 (ties alphabetical).
  vocab = {"cats": 2, "dogs": 3, "and": 4, "ants": 5}
  def encode(text):
    ids = [vocab.get(w, 1) for w in re.findall(r"[a-z0-9]+", text.lower())]
    return (ids + [0] * 4)[:4]
  for split, source in (("train", users), ("test", tests)):
    x, y = getattr(fed, f"{split}_x"), getattr(fed, f"{split}_y")
    for cid, rows in zip(fed.client_ids, getattr(fed, f"{split}_clients"),
                         strict=True):
      xs, ys = source.get(cid, ([], []))
      np.testing.assert_array_equal(
          x[rows], np.asarray([encode(r[4]) for r in xs], np.int32)
          .reshape(-1, 4))
      np.testing.assert_array_equal(y[rows], ys)
  assert fed.test_x[0].tolist() == [1, 1, 2, 4]  # zebras, like: unknown.
  assert fed.test_x[1].tolist() == [0, 0, 0, 0]
  prov = fed.provenance
  assert (prov["vocabulary_size"], prov["max_words"],
          prov["vocabulary_words"]) == (6, 4, 4)


def test_sent140_defaults_and_inference(tmp_path):
  _write(tmp_path, "train", "t.json", _file({"u": ([_tweet("hi")], [1])}))
  _write(tmp_path, "test", "t.json", _file({}))
  fed = load_leaf(tmp_path)
  assert fed.input_shape == (25,)
  assert fed.provenance["vocabulary_size"] == 10000
  assert fed.train_x[0, :2].tolist() == [2, 0]


def test_sent140_vocabulary_skips_dropped_users(tmp_path):
  users = {"few": ([_tweet("rare rare rare")], [1]),
           "many": ([_tweet("common"), _tweet("words")], [0, 1])}
  _write(tmp_path, "train", "t.json", _file(users))
  _write(tmp_path, "test", "t.json", _file({"few": ([_tweet("rare")], [0])}))
  fed = load_leaf(tmp_path, "sent140", min_samples=2, max_words=2)
  assert fed.client_ids == ("many",) and len(fed.test_x) == 0
  assert fed.train_x.tolist() == [[2, 0], [3, 0]]  # common, words.
  assert fed.provenance["vocabulary_words"] == 2
  assert fed.provenance["dropped_users"] == 1


def _femnist_dir(tmp_path, train=None, test=None):
  rng = np.random.default_rng(1)
  train = train or _file({"u1": (_pixels(rng, 2), [1, 2])})
  test = test or _file({"u1": (_pixels(rng, 1), [3])})
  _write(tmp_path, "train", "train.json", train)
  _write(tmp_path, "test", "test.json", test)
  return tmp_path


@pytest.mark.parametrize("key", ["users", "user_data", "num_samples"])
def test_missing_key(tmp_path, key):
  obj = _file({"u1": ([[0.5] * 784], [1])})
  del obj[key]
  _femnist_dir(tmp_path, train=obj)
  with pytest.raises(ValueError, match=rf"train\.json lacks .*'{key}'"):
    load_leaf(tmp_path)


def test_num_samples_disagreeing_with_x(tmp_path):
  obj = _file({"u1": ([[0.5] * 784] * 2, [1, 1])})
  obj["num_samples"] = [3]
  _femnist_dir(tmp_path, train=obj)
  with pytest.raises(ValueError,
                     match=r"train\.json: user 'u1': 'num_samples' says 3"):
    load_leaf(tmp_path)


@pytest.mark.parametrize("users, message", [
    ({"u1": ([[0.5] * 784, [0.5] * 783], [1, 1])},
     r"train\.json: user 'u1': x\[1\] must be a list of 784 pixels, got 783"),
    ({"u1": ([["0.5"] * 784], [1])}, r"train\.json: user 'u1': x must hold "
     "numbers"),
    ({"u1": ([[0.5] * 783 + [float("nan")]], [1])},
     r"train\.json: user 'u1': x\[0\]\[783\] = nan; pixels must be finite"),
    ({"u1": ([[0.5] * 783 + [1.5]], [1])}, r"x\[0\]\[783\] = 1\.5"),
    ({"u1": ([[0.5] * 784] * 2, [1, 2.5])},
     r"train\.json: user 'u1': y\[1\] = .*2\.5.* is not an integer label"),
    ({"u1": ([[0.5] * 784], [62])},
     r"train\.json: user 'u1': y\[0\] = 62 is outside \[0, 62\)"),
    ({"u1": ([[0.5] * 784], ["1"])}, r"user 'u1': y must hold integer"),
])
def test_bad_femnist_rows(tmp_path, users, message):
  _femnist_dir(tmp_path, train=_file(users))
  with pytest.raises(ValueError, match=message):
    load_leaf(tmp_path, "femnist")


@pytest.mark.parametrize("xs, ys, message", [
    (["a" * 79], ["b"], r"user 'u': x\[0\] must be a string of 80 "
     "characters, got 79"),
    (["a" * 80], ["bc"], r"user 'u': y\[0\] must be one character"),
    (["a" * 80, "a" * 40 + "@" + "a" * 39], ["b", "c"],
     r"user 'u': x\[1\] holds character '@'"),
    (["a" * 80], ["#"], r"user 'u': y\[0\] holds character '#'"),
])
def test_bad_shakespeare_rows(tmp_path, xs, ys, message):
  _write(tmp_path, "train", "s.json", _file({"u": (xs, ys)}))
  _write(tmp_path, "test", "s.json", _file({}))
  with pytest.raises(ValueError, match=r"s\.json: " + message):
    load_leaf(tmp_path, "shakespeare")


def test_bad_sent140_row(tmp_path):
  _write(tmp_path, "train", "s.json", _file({"u": ([["1", "2"]], [1])}))
  _write(tmp_path, "test", "s.json", _file({}))
  with pytest.raises(ValueError, match=r"s\.json: user 'u': x\[0\] must be "
                     "LEAF's"):
    load_leaf(tmp_path, "sent140")


def test_unknown_test_user(tmp_path):
  _femnist_dir(tmp_path, test=_file({"ghost": ([[0.5] * 784], [1])}))
  with pytest.raises(ValueError, match=r"test\.json: unknown users "
                     r"\['ghost'\]"):
    load_leaf(tmp_path)


def test_user_in_two_files_of_a_split(tmp_path):
  _femnist_dir(tmp_path)
  _write(tmp_path, "train", "more.json", _file({"u1": ([[0.5] * 784], [1])}))
  with pytest.raises(ValueError, match=r"train\.json: user 'u1' is also in "
                     r"more\.json"):
    load_leaf(tmp_path)


@pytest.mark.parametrize("text, message", [
    ("{not json", r"bad\.json: not a JSON file"),
    ("[1, 2]", r"bad\.json: expected a JSON object"),
])
def test_file_that_is_not_a_leaf_object(tmp_path, text, message):
  _femnist_dir(tmp_path)
  _write(tmp_path, "train", "bad.json", text)
  with pytest.raises(ValueError, match=message):
    load_leaf(tmp_path)


def test_user_data_entries_must_match_users(tmp_path):
  obj = _file({"u1": ([[0.5] * 784], [1])})
  obj["user_data"]["stray"] = {"x": [], "y": []}
  _femnist_dir(tmp_path, train=obj)
  with pytest.raises(ValueError, match=r"train\.json: 'user_data' holds "
                     r"users \['stray'\]"):
    load_leaf(tmp_path)
  del obj["user_data"]["stray"], obj["user_data"]["u1"]["y"]
  _femnist_dir(tmp_path, train=obj)
  with pytest.raises(ValueError, match=r"train\.json: 'user_data' of user "
                     "'u1' must be an object with lists 'x' and 'y'"):
    load_leaf(tmp_path)


def test_empty_directory_and_empty_split(tmp_path):
  with pytest.raises(ValueError, match=r"no train/ folder"):
    load_leaf(tmp_path)
  (tmp_path / "train").mkdir()
  with pytest.raises(ValueError, match=r"train: no \.json files"):
    load_leaf(tmp_path)
  _write(tmp_path, "train", "t.json", _file({"u": (["a" * 80], ["b"])}))
  with pytest.raises(ValueError, match=r"no test/ folder"):
    load_leaf(tmp_path)


def test_options_for_the_wrong_dataset(tmp_path):
  _femnist_dir(tmp_path)
  with pytest.raises(ValueError, match=r"\['max_words'\] are for sent140 "
                     "only, not femnist"):
    load_leaf(tmp_path, max_words=5)  # Inferred femnist.
  with pytest.raises(ValueError, match="for sent140 only, not shakespeare"):
    load_leaf(tmp_path / "nowhere", "shakespeare", vocabulary_size=5)
  with pytest.raises(TypeError, match=r"unknown option\(s\) \['vocab'\]"):
    load_leaf(tmp_path, "sent140", vocab=5)
  with pytest.raises(ValueError, match="max_words must be an int >= 1"):
    load_leaf(tmp_path, "sent140", max_words=0)


def test_dataset_that_cannot_be_inferred(tmp_path):
  _write(tmp_path, "train", "odd.json", _file({"u": ([[1, 2, 3]], [0])}))
  _write(tmp_path, "test", "odd.json", _file({}))
  with pytest.raises(ValueError, match=r"odd\.json: cannot tell the LEAF "
                     "dataset.*pass dataset="):
    load_leaf(tmp_path)
  with pytest.raises(ValueError, match="dataset must be one of"):
    load_leaf(tmp_path, "mnist")


@pytest.mark.parametrize("dataset", ["femnist", None])
def test_boolean_labels_are_refused_not_read_as_one(tmp_path, dataset):
  # NumPy would read [1, true, 0, 3] as [1, 1, 0, 3].
  _femnist_dir(tmp_path, train=_file({"u1": ([[0.5] * 784] * 4,
                                             [1, True, 0, 3])}))
  with pytest.raises(ValueError, match=r"train\.json: user 'u1': y\[1\] "
                     r"holds a boolean \(true\); labels must be integers"):
    load_leaf(tmp_path, dataset)


@pytest.mark.parametrize("dataset, row", [("femnist", 0), (None, 0),
                                          (None, 1)])
def test_boolean_pixels_are_refused_not_read_as_one(tmp_path, dataset, row):
  xs = [[0.5] * 784, [0.25] * 784]
  xs[row][17] = True  # Row 0 also decides the inferred dataset.
  _femnist_dir(tmp_path, train=_file({"u1": (xs, [1, 2])}))
  with pytest.raises(ValueError, match=rf"train\.json: user 'u1': "
                     rf"x\[{row}\]\[17\] holds a boolean \(true\); pixels "
                     "must be numbers"):
    load_leaf(tmp_path, dataset)


def test_boolean_sent140_label_is_refused(tmp_path):
  _write(tmp_path, "train", "s.json",
         _file({"u": ([_tweet("hi"), _tweet("yo")], [0, False])}))
  _write(tmp_path, "test", "s.json", _file({}))
  with pytest.raises(ValueError, match=r"s\.json: user 'u': y\[1\] holds a "
                     r"boolean \(false\)"):
    load_leaf(tmp_path, "sent140")


_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("text", [
    _DEEP,
    '{"users": ["u1"], "num_samples": [1], "user_data": {"u1": {"x": '
    + _DEEP + ', "y": [1]}}}',
])
def test_file_nested_too_deeply(tmp_path, text):
  _femnist_dir(tmp_path)
  _write(tmp_path, "train", "deep.json", text)
  with pytest.raises(ValueError, match=r"deep\.json: nested too deeply"):
    load_leaf(tmp_path)


@pytest.mark.parametrize("where", ["num_samples", "x", "y"])
def test_deep_values_that_parse_give_short_messages(tmp_path, where):
  # Deep enough to nearly exhaust the recursion limit once parsed; the
  # message shows a few levels of it, without recursing through it.
  depth = 900
  deep = "[" * depth + "]" * depth
  parts = {"num_samples": "[1]", "x": '["' + "a" * 80 + '"]', "y": '["b"]'}
  parts[where] = "[" + deep + "]"
  _write(tmp_path, "train", "s.json",
         '{"users": ["u"], "num_samples": %s, "user_data": {"u": '
         '{"x": %s, "y": %s}}}' % (parts["num_samples"], parts["x"],
                                   parts["y"]))
  _write(tmp_path, "test", "s.json", _file({}))
  with pytest.raises(ValueError, match=r"s\.json: user 'u'") as error:
    load_leaf(tmp_path, "shakespeare")
  assert len(str(error.value)) < 400
