"""One description, one layout: the command line and ``run_config`` write
the same files through the one writer (``experiment.RunFolder``), with
the same histories, for one run, several seeds and several algorithms;
names that would collide with the run's own files are refused."""

import json
import os

import pytest

from fedjax_agg import cli
from fedjax_agg import experiment
from fedjax_agg import spec

CONFIG = {
    "name": "layout",
    "dataset": {"name": "mnist", "source": "mnist_5k",
                "max_train_examples": 400},
    "partition": {"name": "iid", "num_clients": 4},
    "model": {"name": "mlp2"},
    "train": {"rounds": 1, "participation": 0.5, "batch_size": 20,
              "eval_clients": False},
    "algorithms": {"FedAvg": {"aggregator": "fedavg"}},
}
RECORD = ".fedjax_agg-manifest.json"


def _files(folder) -> set[str]:
  return {os.path.relpath(os.path.join(root, name), folder)
          for root, _, names in os.walk(folder) for name in names
          if name != RECORD}


def _rows(folder, path) -> list:
  with open(os.path.join(folder, path)) as f:
    return [{key: row.get(key) for key in ("round", "test_accuracy",
                                            "test_loss", "train_loss")}
            for row in json.load(f)["rows"]]


def _both(tmp_path, config, argv=()):
  path = tmp_path / "config.json"
  path.write_text(json.dumps(config))
  by_cli, by_python = tmp_path / "cli", tmp_path / "python"
  assert cli.main(["--config", str(path), "--out", str(by_cli),
                   "--no-progress", *argv]) == 0
  experiment.run_config(config, str(by_python), progress=False)
  return by_cli, by_python


@pytest.mark.parametrize("changes, want", [
    ({}, {"history.csv", "history.json"}),
    ({"seeds": [0, 1]}, {"seed0/history.csv", "seed0/history.json",
                         "seed1/history.csv", "seed1/history.json",
                         "summary.csv"}),
    ({"algorithms": {"FedAvg": {"aggregator": "fedavg"},
                     "Median": {"aggregator": "fedmedian"}}},
     {"FedAvg/history.csv", "FedAvg/history.json", "Median/history.csv",
      "Median/history.json"}),
], ids=["one_run", "two_seeds", "two_algorithms"])
def test_the_command_line_and_run_config_write_one_layout(tmp_path, changes,
                                                          want):
  config = {**CONFIG, **changes}
  by_cli, by_python = _both(tmp_path, config)
  shared = {"config.json", "summary.json", "curves.png", "partition.png"}
  assert _files(by_cli) == _files(by_python) == want | shared
  # No checkpoint folder: an uninterrupted run keeps none.
  assert not any(path.is_dir() for path in by_cli.rglob("checkpoint*"))
  assert not any(path.is_dir() for path in by_python.rglob("checkpoint*"))
  for path in want:
    if path.endswith("history.json"):
      assert _rows(by_cli, path) == _rows(by_python, path), path
  for folder in (by_cli, by_python):
    with open(folder / "summary.json") as f:
      summary = json.load(f)
    assert set(summary["algorithms"]) == set(config["algorithms"])


def test_the_writer_says_where_every_file_goes():
  one = experiment.RunFolder("out", {"A": ["seed0"]})
  assert one.member_dir("A", "seed0") == "out"
  several = experiment.RunFolder("out", {"A": ["seed0", "seed1"],
                                         "B": ["seed0", "seed1"]})
  assert several.member_dir("B", "seed1") == os.path.join("out", "B",
                                                          "seed1")
  assert os.path.join("A", "summary.csv") in several.names()
  assert "history.csv" in one.names() and "summary.csv" not in one.names()
  with pytest.raises(ValueError, match="members"):
    experiment.RunFolder("out", {})
  with pytest.raises(ValueError, match="members"):
    experiment.RunFolder("out", {"A": []})


@pytest.mark.parametrize("name", ["config.json", "Curves.PNG",
                                  "checkpoints", "summary.csv",
                                  "history.json"])
def test_an_algorithm_named_like_the_runs_own_files_is_refused(name):
  config = {**CONFIG, "algorithms": {name: {"aggregator": "fedavg"},
                                     "B": {"aggregator": "fedavg"}}}
  with pytest.raises(spec.ConfigError, match="the run itself writes"):
    spec.Experiment.from_dict(config)


def test_a_saved_run_of_one_algorithm_is_found_in_either_layout(tmp_path):
  assert experiment.saved_algorithm_dir(str(tmp_path), "A", ["A"]) == str(
      tmp_path)
  (tmp_path / "A").mkdir()  # a run written in the nested layout
  assert experiment.saved_algorithm_dir(str(tmp_path), "A", ["A"]) == str(
      tmp_path / "A")
  assert experiment.saved_algorithm_dir(str(tmp_path), "B", ["A", "B"]) == (
      str(tmp_path / "B"))
