"""Config-driven runs: summary numbers come from the saved runs, the files
a run writes, the checks before the data, FedDRL's warning.
"""

import json
import os

import numpy as np
import pandas as pd
import pytest

from fedjax_agg import data as data_lib
from fedjax_agg import experiment
from fedjax_agg import spec
from fedjax_agg.experiment import _runs
from tests.experiment._util import CONFIG


@pytest.fixture(scope="module")
def has_fashion():
  try:
    data_lib.load("fashion_mnist", source="files")
  except data_lib.DatasetNotFoundError as e:
    pytest.skip(f"Fashion-MNIST files not installed: {e}")


def test_run_config_summary_matches_saved_histories(has_fashion, tmp_path):
  del has_fashion
  summary = experiment.run_config(CONFIG, str(tmp_path), progress=False)
  assert set(summary) == {"FedAvg", "FedProx", "FedAdp"}
  for name, entry in summary.items():
    finals = [pd.read_csv(tmp_path / name / f"seed{s}" / "history.csv")[
        "test_accuracy"].iloc[-1] for s in (0, 1)]
    # The one layout: a member folder per seed, the run's summary.csv.
    assert pd.read_csv(tmp_path / name / "summary.csv")[
        "final_test_accuracy_mean"].iloc[0] == pytest.approx(np.mean(finals))
    np.testing.assert_allclose(entry["final_test_accuracy"], finals)
    np.testing.assert_allclose(entry["final_test_accuracy_mean"],
                               np.mean(finals))
    assert entry["reached_target"].endswith("/2")
  for name in ("summary.json", "curves.png", "partition.png", "config.json"):
    assert os.path.getsize(tmp_path / name) > 0
  with open(tmp_path / "summary.json") as f:
    assert json.load(f)["name"] == "tiny"


def test_run_algorithm_aggregator_argument_replaces_the_spec(has_fashion):
  del has_fashion
  from fedjax_agg import aggregators  # pylint: disable=g-import-not-at-top
  config = experiment.override(
      CONFIG, {"train.rounds": 1, "train.participation": 1.0,
               "partition.name": "shards_non_equal"})
  config["algorithms"]["Uniform"] = {
      "aggregator": "fedavg", "aggregator_args": {"weighting": "uniform"}}
  prepared = experiment.prepare_data(config, 0)
  spec_run = experiment.run_algorithm(config, "Uniform", 0, prepared)
  given = experiment.run_algorithm(
      config, "FedAvg", 0, prepared,
      aggregator=aggregators.get("fedavg", weighting="uniform"))
  default = experiment.run_algorithm(config, "FedAvg", 0, prepared)
  np.testing.assert_allclose(given.history.column("test_accuracy"),
                             spec_run.history.column("test_accuracy"))
  # Clients of unequal sizes: example weighting differs from uniform.
  assert not np.allclose(
      np.asarray(given.history.column("test_loss")),
      np.asarray(default.history.column("test_loss")))


MNIST_5K = experiment.override(CONFIG, {
    "name": "tiny5k", "dataset": {"name": "mnist", "source": "mnist_5k",
                                  "max_train_examples": 400},
    "partition.num_clients": 4, "train.rounds": 1, "seeds": [0],
    "algorithms": {"FedAdp": {"aggregator": "fedadp"}}})


def test_run_config_writes_strict_json_and_the_resolved_config(tmp_path):
  summary = experiment.run_config(MNIST_5K, str(tmp_path), progress=False)
  assert set(summary) == {"FedAdp"}

  def refuse(token):
    raise ValueError(f"not JSON: {token}")
  with open(tmp_path / "summary.json") as f:
    assert json.load(f, parse_constant=refuse)["name"] == "tiny5k"
  with open(tmp_path / "config.json") as f:
    record = json.load(f, parse_constant=refuse)
  experiment.check_config(record)
  assert record["train"]["participation"] == 0.5
  provenance = record["provenance"]
  assert provenance["data"]["source"] == "mnist_5k"
  assert provenance["data"]["clients_by_seed"]["0"]["num_clients"] == 4
  assert provenance["algorithms"]["FedAdp"]["aggregator_args"][
      "learning_rate"] == 0.1  # the client rate the runner gives FedAdp
  assert provenance["environment"]["versions"]["jax"]
  assert os.path.getsize(tmp_path / "curves.png") > 0


def test_run_config_checks_the_output_folder_before_the_data(tmp_path,
                                                             monkeypatch):
  def never(config):
    raise AssertionError("the data must not be read")
  # run_config looks the name up in its own submodule.
  monkeypatch.setattr(_runs, "load_dataset", never)
  # One algorithm: its member folder is the run's (the one layout).
  (tmp_path / "history.csv").mkdir()
  with pytest.raises(ValueError, match="history.csv is a directory"):
    experiment.run_config(MNIST_5K, str(tmp_path), progress=False)
  with pytest.raises(ValueError, match="algorithms \\['Nope'\\]"):
    experiment.run_config(MNIST_5K, str(tmp_path), algorithms=["Nope"])


def test_a_feddrl_run_too_short_for_its_agent_says_so():
  config = experiment.override(MNIST_5K, {
      "algorithms": {"D": {"aggregator": "feddrl"},
                     "Long": {"aggregator": "feddrl",
                              "aggregator_args": {"updates_per_round": 20}},
                     "A": {"aggregator": "fedavg"}},
      "train.rounds": 20})
  with pytest.warns(UserWarning, match="19 learning steps in 20 rounds"):
    experiment.warn_short_feddrl(config, "D")
  assert experiment.warn_short_feddrl(config, "Long") is None  # 380 steps
  assert experiment.warn_short_feddrl(config, "A") is None


def test_run_algorithm_checks_the_config_before_running():
  # A privacy block beside rules that add no noise would be ignored by the
  # build; run_algorithm refuses it as run_config does.
  config = {**MNIST_5K, "privacy": {"delta": 1e-5}}
  with pytest.raises(spec.ConfigError,
                     match="adds no calibrated Gaussian noise"):
    experiment.run_algorithm(config, "FedAdp", seed=0)
  with pytest.raises(spec.ConfigError, match="train.rounds"):
    experiment.run_algorithm(experiment.override(
        MNIST_5K, {"train.rounds": -1}), "FedAdp", seed=0)
