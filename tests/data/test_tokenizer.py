"""``load_tokenizer`` and ``train_bpe``: Hugging Face tokenizer files read
offline, and refused naming the file when they are not tokenizers."""

import json
import socket

import numpy as np
import pytest

from fedjax_agg import data
from fedjax_agg.types import PAD_TARGET
from tests.data import _instruction_util

WORD_LEVEL = _instruction_util.WORD_LEVEL
PREPEND = _instruction_util.PREPEND
WITH_BOS = _instruction_util.WITH_BOS


def _write(path, value):
  path.write_text(json.dumps(value), encoding="utf-8")
  return path


def test_a_hand_written_word_level_file_encodes_as_its_vocabulary(tmp_path):
  tokenizer = data.load_tokenizer(_write(tmp_path / "tokenizer.json",
                                         WORD_LEVEL))
  ids = tokenizer.encode("hello world again whatever")
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, [1, 2, 7, 0])
  # The largest id + 1 (ids 4..6 are unused), not the number of entries.
  assert tokenizer.vocab_size == 8
  assert (tokenizer.eos_token, tokenizer.eos_id) == ("</s>", 3)
  assert tokenizer.source == str(tmp_path / "tokenizer.json")


def test_a_folder_is_read_with_the_eos_of_its_tokenizer_config(tmp_path):
  _write(tmp_path / "tokenizer.json", WORD_LEVEL)
  _write(tmp_path / "tokenizer_config.json",
         {"eos_token": {"content": "again", "lstrip": False}})
  tokenizer = data.load_tokenizer(tmp_path)
  assert (tokenizer.eos_token, tokenizer.eos_id) == ("again", 7)
  # A name given wins over the config's.
  assert data.load_tokenizer(tmp_path, eos_token="world").eos_id == 2


def test_no_known_eos_token_means_none(tmp_path):
  vocab = {"[UNK]": 0, "hello": 1}
  value = dict(WORD_LEVEL, model=dict(WORD_LEVEL["model"], vocab=vocab))
  tokenizer = data.load_tokenizer(_write(tmp_path / "t.json", value))
  assert tokenizer.eos_token is None and tokenizer.eos_id is None


def test_a_trained_tokenizer_round_trips_through_its_file(tmp_path):
  tokenizer = _instruction_util.tokenizer()
  path = tmp_path / "tokenizer.json"
  tokenizer.backend.save(str(path))
  loaded = data.load_tokenizer(path)
  text = "What is 12 + 30?\nnaïve — 東京 🙂 {instruction}"
  np.testing.assert_array_equal(loaded.encode(text), tokenizer.encode(text))
  assert loaded.decode(loaded.encode(text)) == text  # byte level: lossless
  assert loaded.eos_id == tokenizer.eos_id == 0
  assert loaded.digest == tokenizer.digest
  assert loaded.provenance()["sha256"] == tokenizer.digest


def test_loading_opens_no_connection(tmp_path, monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError(f"network use: {args}")
  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  path = tmp_path / "tokenizer.json"
  _instruction_util.tokenizer().backend.save(str(path))
  assert data.load_tokenizer(path).vocab_size == 320


def test_training_is_deterministic():
  texts = ["the cat sat on the mat", "the dog sat on the log"] * 5
  first, second = data.train_bpe(texts, 300), data.train_bpe(texts, 300)
  assert first.backend.to_str() == second.backend.to_str()
  assert first.digest == second.digest
  assert first.vocab_size <= 300


def test_decode_skips_padding_targets():
  tokenizer = _instruction_util.tokenizer()
  ids = tokenizer.encode("abc")
  padded = np.concatenate([ids, [PAD_TARGET, PAD_TARGET]])
  assert tokenizer.decode(padded) == "abc"


@pytest.mark.parametrize("content,message", [
    (b"{\"model\": {\"type\": \"BPE\"", "not valid JSON.*line 1"),
    (b"", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b"{\"model\": NaN}", "NaN is not JSON"),
    (b"[1, 2, 3]", "JSON but not a tokenizer"),
    (b"{}", "JSON but not a tokenizer"),
    (b"{\"model\": 3}", "not a tokenizer the tokenizers package reads"),
    (b"{\"model\": {\"type\": \"Nope\"}}",
     "not a tokenizer the tokenizers package reads"),
])
def test_files_that_are_not_tokenizers_are_refused_naming_them(
    tmp_path, content, message):
  _instruction_util.assert_refused_naming_file(
      data.load_tokenizer, tmp_path / "tokenizer.json", content, message)


def test_missing_files_and_bad_paths_are_refused(tmp_path):
  with pytest.raises(FileNotFoundError, match="nothing.json"):
    data.load_tokenizer(tmp_path / "nothing.json")
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    data.load_tokenizer(tmp_path)  # a folder without one
  with pytest.raises(TypeError, match="path"):
    data.load_tokenizer(3)


def test_a_bad_eos_is_refused_naming_it(tmp_path):
  path = _write(tmp_path / "tokenizer.json", WORD_LEVEL)
  with pytest.raises(ValueError, match="'<eos>' is not in the vocabulary"):
    data.load_tokenizer(path, eos_token="<eos>")
  _write(tmp_path / "tokenizer_config.json", {"eos_token": 5})
  with pytest.raises(ValueError, match="tokenizer_config.json.*eos_token"):
    data.load_tokenizer(path)
  (tmp_path / "tokenizer_config.json").write_text("{\"eos_token\": ")
  with pytest.raises(ValueError, match="tokenizer_config.json.*not valid"):
    data.load_tokenizer(path)


@pytest.mark.parametrize("texts,vocab_size,eos,error", [
    (["abc"], 256, "<eos>", ValueError),
    (["abc"], 300.0, "<eos>", ValueError),
    (["abc"], True, "<eos>", ValueError),
    (["abc", 5], 300, "<eos>", TypeError),
    (["abc"], 300, "", ValueError),
])
def test_training_refuses_bad_arguments(texts, vocab_size, eos, error):
  with pytest.raises(error):
    data.train_bpe(texts, vocab_size, eos)


def test_wrapping_something_else_is_refused():
  with pytest.raises(TypeError, match="tokenizers.Tokenizer"):
    data.Tokenizer({"model": {}})


def test_the_token_a_post_processor_prepends_is_the_bos(tmp_path):
  tokenizer = data.load_tokenizer(_write(tmp_path / "t.json", WITH_BOS))
  assert (tokenizer.bos_token, tokenizer.bos_id) == ("<s>", 4)
  np.testing.assert_array_equal(tokenizer.encode("hello"), [1])  # no BOS
  plain = data.load_tokenizer(_write(tmp_path / "p.json", WORD_LEVEL))
  assert (plain.bos_token, plain.bos_id) == (None, None)
  # A post-processor that appends (T5's "</s>") prepends nothing.
  append = dict(PREPEND, single=PREPEND["single"][::-1],
                pair=PREPEND["pair"][::-1])
  appended = data.load_tokenizer(_write(
      tmp_path / "a.json", dict(WITH_BOS, post_processor=append)))
  assert appended.bos_id is None
  assert _instruction_util.tokenizer().bos_id is None
