"""Shared inputs of the instruction-tuning tests: a short template, a
small generated record set and a byte-level BPE tokenizer trained on it
(built once per process, offline)."""

import functools

import pytest

from fedjax_agg import data

TEMPLATE = "Q: {instruction}\n{input}\nA: {output}"
"""A short template, so rows stay short."""
EOS = "<|endoftext|>"

# A word-level tokenizer.json written by hand: its ids are known without
# running the tokenizers package.
WORD_LEVEL = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [], "normalizer": None,
    "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "unk_token": "[UNK]",
              "vocab": {"[UNK]": 0, "hello": 1, "world": 2, "</s>": 3,
                        "again": 7}}}
# The same with Llama's post-processor: "<s>" before every text.
PREPEND = {"type": "TemplateProcessing",
           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}}],
           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"Sequence": {"id": "B", "type_id": 1}}],
           "special_tokens": {"<s>": {"id": "<s>", "ids": [4],
                                      "tokens": ["<s>"]}}}
WITH_BOS = dict(
    WORD_LEVEL, post_processor=PREPEND,
    model=dict(WORD_LEVEL["model"],
               vocab=dict(WORD_LEVEL["model"]["vocab"], **{"<s>": 4})))


@functools.cache
def records(num_records: int = 120, seed: int = 0) -> tuple:
  """Generated records (a tuple: cached values must not be edited)."""
  return tuple(data.generated_instructions(num_records, seed=seed))


@functools.cache
def tokenizer() -> data.Tokenizer:
  """A 320-token byte-level BPE trained on ``records()`` in ``TEMPLATE``."""
  template = data.parse_template(TEMPLATE)
  texts = ["".join(data.render(record, template)) for record in records()]
  return data.train_bpe(texts, vocab_size=320, eos_token=EOS)


def assert_refused_naming_file(read, path, content: bytes, message: str):
  """``read(path)`` of a file holding ``content`` raises a ValueError
  matching ``message`` that names the file."""
  path.write_bytes(content)
  with pytest.raises(ValueError, match=message) as caught:
    read(path)
  assert str(path) in str(caught.value)
