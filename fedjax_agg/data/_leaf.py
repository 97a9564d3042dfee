"""LEAF's JSON federations (FEMNIST, Shakespeare, Sent140) from disk.

LEAF (Caldas et al., "LEAF: A Benchmark for Federated Settings", 2018)
writes a dataset as ``train/*.json`` and ``test/*.json``; each file is an
object with ``users`` (client names), ``num_samples`` (one count per user),
``user_data`` (user -> ``{"x": [...], "y": [...]}``) and optionally
``hierarchies`` (ignored). ``load_leaf`` merges the files of each split
into a ``NaturalFederation`` whose clients are the training users in file
order (files sorted by name, users in each file's ``users`` order). Test
users must be training users: LEAF's user-wise split (``-t user``) is
refused as "unknown users".
"""

import collections
import itertools
import json
import os
import pathlib
import re
import reprlib
from typing import Optional

import numpy as np

from fedjax_agg.data import _text
from fedjax_agg.data._natural import check_federation
from fedjax_agg.data._natural import NaturalFederation
from fedjax_agg.data._natural import PAD_TARGET

DATASETS = ("femnist", "shakespeare", "sent140")
"""The LEAF datasets ``load_leaf`` reads."""
SENT140_OPTIONS = {"vocabulary_size": 10000, "max_words": 25}
"""Sent140's options (``load_leaf(..., **options)``) and their defaults."""
_KEYS = ("users", "num_samples", "user_data")
_PIXELS = 28 * 28
_LENGTH = _text.SEQUENCE_LENGTH
_KNOWN = frozenset(_text.LEAF_CHARACTERS)
# Sent140 words: maximal runs of Unicode letters and digits.
_WORD = re.compile(r"[^\W_]+")
# Shows a file's value in a message: a few items, a few levels, no
# recursion however deep the value is nested.
_shown = reprlib.Repr().repr


def _json_bool(value) -> str:
  """``true``/``false``, as the file spells a boolean."""
  return "true" if value else "false"


def _first_bool(values) -> Optional[int]:
  """Index of the first boolean in ``values`` (a list), or None.

  ``np.asarray`` would read ``true`` as 1; the scan is over types, in C.
  """
  types = set(map(type, values))
  if bool not in types and np.bool_ not in types:
    return None
  return next(i for i, v in enumerate(values)
              if isinstance(v, (bool, np.bool_)))


def int_labels(values, num_classes: int, where: str) -> np.ndarray:
  """Integer labels in ``[0, num_classes)`` as int32 ``[n]``.

  Integral floats (``3.0``) pass; fractions, NaN, booleans (JSON's
  ``true``, which NumPy would read as 1), strings fail.

  Args:
    values: a sequence or array of labels.
    num_classes: labels must lie in ``[0, num_classes)``.
    where: names the labels in messages (file, client and key).

  Returns:
    The labels, int32 ``[n]``.

  Raises:
    ValueError: naming ``where`` and the first bad label's index.
  """
  # Scanned before np.asarray, which would turn JSON's true into 1.
  if isinstance(values, (list, tuple)):
    i = _first_bool(values)
    if i is not None:
      raise ValueError(f"{where}[{i}] holds a boolean "
                       f"({_json_bool(values[i])}); labels must be integers")
  try:
    y = np.asarray(values)
  except ValueError:  # Ragged.
    y = None
  # np.asarray([]) is float64 [0]: an empty list passes here and gets its
  # int32 type below.
  if y is None or (y.size and y.ndim != 1):
    raise ValueError(f"{where} must be a flat list of integer labels")
  if y.size == 0:
    return np.zeros((0,), np.int32)
  if y.dtype.kind == "f":
    bad = ~np.isfinite(y) | (y != np.round(y))
    if bad.any():
      i = int(np.flatnonzero(bad)[0])
      raise ValueError(f"{where}[{i}] = {y[i]} is not an integer label")
  elif y.dtype.kind == "b":
    raise ValueError(f"{where} holds booleans; labels must be integers")
  elif y.dtype.kind not in "iu":
    raise ValueError(f"{where} must hold integer labels, got dtype "
                     f"{y.dtype}")
  bad = (y < 0) | (y >= num_classes)
  if bad.any():
    i = int(np.flatnonzero(bad)[0])
    raise ValueError(f"{where}[{i}] = {y[i]} is outside [0, {num_classes})")
  return y.astype(np.int32)


def assemble(name: str, train: dict, test: dict, *, num_classes: int,
             input_shape: tuple, task: str, min_rows: int = 1,
             test_where: str = "test split"
             ) -> tuple[NaturalFederation, int]:
  """Pools per-client arrays into a ``NaturalFederation``.

  Args:
    name: the federation's name.
    train: client id -> ``(x [n, *input_shape], y [n] or [n, T])``, in
      client order.
    test: client id -> ``(x, y)`` as ``train``; ids must be in ``train``.
    num_classes, input_shape, task: as ``NaturalFederation``'s.
    min_rows: clients with fewer training rows (at least 1) are dropped
      together with their test rows.
    test_where: names the test data in the unknown-clients message.

  Returns:
    ``(federation, dropped)``: the federation (empty provenance) and the
    number of clients dropped.

  Raises:
    ValueError: test clients not in ``train``, or no client left.
  """
  unknown = [c for c in test if c not in train]
  if unknown:
    raise ValueError(f"{test_where}: unknown users {unknown[:5]} (not in "
                     f"the training split; {len(unknown)} in all)")
  # At least 1: a client without training rows could be sampled but never
  # train.
  min_rows = max(int(min_rows), 1)
  kept = [c for c, (x, _) in train.items() if len(x) >= min_rows]
  if not kept:
    raise ValueError(f"{name}: no client has {min_rows}+ training rows")
  x0, y0 = train[kept[0]]
  # Shaped like the kept clients' arrays, so a client without test rows
  # (or a test split with none at all) still concatenates.
  empty = (np.zeros((0,) + tuple(x0.shape[1:]), x0.dtype),
           np.zeros((0,) + tuple(y0.shape[1:]), np.int32))

  def pool(split):
    xs, ys, rows, start = [empty[0]], [empty[1]], [], 0
    for c in kept:
      x, y = split.get(c, empty)
      xs.append(x)
      ys.append(np.asarray(y, np.int32))
      rows.append(np.arange(start, start + len(x)))
      start += len(x)
    return np.concatenate(xs), np.concatenate(ys), tuple(rows)

  train_x, train_y, train_rows = pool(train)
  test_x, test_y, test_rows = pool(test)
  fed = NaturalFederation(
      name=name, train_x=train_x, train_y=train_y, train_clients=train_rows,
      test_x=test_x, test_y=test_y, test_clients=test_rows,
      client_ids=tuple(kept), num_classes=num_classes,
      input_shape=tuple(input_shape), task=task, provenance={})
  return fed, len(train) - len(kept)


def _read_split(directory: pathlib.Path, split: str):
  """-> (paths, {user: (path, xs, ys)}) of one split's JSON files."""
  folder = directory / split
  if not folder.is_dir():
    raise ValueError(f"{directory}: no {split}/ folder (LEAF writes "
                     "train/*.json and test/*.json)")
  # Sorted: client order, and with it every client id, must not depend on
  # the order the file system lists the files in.
  paths = sorted(folder.glob("*.json"))
  if not paths:
    raise ValueError(f"{folder}: no .json files")
  users = {}
  for path in paths:
    try:
      with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
      raise ValueError(f"{path}: not a JSON file ({error})") from error
    except RecursionError:
      # A LEAF file is 5 levels deep (object, user_data, user, x, row).
      raise ValueError(f"{path}: nested too deeply to be a LEAF file "
                       "(its lists and objects go 5 levels deep)") from None
    if not isinstance(obj, dict):
      raise ValueError(f"{path}: expected a JSON object with keys "
                       f"{list(_KEYS)}, got {type(obj).__name__}")
    missing = [key for key in _KEYS if key not in obj]
    if missing:
      raise ValueError(f"{path} lacks key(s) {missing} (a LEAF file holds "
                       f"{list(_KEYS)})")
    names, counts, data = (obj[key] for key in _KEYS)
    if not isinstance(names, list) or not all(isinstance(u, str)
                                              for u in names):
      raise ValueError(f"{path}: 'users' must be a list of strings")
    if not isinstance(counts, list) or len(counts) != len(names):
      raise ValueError(f"{path}: 'num_samples' must be a list with one count "
                       f"per user ({len(names)})")
    if not isinstance(data, dict):
      raise ValueError(f"{path}: 'user_data' must be an object")
    if len(set(names)) != len(names):
      twice = collections.Counter(names).most_common(1)[0][0]
      raise ValueError(f"{path}: 'users' lists {twice!r} more than once")
    extra = sorted(set(data) - set(names))
    if extra:
      raise ValueError(f"{path}: 'user_data' holds users {extra[:5]} that "
                       "'users' does not list")
    for user, count in zip(names, counts, strict=True):
      # A user in two files would get the data of whichever file came last.
      if user in users:
        raise ValueError(f"{path}: user {user!r} is also in "
                         f"{users[user][0].name} (a user must be in one "
                         f"{split} file)")
      entry = data.get(user)
      if not isinstance(entry, dict) or not all(
          isinstance(entry.get(key), list) for key in ("x", "y")):
        raise ValueError(f"{path}: 'user_data' of user {user!r} must be an "
                         "object with lists 'x' and 'y'")
      xs, ys = entry["x"], entry["y"]
      if (isinstance(count, bool) or not isinstance(count, int)
          or not count == len(xs) == len(ys)):
        raise ValueError(f"{path}: user {user!r}: 'num_samples' says "
                         f"{_shown(count)} but 'x' has {len(xs)} and 'y' "
                         f"{len(ys)} samples")
      users[user] = (path, xs, ys)
  return paths, users


def _infer(users: dict) -> str:
  """The dataset of the first training row."""
  for path, xs, _ in users.values():
    if not xs:
      continue
    row = xs[0]
    if isinstance(row, str):
      return "shakespeare"
    # Booleans count as numbers here, for _femnist to refuse by name.
    if isinstance(row, list) and len(row) == _PIXELS and all(
        isinstance(v, (int, float)) for v in row):
      return "femnist"
    if isinstance(row, list) and len(row) >= 5 and isinstance(row[4], str):
      return "sent140"
    raise ValueError(f"{path}: cannot tell the LEAF dataset from its 'x' "
                     f"rows; pass dataset= one of {DATASETS}")
  raise ValueError("the training files hold no samples; pass dataset= one "
                   f"of {DATASETS}")


def _femnist(xs, ys, where: str):
  """784-pixel rows -> (float32 [n, 28, 28, 1], int32 [n])."""
  for i, row in enumerate(xs):
    if not isinstance(row, list) or len(row) != _PIXELS:
      size = len(row) if isinstance(row, list) else type(row).__name__
      raise ValueError(f"{where}: x[{i}] must be a list of {_PIXELS} "
                       f"pixels, got {size}")
  # A boolean pixel would read as 1.0 in np.asarray; it is named instead.
  j = _first_bool(list(itertools.chain.from_iterable(xs)))
  if j is not None:
    i, j = divmod(j, _PIXELS)
    raise ValueError(f"{where}: x[{i}][{j}] holds a boolean "
                     f"({_json_bool(xs[i][j])}); pixels must be numbers")
  try:
    x = np.asarray(xs)
  except ValueError as error:  # Rows holding lists.
    raise ValueError(f"{where}: x must hold numbers ({error})") from error
  if len(xs) and (x.ndim != 2 or x.dtype.kind not in "fiu"):
    raise ValueError(f"{where}: x must hold numbers, got dtype {x.dtype}")
  x = x.reshape(-1, _PIXELS)
  # LEAF stores FEMNIST's pixels in [0, 1] already; other values are not
  # LEAF's format and are refused rather than rescaled.
  bad = ~np.isfinite(x) | (x < 0) | (x > 1)
  if bad.any():
    i, j = (int(k) for k in np.argwhere(bad)[0])
    raise ValueError(f"{where}: x[{i}][{j}] = {x[i, j]}; pixels must be "
                     "finite and in [0, 1]")
  y = int_labels(ys, 62, f"{where}: y")
  return x.astype(np.float32).reshape(-1, 28, 28, 1), y


def _characters(text: str, where: str, key: str, width: int):
  """LEAF tokens of ``text``, naming ``key[i]`` of a bad character."""
  tokens, dropped = _text.encode_characters(text, drop_unknown=True)
  if dropped:
    pos = next(i for i, c in enumerate(text) if c not in _KNOWN)
    # ``text`` is the rows joined, so position // width is the row.
    raise ValueError(f"{where}: {key}[{pos // width}] holds character "
                     f"{text[pos]!r}, not in LEAF's character set")
  return tokens


def _shakespeare(xs, ys, where: str):
  """80-character strings -> (int32 [n, 80], int32 [n, 80] targets)."""
  for i, (s, c) in enumerate(zip(xs, ys, strict=True)):
    if not isinstance(s, str) or len(s) != _LENGTH:
      got = f"{len(s)} characters" if isinstance(s, str) else _shown(s)
      raise ValueError(f"{where}: x[{i}] must be a string of {_LENGTH} "
                       f"characters, got {got}")
    if not isinstance(c, str) or len(c) != 1:
      raise ValueError(f"{where}: y[{i}] must be one character, got "
                       f"{_shown(c)}")
  # normalize_text maps one character to one, so positions are kept.
  x = _characters(_text.normalize_text("".join(xs)), where, "x", _LENGTH)
  last = _characters(_text.normalize_text("".join(ys)), where, "y", 1)
  y = np.full((len(xs), _LENGTH), PAD_TARGET, np.int32)
  # Only the last position is scored: LEAF's target is the one character
  # after the 80.
  y[:, -1] = last
  return x.reshape(-1, _LENGTH), y


def _sent140_words(xs, ys, where: str):
  """LEAF's [id, date, query, user, text] rows -> (word lists, labels)."""
  words = []
  for i, row in enumerate(xs):
    if not (isinstance(row, list) and len(row) >= 5
            and isinstance(row[4], str)):
      raise ValueError(f"{where}: x[{i}] must be LEAF's [id, date, query, "
                       "user, text] list with the text a string")
    words.append(_WORD.findall(row[4].lower()))
  return words, int_labels(ys, 2, f"{where}: y")


def _settings(dataset: str, options: dict) -> dict:
  """Sent140's options with their defaults; none for other datasets."""
  if dataset != "sent140":
    if options:
      raise ValueError(f"options {sorted(options)} are for sent140 only, "
                       f"not {dataset}")
    return {}
  unknown = sorted(set(options) - set(SENT140_OPTIONS))
  if unknown:
    raise TypeError(f"load_leaf got unknown option(s) {unknown}; sent140 "
                    f"takes {sorted(SENT140_OPTIONS)}")
  out = {**SENT140_OPTIONS, **options}
  for key, low in (("vocabulary_size", 2), ("max_words", 1)):
    value = out[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
      raise ValueError(f"{key} must be an int >= {low}, got {value!r}")
  return out


def _vocabulary(train: dict, floor: int, size: int) -> dict:
  """The ``size`` most frequent words of users with ``floor``+ rows."""
  # Only the users that will be kept count (floor = min_samples, at least
  # 1): a dropped user's words do not shape the vocabulary.
  counts = collections.Counter(
      w for words, _ in train.values() if len(words) >= floor
      for row in words for w in row)
  # Ties broken by the word itself, so the vocabulary does not depend on
  # the order users are read. Ids start at 2: 0 pads, 1 is unknown.
  ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:size]
  return {w: i + 2 for i, (w, _) in enumerate(ranked)}


def _encode_words(words, index: dict, max_words: int) -> np.ndarray:
  x = np.zeros((len(words), max_words), np.int32)
  for i, row in enumerate(words):
    ids = [index.get(w, 1) for w in row[:max_words]]
    x[i, :len(ids)] = ids
  return x


def load_leaf(directory, dataset: Optional[str] = None, *,
              min_samples: int = 0, **options) -> NaturalFederation:
  """Reads a LEAF dataset directory (``train/*.json``, ``test/*.json``).

  Datasets:

  * ``femnist``: x rows of 784 pixels in [0, 1], kept as LEAF stores them
    (inverted: 1.0 is the background) -> float32 ``[28, 28, 1]``; y in
    ``[0, 62)``. Task ``classification``.
  * ``shakespeare``: x rows of 80 characters, y the next one. A sample
    is int32 tokens ``[80]`` (LEAF's indices of the ``normalize_text``-ed
    text) and int32 targets ``[80]``, ``PAD_TARGET`` but the last (y's
    token): only the next character is scored, as in LEAF. Task
    ``sequence``, 80 classes.
  * ``sent140``: x rows LEAF's ``[id, date, query, user, text]``, y 0/1.
    Words are the maximal runs of letters and digits of the lowercased
    text (anything else, apostrophes included, separates words). The
    vocabulary is the ``vocabulary_size - 2`` most frequent words of the
    kept users' training rows (ties broken alphabetically), as tokens
    2, 3, ...; 0 pads and 1 is out-of-vocabulary. Inputs are the first
    ``max_words`` words, int32 ``[max_words]``. Task ``classification``.

  Args:
    directory: the LEAF output folder holding ``train/`` and ``test/``.
    dataset: one of ``DATASETS``, or None to infer it from the first
      training row (784 numbers: femnist; a string: shakespeare; a list
      whose 5th item is a string: sent140).
    min_samples: users with fewer training samples (and always those with
      none) are dropped, their test rows too.
    **options: sent140 only: ``vocabulary_size`` (default 10000) and
      ``max_words`` (default 25).

  Returns:
    The checked ``NaturalFederation`` named ``leaf:<dataset>``; its
    provenance holds the format, dataset, directory as given, file names
    per split, counts of clients, rows and dropped users, and sent140's
    options.

  Raises:
    ValueError: a malformed file or row (naming the file, user and key;
      a boolean label or pixel included), a file nested too deeply for
      Python's JSON parser, an empty split, a test user not in training,
      a dataset that cannot be inferred, or options for a dataset other
      than sent140.
    TypeError: an option sent140 does not take.
  """
  root = pathlib.Path(directory)
  if dataset is not None and dataset not in DATASETS:
    raise ValueError(f"dataset must be one of {DATASETS} or None, got "
                     f"{dataset!r}")
  if isinstance(min_samples, bool) or not isinstance(min_samples, int) or (
      min_samples < 0):
    raise ValueError(f"min_samples must be an int >= 0, got {min_samples!r}")
  # A named dataset has its options checked before any file is read; an
  # inferred one only once the first row has told what it is.
  if dataset is not None:
    _settings(dataset, options)
  train_paths, train_users = _read_split(root, "train")
  test_paths, test_users = _read_split(root, "test")
  unknown = [u for u in test_users if u not in train_users]
  if unknown:
    raise ValueError(f"{test_users[unknown[0]][0]}: unknown users "
                     f"{unknown[:5]} (not in the training files; "
                     f"{len(unknown)} in all)")
  dataset = dataset or _infer(train_users)
  settings = _settings(dataset, options)
  convert = {"femnist": _femnist, "shakespeare": _shakespeare,
             "sent140": _sent140_words}[dataset]
  splits = [{u: convert(xs, ys, f"{path}: user {u!r}")
             for u, (path, xs, ys) in users.items()}
            for users in (train_users, test_users)]
  if dataset == "sent140":
    # vocabulary_size - 2: ids 0 and 1 are taken (padding, unknown).
    index = _vocabulary(splits[0], max(min_samples, 1),
                        settings["vocabulary_size"] - 2)
    settings["vocabulary_words"] = len(index)
    splits = [{u: (_encode_words(words, index, settings["max_words"]), y)
               for u, (words, y) in split.items()} for split in splits]
  fed, dropped = assemble(
      f"leaf:{dataset}", splits[0], splits[1],
      num_classes={"femnist": 62, "shakespeare": 80, "sent140": 2}[dataset],
      input_shape={"femnist": (28, 28, 1), "shakespeare": (_LENGTH,),
                   "sent140": (settings.get("max_words"),)}[dataset],
      task="sequence" if dataset == "shakespeare" else "classification",
      min_rows=min_samples)
  provenance = {
      "format": "leaf", "dataset": dataset,
      "directory": os.fspath(directory),
      "files": {"train": [p.name for p in train_paths],
                "test": [p.name for p in test_paths]},
      "clients": fed.num_clients, "train_rows": int(len(fed.train_x)),
      "test_rows": int(len(fed.test_x)), "min_samples": int(min_samples),
      "dropped_users": dropped, **settings}
  return check_federation(fed._replace(provenance=provenance))
