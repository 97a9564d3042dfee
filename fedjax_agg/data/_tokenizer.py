"""Hugging Face tokenizers, read from a ``tokenizer.json`` without network.

``load_tokenizer(path)`` reads the ``tokenizer.json`` a Hugging Face
checkpoint ships (GPT-2, Llama, ...) through the ``tokenizers`` package
(``Tokenizer.from_str``: the file is data, parsed by the package's Rust
code; nothing in it is run and nothing is downloaded). ``path`` is the file
or the checkpoint's folder holding it. A file that is missing, not UTF-8
JSON (``NaN`` and ``Infinity`` are not JSON either), or JSON that
``tokenizers`` does not read as a tokenizer is refused with a ``ValueError``
(``FileNotFoundError`` when missing) naming the file.

The end-of-sequence token. An instruction-tuned model learns to stop by
predicting it after each response. ``eos_token`` names it; when it is
None, the ``eos_token`` of a ``tokenizer_config.json`` beside the file is
taken, else the first of ``KNOWN_EOS_TOKENS`` the vocabulary holds, else
there is none (``Tokenizer.eos_id`` is None).

The beginning-of-sequence token. Some models (Llama) read one first: the
tokenizer's post-processor says so by prepending it to an encoded text
(``tokenizer.json``'s ``post_processor``). ``Tokenizer.bos_id`` is that
token (None when nothing is prepended); ``encode`` itself never adds
special tokens, and ``instruction_federation`` puts the BOS token before
each prompt.

``train_bpe`` trains a small byte-level BPE tokenizer on texts in memory
(deterministic: the same texts give the same tokenizer), for a model
trained from scratch or a test that needs a real tokenizer offline.
"""

import hashlib
import json
import os
import pathlib
from typing import Iterable, Optional, Union

import numpy as np

from fedjax_agg.types import PAD_TARGET

KNOWN_EOS_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>",
                    "<|im_end|>")
"""End-of-sequence tokens looked for when none is named: GPT-2's, Llama
1/2's and Mistral's, Llama 3's, Gemma's, Qwen's."""
PathLike = Union[str, os.PathLike]
"""A file or folder path."""
_FILE = "tokenizer.json"
_CONFIG = "tokenizer_config.json"


def _backend():
  try:
    import tokenizers  # pylint: disable=import-outside-toplevel
  except ImportError as error:
    raise ImportError("reading a tokenizer needs the tokenizers package: "
                      "pip install tokenizers") from error
  return tokenizers


def refuse_json_constant(name: str):
  """``json.loads``'s ``parse_constant``: NaN and Infinity are refused."""
  raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs):
  """``json.loads``'s ``object_pairs_hook``: a key given twice is refused
  (``json`` would keep the last value)."""
  out = {}
  for key, value in pairs:
    if key in out:
      raise ValueError(f"key {key!r} is given twice in one object")
    out[key] = value
  return out


def read_text(path: pathlib.Path, what: str) -> str:
  """The UTF-8 text of ``path`` (a byte order mark dropped);
  ``ValueError`` naming ``what`` and the file when it is not UTF-8."""
  try:
    # utf-8-sig drops a byte order mark, which some editors write.
    return path.read_bytes().decode("utf-8-sig")
  except UnicodeDecodeError as error:
    raise ValueError(f"{what} {path} is not UTF-8 text: {error}") from None


def parse_json(text: str, where: str, first_line: int = 1,
               unique_keys: bool = False):
  """The JSON value of ``text``; ``ValueError`` naming ``where`` and the
  line (counted from ``first_line``) and column when it is not JSON
  (``NaN`` and ``Infinity`` included), or, with ``unique_keys``, when an
  object gives a key twice."""
  try:
    return json.loads(text, parse_constant=refuse_json_constant,
                      object_pairs_hook=_unique_keys if unique_keys else None)
  except json.JSONDecodeError as error:
    raise ValueError(f"{where} is not valid JSON: {error.msg} at line "
                     f"{first_line + error.lineno - 1} column "
                     f"{error.colno}") from None
  except ValueError as error:
    raise ValueError(f"{where}: {error}") from None


def read_json(path: pathlib.Path, what: str, unique_keys: bool = False):
  """The JSON value in ``path`` (``read_text``, ``parse_json``), errors
  naming ``what`` and the file."""
  return parse_json(read_text(path, what), f"{what} {path}",
                    unique_keys=unique_keys)


class Tokenizer:
  """A Hugging Face tokenizer with the ids a training task needs.

  Attributes:
    backend: the ``tokenizers.Tokenizer``.
    source: where it came from (its file, or "memory").
    vocab_size: one more than the largest id (added tokens included): the
      output size of a model predicting its tokens.
    eos_token: the end-of-sequence token, or None.
    eos_id: its id, or None.
    bos_token: the token its post-processor prepends to a text, or None.
    bos_id: its id, or None.
    digest: the SHA-256 of its JSON serialisation.
  """

  def __init__(self, backend, eos_token: Optional[str] = None,
               source: str = "memory"):
    """Wraps ``backend`` (a ``tokenizers.Tokenizer``).

    Raises:
      ValueError: ``eos_token`` is not in its vocabulary (named).
    """
    if not isinstance(backend, _backend().Tokenizer):
      raise TypeError(f"backend must be a tokenizers.Tokenizer, got "
                      f"{type(backend).__name__}")
    vocabulary = backend.get_vocab(with_added_tokens=True)
    if not vocabulary:
      raise ValueError(f"tokenizer {source} has an empty vocabulary")
    if eos_token is not None and eos_token not in vocabulary:
      raise ValueError(f"eos_token {eos_token!r} is not in the vocabulary "
                       f"of tokenizer {source}")
    self.backend = backend
    self.source = source
    # One past the largest id, not the count: ids may have gaps, and every id
    # must be a valid output of the model.
    self.vocab_size = max(vocabulary.values()) + 1
    self.eos_token = eos_token
    self.eos_id = None if eos_token is None else vocabulary[eos_token]
    self.bos_token, self.bos_id = _prepended(backend)
    # The serialisation's hash names the exact tokenizer in provenance,
    # whatever file it came from.
    self.digest = hashlib.sha256(backend.to_str().encode()).hexdigest()

  def encode(self, text: str) -> np.ndarray:
    """The ids of ``text``, no special token added. -> int32 [n]."""
    if not isinstance(text, str):
      raise TypeError(f"text must be a str, got {type(text).__name__}")
    # No special tokens here: the caller places BOS and EOS, so a prompt and
    # its response can be tokenized apart.
    return np.asarray(self.backend.encode(text, add_special_tokens=False).ids,
                      np.int32)

  def decode(self, ids) -> str:
    """The text of ``ids`` (``PAD_TARGET`` skipped, special tokens kept)."""
    ids = [int(i) for i in np.asarray(ids).ravel() if i != PAD_TARGET]
    return self.backend.decode(ids, skip_special_tokens=False)

  def provenance(self) -> dict:
    """What it is, JSON-able: source, vocabulary size, EOS, digest."""
    return {"tokenizer": self.source, "vocab_size": self.vocab_size,
            "eos_token": self.eos_token, "bos_token": self.bos_token,
            "sha256": self.digest}

  def __repr__(self):
    return (f"Tokenizer({self.source}, vocab_size={self.vocab_size}, "
            f"eos_token={self.eos_token!r})")


def _prepended(backend) -> tuple[Optional[str], Optional[int]]:
  """(token, id) the post-processor puts before a text, or (None, None)."""
  # Found by encoding one character with and without special tokens, so no
  # post-processor format needs to be understood here.
  plain = backend.encode("a", add_special_tokens=False).ids
  full = backend.encode("a", add_special_tokens=True)
  if (len(full.ids) > len(plain) and full.special_tokens_mask[0]
      and full.ids[1:1 + len(plain)] == plain):
    return full.tokens[0], full.ids[0]
  return None, None


def _configured_eos(folder: pathlib.Path) -> Optional[str]:
  """The ``eos_token`` of ``folder/tokenizer_config.json``, if any."""
  path = folder / _CONFIG
  if not path.is_file():
    return None
  config = read_json(path, "tokenizer config")
  token = config.get("eos_token") if isinstance(config, dict) else None
  # Newer configs write special tokens as objects ({"content": ...}).
  if isinstance(token, dict):
    token = token.get("content")
  if token is not None and not isinstance(token, str):
    raise ValueError(f"tokenizer config {path}: eos_token must be a string "
                     f"or {{'content': string}}, got {token!r}")
  return token


def _default_eos(backend, folder: Optional[pathlib.Path]) -> Optional[str]:
  vocabulary = backend.get_vocab(with_added_tokens=True)
  configured = _configured_eos(folder) if folder is not None else None
  if configured is not None:
    return configured
  return next((t for t in KNOWN_EOS_TOKENS if t in vocabulary), None)


def load_tokenizer(path: PathLike, eos_token: Optional[str] = None
                   ) -> Tokenizer:
  """Reads a Hugging Face ``tokenizer.json``; never downloads.

  Args:
    path: the ``tokenizer.json`` file, or a folder holding one.
    eos_token: the end-of-sequence token; None: from a
      ``tokenizer_config.json`` beside it, else the first of
      ``KNOWN_EOS_TOKENS`` in the vocabulary, else none.

  Raises:
    FileNotFoundError: no such file (named).
    ValueError: the file is not UTF-8 JSON, not a tokenizer, or has no
      ``eos_token`` (each naming the file).
    ImportError: the ``tokenizers`` package is not installed.
  """
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"path must be a path, got {type(path).__name__}")
  path = pathlib.Path(path)
  if path.is_dir():
    path = path / _FILE
  if not path.is_file():
    raise FileNotFoundError(f"no tokenizer file {path}")
  # Parsed by Python's JSON reader first: NaN, a truncated file or text
  # that is not UTF-8 gets an error naming the file before the Rust parser
  # sees it.
  value = read_json(path, "tokenizer file")
  if not isinstance(value, dict) or "model" not in value:
    raise ValueError(f"tokenizer file {path} is JSON but not a tokenizer: "
                     "expected an object with a 'model' (the tokenizer.json "
                     "of a Hugging Face checkpoint)")
  tokenizers = _backend()
  try:
    backend = tokenizers.Tokenizer.from_str(json.dumps(value))
  except Exception as error:  # tokenizers raises a bare Exception.
    raise ValueError(f"tokenizer file {path} is not a tokenizer the "
                     f"tokenizers package reads: {error}") from None
  if eos_token is None:
    eos_token = _default_eos(backend, path.parent)
  return Tokenizer(backend, eos_token=eos_token, source=str(path))


def train_bpe(texts: Iterable[str], vocab_size: int = 512,
              eos_token: str = "<|endoftext|>") -> Tokenizer:
  """A byte-level BPE tokenizer trained on ``texts`` (GPT-2's scheme).

  Every byte is in its alphabet, so any text encodes; ``eos_token`` is its
  one special token (id 0). The same texts give the same tokenizer.

  Args:
    texts: the training texts.
    vocab_size: at most this many tokens (at least 257: the 256 bytes and
      the EOS token; fewer when the texts hold fewer merges).
    eos_token: the end-of-sequence token.
  """
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or (
      vocab_size < 257):
    raise ValueError(f"vocab_size must be an int >= 257 (256 bytes and the "
                     f"EOS token), got {vocab_size!r}")
  if not isinstance(eos_token, str) or not eos_token:
    raise ValueError(f"eos_token must be a non-empty str, got {eos_token!r}")
  texts = list(texts)
  bad = next((i for i, text in enumerate(texts) if not isinstance(text, str)),
             None)
  if bad is not None:
    raise TypeError(f"texts[{bad}] must be a str, got "
                    f"{type(texts[bad]).__name__}")
  tokenizers = _backend()
  byte_level = tokenizers.pre_tokenizers.ByteLevel
  backend = tokenizers.Tokenizer(tokenizers.models.BPE())
  backend.pre_tokenizer = byte_level(add_prefix_space=False)
  backend.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[eos_token],
      initial_alphabet=byte_level.alphabet(), show_progress=False)
  backend.train_from_iterator(texts, trainer=trainer)
  return Tokenizer(backend, eos_token=eos_token, source="train_bpe")
