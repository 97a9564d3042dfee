"""Config-driven experiments: summary numbers come from the saved runs."""

import json
import os

import jax
import numpy as np
import pandas as pd
import pytest

from fedjax_agg import data as data_lib
from fedjax_agg import experiment
from fedjax_agg.experiment import _runs

CONFIG = {
    "name": "tiny",
    "dataset": {"name": "fashion_mnist", "source": "files",
                "max_train_examples": 1200, "max_test_examples": 500},
    "partition": {"name": "shards", "num_clients": 6},
    "model": {"name": "mlp2", "args": {"hidden": 32}},
    "train": {"rounds": 2, "participation": 0.5, "batch_size": 20,
              "learning_rate": 0.1, "eval_clients": False},
    "algorithms": {
        "FedAvg": {"aggregator": "fedavg"},
        "FedProx": {"aggregator": "fedavg", "objective": "fedprox",
                    "objective_args": {"mu": 0.1}},
        "FedAdp": {"aggregator": "fedadp"},
    },
    "seeds": [0, 1],
    "target_accuracy": 0.3,
}


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


def test_override_and_bad_configs_are_named():
  changed = experiment.override(CONFIG, {"train.rounds": 7})
  assert changed["train"]["rounds"] == 7 and CONFIG["train"]["rounds"] == 2
  bad = experiment.override(CONFIG, {"algorithms.FedAvg.aggregator": "nope"})
  with pytest.raises(ValueError, match="algorithms.FedAvg.aggregator"):
    experiment.check_config(bad)
  with pytest.raises(ValueError, match=r"^train\.lr: unknown key; allowed: "
                     r"\[.*'learning_rate'"):
    experiment.check_config(experiment.override(CONFIG, {"train.lr": 1}))
  # Not a recipe: a describing helper of the same module, or a private one.
  for name in ("nope", "summary", "plot_heatmap", "_finish"):
    with pytest.raises(ValueError, match="partition.name"):
      experiment.check_config(
          experiment.override(CONFIG, {"partition.name": name}))


def test_script_flags_resolve_config_overrides_and_output(tmp_path,
                                                         monkeypatch):
  # script_config sets XLA_FLAGS (--cpu-devices); restored after the test.
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
  script_dir = tmp_path / "paper"
  (script_dir / "configs").mkdir(parents=True)
  for name in ("fig1", "fig1_full"):
    with open(script_dir / "configs" / f"{name}.json", "w") as f:
      json.dump({**CONFIG, "name": name}, f)
  parser = experiment.script_parser("paper")
  args = parser.parse_args(["--config", "configs/fig1.json", "--full",
                            "--set", "train.rounds=5", "--set",
                            "seeds=[3, 4]", "--set", "dataset.source=files",
                            "--algorithms", "FedAvg,FedProx"])
  config, out_dir, names = experiment.script_config(args, str(script_dir))
  assert config["name"] == "fig1_full"
  assert config["train"]["rounds"] == 5 and config["seeds"] == [3, 4]
  assert config["dataset"]["source"] == "files"
  assert out_dir == str(script_dir / "results" / "fig1_full")
  assert names == ["FedAvg", "FedProx"]
  with pytest.raises(ValueError, match="--algorithms"):
    experiment.script_config(parser.parse_args(
        ["--config", "configs/fig1.json", "--algorithms", "Nope"]),
        str(script_dir))
  with pytest.raises(ValueError, match="--config"):
    experiment.config_path("configs/missing.json", False, str(script_dir))
  with pytest.raises(ValueError, match="--set"):
    experiment.parse_sets(["train.rounds"])
  # --cpu-devices is applied before the config is read; JAX has started
  # here, so only its current device count is accepted.
  started = len(jax.devices("cpu"))
  config, _, _ = experiment.script_config(parser.parse_args(
      ["--config", "configs/fig1.json", "--cpu-devices", str(started)]),
      str(script_dir))
  assert config["name"] == "fig1"
  for bad in ("0", str(started + 1)):
    with pytest.raises(ValueError, match="--cpu-devices"):
      experiment.script_config(parser.parse_args(
          ["--config", "configs/fig1.json", "--cpu-devices", bad]),
          str(script_dir))


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
  (tmp_path / "FedAdp").write_text("")  # the FedAdp run's folder
  with pytest.raises(ValueError, match="FedAdp is a file"):
    experiment.run_config(MNIST_5K, str(tmp_path), progress=False)
  with pytest.raises(ValueError, match="algorithms \\['Nope'\\]"):
    experiment.run_config(MNIST_5K, str(tmp_path), algorithms=["Nope"])


def test_a_feddrl_run_too_short_for_its_agent_says_so():
  config = {"algorithms": {"D": {"aggregator": "feddrl"},
                           "Long": {"aggregator": "feddrl",
                                    "aggregator_args": {
                                        "updates_per_round": 20}},
                           "A": {"aggregator": "fedavg"}},
            "train": {"rounds": 20}}
  with pytest.warns(UserWarning, match="19 learning steps in 20 rounds"):
    experiment.warn_short_feddrl(config, "D")
  assert experiment.warn_short_feddrl(config, "Long") is None  # 380 steps
  assert experiment.warn_short_feddrl(config, "A") is None


def test_full_scale_configs_never_run_on_the_subset():
  from fedjax_agg import data as data_lib
  config = {"dataset": {"name": "mnist", "source": "mnist_5k",
                        "allow_subset": False}}
  with pytest.raises(data_lib.DatasetNotFoundError, match="subset"):
    experiment.load_dataset(config)
  full = {"name": "x", "dataset": {"name": "mnist", "source": "mnist_5k",
                                   "allow_subset": False},
          "partition": {"name": "iid", "num_clients": 4},
          "model": {"name": "mlp2"},
          "algorithms": {"FedAvg": {"aggregator": "fedavg"}}}
  with pytest.raises(experiment.ConfigError, match="allow_subset"):
    experiment.check_config(full)
  dataset = experiment.load_dataset({"dataset": {"name": "mnist",
                                                 "source": "mnist_5k"}})
  described = experiment.describe_data(
      {**full, "dataset": {"name": "mnist", "source": "mnist_5k"}},
      dataset, [0])
  assert described["subset"] is True and described["source"] == "mnist_5k"
  import glob
  import json
  import os
  here = os.path.dirname(os.path.dirname(
      os.path.dirname(os.path.abspath(__file__))))
  for path in glob.glob(os.path.join(here, "experiments", "*", "configs",
                                     "*_full.json")):
    with open(path) as f:
      assert json.load(f)["dataset"]["allow_subset"] is False, path


def test_records_show_paths_inside_the_repository_relative(tmp_path):
  import os
  root = os.path.dirname(os.path.dirname(
      os.path.dirname(os.path.abspath(__file__))))
  inside = os.path.join(root, "experiments", "x", "results")
  assert experiment.shown_path(inside) == os.path.join("experiments", "x",
                                                       "results")
  assert experiment.shown_path(str(tmp_path)) == str(tmp_path)


def test_a_config_client_side_is_the_run_with_that_local_update():
  """A config naming a client side (Ditto, with personalised evaluation on
  a held-out split) runs what simulation.run does with that client built
  by hand on the same split."""
  from fedjax_agg import clients  # pylint: disable=g-import-not-at-top
  from fedjax_agg import federated  # pylint: disable=g-import-not-at-top
  from fedjax_agg import models  # pylint: disable=g-import-not-at-top
  from fedjax_agg import partitions  # pylint: disable=g-import-not-at-top
  from fedjax_agg import aggregators  # pylint: disable=g-import-not-at-top
  from fedjax_agg import simulation  # pylint: disable=g-import-not-at-top
  from fedjax_agg import validation  # pylint: disable=g-import-not-at-top
  from fedjax_agg.config import (  # pylint: disable=g-import-not-at-top
      Evaluation, Execution, LocalTraining)
  config = {
      "dataset": {"name": "mnist", "source": "mnist_5k"},
      "partition": {"name": "dirichlet", "num_clients": 4,
                    "args": {"alpha": 0.5}, "holdout_fraction": 0.25},
      "model": {"name": "mlp2", "args": {"hidden": 8}},
      "train": {"rounds": 2, "participation": 0.5, "batch_size": 50,
                "learning_rate": 0.1, "personalized": True,
                "finetune_steps": 1},
      "algorithms": {"Ditto": {"aggregator": "fedavg", "client": "ditto",
                               "client_args": {"lam": 0.5}}}}
  seed = 3
  got = experiment.run_algorithm(config, "Ditto", seed).history
  dataset = data_lib.load("mnist", source="mnist_5k")
  parts = partitions.REGISTRY.build(
      "dirichlet", labels=dataset.train_y, num_clients=4, seed=seed,
      alpha=0.5)
  full = federated.from_partition(dataset.train_x, dataset.train_y, parts)
  train, held = validation.holdout_split(full, 0.25, seed=seed)
  model = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1),
                     hidden=8)
  training = LocalTraining(batch_size=50, learning_rate=0.1)
  want = simulation.run(
      model, train.with_validation(held), (dataset.test_x, dataset.test_y),
      aggregators.fedavg(), num_rounds=2, participation=0.5,
      training=training, execution=Execution(progress=False),
      evaluation=Evaluation(personalized=True, finetune_steps=1),
      local_update=clients.ditto(model, training, lam=0.5),
      seed=seed).history
  for column in ("test_accuracy", "test_loss", "personal_accuracy_mean",
                 "finetuned_accuracy_mean", "global_accuracy_mean"):
    np.testing.assert_allclose(got.column(column), want.column(column),
                               rtol=1e-5, err_msg=column)
  assert got.config["train.personalized"] is True
