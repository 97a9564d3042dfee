"""The tiny Hugging Face checkpoints of the pre-trained model tests
(made by ``pretrained_fixtures/make_fixtures.py``, transformers' logits
beside each)."""

import pathlib
import shutil

import numpy as np

FIXTURES = pathlib.Path(__file__).parent / "pretrained_fixtures"
FLOAT32 = ("gpt2", "llama_gqa", "llama_tied", "qwen2", "mistral",
           "llama_sharded")


def folder(name: str) -> pathlib.Path:
  """The fixture checkpoint ``name``'s folder."""
  return FIXTURES / name


def golden(name: str) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [2, 12] int32, transformers' logits [2, 12, 64])."""
  saved = np.load(FIXTURES / name / "golden.npz")
  return saved["tokens"].astype(np.int32), saved["logits"]


def copy(name: str, tmp_path: pathlib.Path) -> pathlib.Path:
  """A copy of the fixture ``name`` to spoil."""
  target = tmp_path / name
  shutil.copytree(FIXTURES / name, target)
  return target
