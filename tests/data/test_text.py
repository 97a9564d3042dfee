"""LEAF's character set and next-token rows."""

import numpy as np
import pytest

from fedjax_agg.data import _text
from fedjax_agg.types import PAD_TARGET


def test_character_set_is_leafs_80_in_leafs_order():
  assert len(_text.LEAF_CHARACTERS) == 80
  assert len(set(_text.LEAF_CHARACTERS)) == 80
  tokens, dropped = _text.encode_characters("Ay, madam!\n")
  assert dropped == 0
  assert tokens.tolist() == [_text.LEAF_CHARACTERS.index(c)
                             for c in "Ay, madam!\n"]
  assert _text.decode_characters(tokens) == "Ay, madam!\n"


def test_unknown_characters_are_named_or_dropped_and_counted():
  with pytest.raises(ValueError, match=r"'\$' at position 3"):
    _text.encode_characters("abc$d")
  tokens, dropped = _text.encode_characters("abc$d$", drop_unknown=True)
  assert _text.decode_characters(tokens) == "abcd" and dropped == 2
  assert _text.normalize_text("\u2018Tis \u2014 \u201cso\u201d") == (
      "'Tis - \"so\"")
  with pytest.raises(TypeError, match="text must be a str"):
    _text.encode_characters(b"abc")


@pytest.mark.parametrize("size,length", [(1, 4), (2, 4), (5, 4), (9, 4),
                                         (10, 3), (81, 80)])
def test_next_token_rows_predict_every_token_after_the_first_once(
    size, length):
  tokens = np.arange(size, dtype=np.int32) % 7 + 1
  x, y = _text.next_token_sequences(tokens, length, pad_input=0)
  rows = -(-(size - 1) // length) if size > 1 else 0
  assert x.shape == y.shape == (rows, length)
  scored = y != PAD_TARGET
  # The targets, read in order, are the stream without its first token; the
  # input of each scored position is the token before its target.
  np.testing.assert_array_equal(y[scored], tokens[1:])
  np.testing.assert_array_equal(x[scored], tokens[:-1])
  assert np.all(x[~scored] == 0)


def test_next_token_rows_refuse_bad_arguments():
  with pytest.raises(ValueError, match="length must be a positive int"):
    _text.next_token_sequences(np.arange(5), 0)
  with pytest.raises(ValueError, match="tokens must be 1-D"):
    _text.next_token_sequences(np.zeros((2, 2)), 3)
