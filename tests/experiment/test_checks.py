"""Experiment configs are checked key by key before anything runs."""

import glob
import json
import math
import os
import re

import pytest

from fedjax_agg import experiment
from fedjax_agg import spec

CONFIG = {
    "name": "tiny",
    "dataset": {"name": "mnist", "source": "mnist_5k",
                "max_train_examples": 400},
    "partition": {"name": "shards", "num_clients": 4,
                  "args": {"shards_per_client": 2}},
    "model": {"name": "mlp2", "args": {"hidden": 16}},
    "train": {"rounds": 1, "participation": 0.5, "batch_size": 20,
              "learning_rate": 0.1},
    "algorithms": {
        "FedAvg": {"aggregator": "fedavg"},
        "FedAdp": {"aggregator": "fedadp", "aggregator_args": {"alpha": 5.0}},
        "FedProx": {"aggregator": "fedavg", "objective": "fedprox",
                    "objective_args": {"mu": 0.1}},
    },
    "seeds": [0, 1],
    "target_accuracy": 0.5,
}
NAN, INF = math.nan, math.inf

# (overrides of CONFIG, the error's type, the key path it names).
BAD = [
    ({"early_stopping": {"patince": 3}}, ValueError,
     "early_stopping.patince"),
    ({"early_stopping": {"patience": 0}}, ValueError,
     "early_stopping.patience"),
    ({"early_stopping": {"mode": "up"}}, ValueError, "early_stopping.mode"),
    ({"early_stopping": {"min_delta": NAN}}, ValueError,
     "early_stopping.min_delta"),
    ({"early_stopping": {"metric": 3}}, TypeError,
     "early_stopping.metric"),
    ({"early_stopping": [1]}, TypeError, "early_stopping"),
    ({"datset": {}}, ValueError, "datset"),
    ({"name": 3}, TypeError, "name"),
    ({"train": [1]}, TypeError, "train"),
    ({"dataset.nme": "mnist"}, ValueError, "dataset.nme"),
    ({"dataset.name": "mnits"}, ValueError, "dataset.name"),
    ({"dataset.source": "web"}, ValueError, "dataset.source"),
    ({"dataset.name": "cifar10"}, ValueError, "dataset.source"),
    ({"dataset.max_train_examples": 0}, ValueError,
     "dataset.max_train_examples"),
    ({"dataset.max_test_examples": 10.5}, TypeError,
     "dataset.max_test_examples"),
    ({"dataset.standardize": "yes"}, TypeError, "dataset.standardize"),
    ({"dataset.data_dir": 3}, TypeError, "dataset.data_dir"),
    ({"partition.num_client": 4}, ValueError, "partition.num_client"),
    ({"partition.name": "plot_heatmap"}, ValueError, "partition.name"),
    ({"partition.num_clients": 0}, ValueError, "partition.num_clients"),
    ({"partition.num_clients": 2.5}, TypeError, "partition.num_clients"),
    ({"partition.seed_offset": -1}, ValueError, "partition.seed_offset"),
    ({"partition.args": [2]}, TypeError, "partition.args"),
    ({"partition.args.shard_per_client": 2}, ValueError,
     "partition.args.shard_per_client"),
    ({"partition.args.seed": 2}, ValueError, "partition.args.seed"),
    ({"partition.name": "mixed_iid", "partition.args": {}}, ValueError,
     "partition.args.num_iid"),
    ({"model.arg": {}}, ValueError, "model.arg"),
    ({"model.name": "resnet"}, ValueError, "model.name"),
    ({"model.args.hiden": 16}, ValueError, "model.args.hiden"),
    ({"model.args.conv_impl": "fast"}, ValueError, "model.args.conv_impl"),
    ({"train.learning_rte": 0.1}, ValueError, "train.learning_rte"),
    ({"train.rounds": -2}, ValueError, "train.rounds"),
    ({"train.rounds": 2.0}, TypeError, "train.rounds"),
    ({"train.rounds": True}, TypeError, "train.rounds"),
    ({"train.participation": "0.5"}, TypeError, "train.participation"),
    ({"train.participation": 0}, ValueError, "train.participation"),
    ({"train.participation": 1.5}, ValueError, "train.participation"),
    ({"train.participation": NAN}, ValueError, "train.participation"),
    ({"train.participation": [0.5]}, TypeError, "train.participation"),
    ({"train.learning_rate": NAN}, ValueError, "train.learning_rate"),
    ({"train.learning_rate": INF}, ValueError, "train.learning_rate"),
    ({"train.learning_rate": -0.1}, ValueError, "train.learning_rate"),
    ({"train.learning_rate": None}, TypeError, "train.learning_rate"),
    ({"train.momentum": 1.0}, ValueError, "train.momentum"),
    ({"train.momentum": -0.1}, ValueError, "train.momentum"),
    ({"train.batch_size": 0}, ValueError, "train.batch_size"),
    ({"train.local_epochs": 0}, ValueError, "train.local_epochs"),
    ({"train.stragglers": 1.5}, ValueError, "train.stragglers"),
    ({"train.straggler_unit": "step"}, ValueError, "train.straggler_unit"),
    ({"train.straggler_unit": 1}, ValueError, "train.straggler_unit"),
    ({"train.eval_every": 0}, ValueError, "train.eval_every"),
    ({"train.eval_clients": "no"}, TypeError, "train.eval_clients"),
    ({"train.clients_per_step": 0}, ValueError, "train.clients_per_step"),
    ({"train.devices": 0}, ValueError, "train.devices"),
    ({"train.compute_losses": "sometimes"}, TypeError,
     "train.compute_losses"),
    ({"seeds": [-1]}, ValueError, "seeds[0]"),
    ({"seeds": [0, "1"]}, TypeError, "seeds[1]"),
    ({"seeds": []}, TypeError, "seeds"),
    ({"seeds": 3}, TypeError, "seeds"),
    ({"seeds": [1, 1]}, ValueError, "seeds"),
    ({"target_accuracy": 1.5}, ValueError, "target_accuracy"),
    ({"vmap_seeds": "yes"}, TypeError, "vmap_seeds"),
    ({"algorithms": {}}, ValueError, "algorithms"),
    ({"algorithms.FedAvg": "fedavg"}, TypeError, "algorithms.FedAvg"),
    ({"algorithms.FedAvg.aggregator": "fedavgg"}, ValueError,
     "algorithms.FedAvg.aggregator"),
    ({"algorithms.FedAvg.objective": "mse"}, ValueError,
     "algorithms.FedAvg.objective"),
    ({"algorithms.FedAdp.aggregator_arg": {"alpha": 1.0}}, ValueError,
     "algorithms.FedAdp.aggregator_arg"),
    ({"algorithms.FedAdp.aggregator_args.alpah": 1.0}, ValueError,
     "algorithms.FedAdp.aggregator_args.alpah"),
    ({"algorithms.FedAdp.aggregator_args.num_clients": 4}, ValueError,
     "algorithms.FedAdp.aggregator_args.num_clients"),
    ({"algorithms.FedAdp.aggregator_args.alpha": "abc"}, TypeError,
     "algorithms.FedAdp.aggregator_args"),
    ({"algorithms.FedAdp.aggregator_args.alpha": -1.0}, ValueError,
     "algorithms.FedAdp.aggregator_args"),
    ({"algorithms.FedProx.objective_args.nu": 0.1}, ValueError,
     "algorithms.FedProx.objective_args.nu"),
    ({"algorithms.FedProx.objective_args.mu": "x"}, TypeError,
     "algorithms.FedProx.objective_args"),
    ({"algorithms.FedAvg.train.lr": 0.1}, ValueError,
     "algorithms.FedAvg.train.lr"),
    ({"algorithms.FedAvg.train.learning_rate": 0}, ValueError,
     "algorithms.FedAvg.train.learning_rate"),
    # Bulyan needs a cohort of 4 num_byzantine + 3: this one draws 2.
    ({"algorithms.FedAvg.aggregator": "bulyan"}, ValueError,
     "algorithms.FedAvg.aggregator_args"),
    ({"algorithms.FedAvg.aggregator": "qffl",
      "algorithms.FedAvg.aggregator_args": {"q": -1.0}}, ValueError,
     "algorithms.FedAvg.aggregator_args"),
    ({"algorithms.FedAvg.aggregator": "qffl",
      "algorithms.FedAvg.aggregator_args": {"lipschitz": 0.0}}, ValueError,
     "algorithms.FedAvg.aggregator_args"),
    # Client sides and what needs them.
    ({"algorithms.FedAvg.client": "dito"}, ValueError,
     "algorithms.FedAvg.client"),
    ({"algorithms.FedAvg.client": "ditto",
      "algorithms.FedAvg.client_args": {"lamda": 0.5}}, ValueError,
     "algorithms.FedAvg.client_args.lamda"),
    ({"algorithms.FedAvg.client_args": {"lam": 0.5}}, ValueError,
     "algorithms.FedAvg.client_args"),
    ({"algorithms.FedAvg.client": "ditto",
      "algorithms.FedAvg.client_args": [1]}, TypeError,
     "algorithms.FedAvg.client_args"),
    ({"algorithms.FedProx.client": "scaffold"}, ValueError,
     "algorithms.FedProx.objective"),
    ({"algorithms.FedProx.client": "feddyn",
      "algorithms.FedProx.aggregator": "feddyn"}, ValueError,
     "algorithms.FedProx.objective"),
    # FedDyn's client and rule come as a pair sharing alpha.
    ({"algorithms.FedAvg.client": "feddyn"}, ValueError,
     "algorithms.FedAvg.aggregator"),
    ({"algorithms.FedAvg.client": "feddyn",
      "algorithms.FedAvg.aggregator": "feddyn",
      "algorithms.FedAvg.client_args": {"alpha": 0.1}}, ValueError,
     "algorithms.FedAvg.client_args.alpha"),
    ({"algorithms.FedAvg.aggregator": "fednova",
      "algorithms.FedAvg.aggregator_args": {"momentum": 1.0}}, ValueError,
     "algorithms.FedAvg.aggregator_args"),
    ({"algorithms.FedAvg.client": "fedbn", "attack": {"name": "sign_flip"}},
     ValueError, "attack"),
    ({"train.personalized": True, "partition.holdout_fraction": 0.2},
     ValueError, "train.personalized"),
    ({"algorithms.FedAvg.train": {"personalized": True},
      "partition.holdout_fraction": 0.2}, ValueError,
     "algorithms.FedAvg.train.personalized"),
    ({"train.personalized": "yes"}, TypeError, "train.personalized"),
    ({"train.finetune_steps": 2}, ValueError, "partition.holdout_fraction"),
    ({"train.finetune_steps": -1}, ValueError, "train.finetune_steps"),
    ({"partition.holdout_fraction": 1.0}, ValueError,
     "partition.holdout_fraction"),
    ({"partition.holdout_fraction": NAN}, ValueError,
     "partition.holdout_fraction"),
    ({"algorithms.FedAvg.model_args": {"hiden": 3}}, ValueError,
     "algorithms.FedAvg.model_args.hiden"),
    # momentum forwards **kwargs to fednnnn: checked when it is built.
    ({"algorithms.FedAvg.aggregator": "momentum",
      "algorithms.FedAvg.aggregator_args": {"gama": 0.5}}, TypeError,
     "algorithms.FedAvg.aggregator_args"),
]


@pytest.mark.parametrize("overrides,error,path", BAD,
                         ids=[" ".join(map(str, case[0])) for case in BAD])
def test_bad_configs_name_the_key_path(overrides, error, path):
  config = experiment.override(CONFIG, overrides)
  with pytest.raises(error) as raised:
    experiment.check_config(config)
  assert isinstance(raised.value, spec.ConfigError)
  assert raised.value.path == path
  assert path in str(raised.value)
  if "unknown key" in str(raised.value):
    # The allowed keys follow, after the closest of them where one is.
    assert re.match(rf"{re.escape(path)}: unknown key( \(did you mean "
                    r"'\w+'( or '\w+')?\?\))?; allowed: \[",
                    str(raised.value)), str(raised.value)


def test_missing_sections_are_named():
  for key in ("dataset", "partition", "model", "algorithms"):
    config = {k: v for k, v in CONFIG.items() if k != key}
    with pytest.raises(ValueError, match=f"must have a '{key}' entry"):
      experiment.check_config(config)


def test_good_config_and_its_resolution_pass():
  experiment.check_config(CONFIG)
  resolved = experiment.check_config(CONFIG).to_dict()
  experiment.check_config(resolved)
  assert experiment.check_config(resolved).to_dict() == resolved
  assert resolved["train"]["momentum"] == 0.0  # a default written out
  assert resolved["dataset"]["standardize"] is False
  assert resolved["partition"]["args"] == {"shards_per_client": 2}
  fedadp = resolved["algorithms"]["FedAdp"]["aggregator_args"]
  assert fedadp["alpha"] == 5.0 and fedadp["smoothing"] == "participation"
  # The runner fills in the client learning rate: not frozen in the config.
  assert "learning_rate" not in fedadp
  checked = experiment.check_config(CONFIG)
  aggregator_args, objective_args = checked.rule_arguments("FedAdp")
  assert aggregator_args["learning_rate"] == 0.1
  assert objective_args == {}
  assert checked.rule_arguments("FedProx")[1] == {"mu": 0.1}


def test_bulyan_and_qffl_take_the_cohort_and_client_rate_of_the_run():
  config = experiment.override(CONFIG, {
      "partition.num_clients": 20,
      "algorithms": {
          "Bulyan": {"aggregator": "bulyan",
                     "aggregator_args": {"num_byzantine": 1}},
          "qFFL": {"aggregator": "qffl", "aggregator_args": {"q": 5.0}}}})
  experiment.check_config(config)
  # 10 clients per round: the bound 4 f + 3 = 7 holds for f = 1, not 2.
  assert experiment.check_config(config).rule_arguments("Bulyan")[0] == {
      "num_byzantine": 1, "num_participants": 10}
  with pytest.raises(ValueError, match=r"4 num_byzantine \+ 3 = 11"):
    experiment.check_config(experiment.override(
        config, {"algorithms.Bulyan.aggregator_args.num_byzantine": 2}))
  # L = 1 / the client learning rate, filled in by the runner.
  assert experiment.check_config(config).rule_arguments("qFFL")[0] == {
      "q": 5.0, "lipschitz": None, "learning_rate": 0.1}
  resolved = experiment.check_config(config).to_dict()
  experiment.check_config(resolved)
  assert resolved["algorithms"]["Bulyan"]["aggregator_args"] == {
      "num_byzantine": 1}
  assert resolved["algorithms"]["qFFL"]["aggregator_args"] == {
      "q": 5.0, "lipschitz": None}


def test_experiment_configs_pass():
  """The paper configs run through ``experiment`` (ADCT's script has its
  own format and checks)."""
  root = os.path.join(os.path.dirname(__file__), "..", "..", "experiments")
  paths = [p for p in glob.glob(os.path.join(root, "*", "configs", "*.json"))
           if os.sep + "adct" + os.sep not in p]
  assert paths
  for path in paths:
    with open(path) as f:
      config = json.load(f)
    experiment.check_config(config)
    experiment.check_config(experiment.check_config(config).to_dict())


def test_feddyn_pair_and_fednova_take_their_arguments():
  config = experiment.override(CONFIG, {"algorithms": {
      "FedDyn": {"aggregator": "feddyn", "aggregator_args": {"alpha": 0.1},
                 "client": "feddyn", "client_args": {"alpha": 0.1}},
      "FedNova": {"aggregator": "fednova",
                  "aggregator_args": {"momentum": 0.9},
                  "train": {"momentum": 0.9}}}})
  experiment.check_config(config)
  # A momentum the clients do not train with is the run's refusal, made
  # when the config is checked.
  with pytest.raises(spec.ConfigError) as raised:
    experiment.check_config(experiment.override(config, {
        "algorithms.FedNova.train": {}}))
  assert raised.value.path == "algorithms.FedNova.aggregator_args.momentum"
  assert "local SGD momentum of the run (0.0)" in str(raised.value)
  resolved = experiment.check_config(config).to_dict()
  experiment.check_config(resolved)
  assert experiment.check_config(config).rule_arguments("FedDyn")[0] == {
      "alpha": 0.1}
  # The client learning rate reaches FedNova's proximal normaliser.
  assert experiment.check_config(config).rule_arguments("FedNova")[0] == {
      "momentum": 0.9, "proximal_mu": 0.0, "learning_rate": 0.1,
      "tau_eff": "normalized"}
  # Both at their defaults share alpha too.
  experiment.check_config(experiment.override(config, {
      "algorithms.FedDyn.aggregator_args": {},
      "algorithms.FedDyn.client_args": {}}))
