"""The instruction-tuning task as a config's dataset ("instructions"):
the generated set or a records file in data_dir, a tokenizer trained on
the records or read from a file there, through the command line; file
names that leave data_dir are refused."""

import json

import numpy as np
import pytest

from fedjax_agg import cli
from fedjax_agg import data as data_lib
from fedjax_agg.types import PAD_TARGET


def _records(count):
  return [{"instruction": f"Add {i} and {i + 1}.", "input": "",
           "output": str(2 * i + 1),
           "category": "even" if i % 2 == 0 else "odd"}
          for i in range(count)]


def test_the_generated_set_is_a_sequence_federation():
  federation = data_lib.load_federation("instructions", num_clients=4,
                                        num_records=200)
  assert federation.task == "sequence" and federation.num_clients == 4
  assert federation.num_classes == 512  # the BPE trained on the records
  y = np.asarray(federation.federated().y)
  # Prompt positions are masked: every row scores fewer tokens than it has.
  assert (y == PAD_TARGET).any(axis=1).all()
  assert ((y != PAD_TARGET).sum(axis=1) > 0).all()


def test_a_records_file_and_a_tokenizer_file_are_read_from_data_dir(
    tmp_path):
  (tmp_path / "records.jsonl").write_text(
      "\n".join(json.dumps(r) for r in _records(60)))
  tokenizer = data_lib.train_bpe(["Add 1 and 2. 3"] * 4, vocab_size=300)
  tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
  federation = data_lib.load_federation(
      "instructions", data_dir=str(tmp_path), records="records.jsonl",
      tokenizer="tokenizer.json", split="category", sequence_length=512)
  assert federation.num_clients == 2  # one client per category
  assert federation.num_classes == tokenizer.vocab_size


@pytest.mark.parametrize("args, error, match", [
    ({"records": "../records.jsonl"}, ValueError, "inside data_dir"),
    ({"records": "/etc/passwd"}, ValueError, "inside data_dir"),
    ({"records": 3}, TypeError, "records must be a file name"),
    ({"records": "records.jsonl", "tokenizer": "../t.json"}, ValueError,
     "tokenizer '../t.json' must name a file inside data_dir"),
])
def test_file_names_that_leave_data_dir_are_refused(tmp_path, args, error,
                                                    match):
  (tmp_path / "records.jsonl").write_text(
      "\n".join(json.dumps(r) for r in _records(20)))
  with pytest.raises(error, match=match):
    data_lib.load_federation("instructions", data_dir=str(tmp_path),
                             **args)


def test_the_generated_set_reads_no_folder_and_a_file_needs_one(tmp_path):
  with pytest.raises(ValueError, match="reads no data_dir"):
    data_lib.load_federation("instructions", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="give the folder"):
    data_lib.load_federation("instructions", records="records.jsonl")


def test_the_command_line_runs_it_and_records_its_perplexity(tmp_path):
  config = {
      "dataset": {"name": "instructions",
                  "args": {"num_records": 200, "num_clients": 4,
                           "split": "dirichlet", "alpha": 0.5}},
      "partition": {"name": "natural", "num_clients": 4},
      "model": {"name": "transformer_lm",
                "args": {"width": 16, "depth": 1, "heads": 2,
                         "max_length": 128}},
      "train": {"rounds": 1, "participation": 0.5, "batch_size": 8,
                "learning_rate": 0.5, "eval_clients": False},
      "algorithms": {"FedAvg": {"aggregator": "fedavg"}}}
  path = tmp_path / "config.json"
  path.write_text(json.dumps(config))
  out = tmp_path / "run"
  assert cli.main(["--config", str(path), "--out", str(out),
                   "--no-progress"]) == 0
  rows = json.loads((out / "history.json").read_text())["rows"]
  for row in rows:
    np.testing.assert_allclose(row["test_perplexity"],
                               np.exp(row["test_loss"]), rtol=1e-6)
  record = json.loads((out / "config.json").read_text())
  assert record["dataset"]["args"]["split"] == "dirichlet"
  assert record["provenance"]["data"]["summary"]["task"] == "sequence"
