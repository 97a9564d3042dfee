"""Text to tokens: LEAF's character set and next-token sequences.

Characters. ``LEAF_CHARACTERS`` is the 80-character set of LEAF's
Shakespeare task (Caldas et al., "LEAF: A Benchmark for Federated
Settings", 2018), in LEAF's order, so token ``i`` is LEAF's index ``i``;
a character-level model has an 80-way output, as LEAF's. ``normalize_text``
maps typographic variants onto it (curly quotes to straight, dashes to
``-``) and ``encode_characters`` refuses what is still outside it unless
told to drop it.

Sequences. ``next_token_sequences`` cuts one client's token stream into
rows of ``length`` inputs and ``length`` targets, the targets being the
inputs shifted by one (each position predicts the next token, as in the
FedAvg paper's Shakespeare LSTM and FedJAX/TFF's preprocessing). Rows
overlap by one token, so every token after the first is predicted exactly
once; the last row is padded: inputs with ``pad_input``, targets with
``PAD_TARGET``, which the loss and metrics skip.
"""

import numpy as np

from fedjax_agg.data._natural import PAD_TARGET

LEAF_CHARACTERS = ("\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]"
                   "abcdefghijklmnopqrstuvwxyz}")
"""LEAF's Shakespeare character set (80 characters, LEAF's order)."""
SEQUENCE_LENGTH = 80
"""LEAF's and the FedAvg paper's unroll length for Shakespeare."""
_INDEX = {c: i for i, c in enumerate(LEAF_CHARACTERS)}
# Typographic variants with an equivalent in the character set.
_VARIANTS = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"',
                           "\u201d": '"', "\u2013": "-", "\u2014": "-",
                           "\u00a0": " ", "\t": " "})


def normalize_text(text: str) -> str:
  """Typographic quotes and dashes to their ASCII forms; tabs and
  non-breaking spaces to spaces."""
  return text.translate(_VARIANTS)


def encode_characters(text: str, drop_unknown: bool = False
                      ) -> tuple[np.ndarray, int]:
  """Tokens of ``text`` in ``LEAF_CHARACTERS``. -> (int32 [len], dropped).

  Raises:
    ValueError: a character outside the set when ``drop_unknown`` is False
      (named, with its position).
  """
  if not isinstance(text, str):
    raise TypeError(f"text must be a str, got {type(text).__name__}")
  tokens = [_INDEX.get(c, -1) for c in text]
  tokens = np.asarray(tokens, np.int32)
  unknown = tokens < 0
  if unknown.any() and not drop_unknown:
    first = int(np.flatnonzero(unknown)[0])
    raise ValueError(f"character {text[first]!r} at position {first} is not "
                     "in LEAF's character set")
  return tokens[~unknown], int(unknown.sum())


def decode_characters(tokens) -> str:
  """The text of LEAF-character tokens (``PAD_TARGET`` skipped)."""
  return "".join(LEAF_CHARACTERS[int(t)] for t in np.asarray(tokens).ravel()
                 if t != PAD_TARGET)


def next_token_sequences(tokens, length: int = SEQUENCE_LENGTH,
                         pad_input: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """One token stream as next-token rows. -> (x [R, length], y [R, length]).

  Row ``r`` reads ``tokens[r*length : r*length + length]`` and its targets
  are ``tokens[r*length + 1 : r*length + length + 1]``; positions past the
  end hold ``pad_input`` / ``PAD_TARGET``. A stream of fewer than 2 tokens
  has nothing to predict and gives no rows.
  """
  tokens = np.asarray(tokens, np.int32)
  if tokens.ndim != 1:
    raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
  if isinstance(length, bool) or not isinstance(length, int) or length < 1:
    raise ValueError(f"length must be a positive int, got {length!r}")
  num_targets = tokens.size - 1
  if num_targets < 1:
    return (np.zeros((0, length), np.int32), np.zeros((0, length), np.int32))
  # ceil(targets / length): only the last row holds padding.
  rows = -(-num_targets // length)
  x = np.full((rows, length), pad_input, np.int32)
  y = np.full((rows, length), PAD_TARGET, np.int32)
  flat_x, flat_y = x.reshape(-1), y.reshape(-1)
  # Writing the flattened rows puts each row right after the previous one:
  # row r's last target is row r + 1's first input.
  flat_x[:num_targets] = tokens[:-1]
  flat_y[:num_targets] = tokens[1:]
  return x, y
