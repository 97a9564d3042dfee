"""LoRA fine-tuning described once: "model.base" and "model.adapters" in a
JSON config, on the command line and in Python build the same run as the
LoRA model written by hand, the base stays frozen, the uplink counts the
adapters only, and what cannot apply is refused by name before anything
runs."""

import gc

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import cli
from fedjax_agg import experiment
from fedjax_agg import models
from fedjax_agg import simulation
from fedjax_agg import spec
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.models import lora

SEED, LR, ROUNDS = 3, 0.5, 2
MODEL = {"name": "mlp2", "args": {"hidden": 8}}


def _config(adapters=None, aggregator="fedit", base=None, **blocks):
  model = {**MODEL, "adapters": adapters, "base": base}
  return {"dataset": {"name": "fashion_mnist", "max_train_examples": 400,
                      "max_test_examples": 100},
          "partition": {"name": "iid", "num_clients": 4},
          "model": {k: v for k, v in model.items() if v is not None},
          "train": {"rounds": ROUNDS, "participation": 0.5,
                    "batch_size": 20, "learning_rate": LR,
                    "eval_clients": False},
          "algorithms": {"A": {"aggregator": aggregator}},
          "seeds": [SEED], **blocks}


def _network():
  return models.get("mlp2", num_classes=10, input_shape=(28, 28, 1),
                    hidden=8)


def _fedit_by_hand(prepared, rank, alpha, seed):
  """FedIT on ``_config``'s setting from the public Python API: the base
  drawn from the adapters' seed, adapters of ``rank`` on every Dense
  layer."""
  key = jax.random.key(seed)
  base = _network()
  model = lora.lora(base, base.init(jax.random.fold_in(key, 1)), rank=rank,
                    alpha=alpha, key=key)
  return simulation.run(
      model, prepared[0], prepared[1], aggregators.fedit(),
      num_rounds=ROUNDS, participation=0.5, seed=SEED,
      training=LocalTraining(batch_size=20, learning_rate=LR),
      execution=Execution(progress=False),
      evaluation=Evaluation(clients=False))


def test_a_config_lora_run_is_the_lora_model_written_by_hand():
  config = _config({"rank": 2, "alpha": 4.0, "seed": 5})
  prepared = experiment.prepare_data(config, SEED)
  from_config = experiment.run_algorithm(config, "A", SEED, prepared)
  # The same run from the public Python API: the adapters' seed's base,
  # adapters of rank 2 on every Dense layer, FedIT.
  by_hand = _fedit_by_hand(prepared, rank=2, alpha=4.0, seed=5)
  for got, want in zip(from_config.history.rows, by_hand.history.rows,
                       strict=True):
    for column in want:
      if column != "time_s":
        np.testing.assert_allclose(got[column], want[column], rtol=1e-6,
                                   err_msg=column)
  params = from_config.state.params
  assert lora.is_adapters(params)
  # r (d_in + d_out) per adapted layer: 784 -> 8 and 8 -> 10.
  assert sum(np.size(leaf) for leaf in jax.tree.leaves(params)) == (
      2 * (784 + 8) + 2 * (8 + 10))


def test_the_base_is_read_frozen_and_only_adapters_travel(tmp_path):
  variables = _network().init(jax.random.key(11))
  checkpoint.save_variables(str(tmp_path / "base"), variables)
  base = str(tmp_path / "base")
  # Full fine-tuning: the run starts from the saved variables.
  plain = experiment.check_config(_config(aggregator="fedavg", base=base))
  built = experiment.build(plain, "A", experiment.prepare_data(plain, SEED))
  for got, want in zip(jax.tree.leaves(built.options.init_params),
                       jax.tree.leaves(variables), strict=True):
    np.testing.assert_array_equal(got, want)
  # FFA-LoRA on it: A frozen (only B is a param), the base bit-identical
  # after the run, and the uplink is B's bytes for each aggregated client.
  config = _config({"rank": 2}, aggregator="ffa_lora", base=base,
                   systems={})
  prepared = experiment.prepare_data(config, SEED)
  model = experiment.build(config, "A", prepared).model
  result = experiment.run_algorithm(config, "A", SEED, prepared)
  frozen = lora.spec(model).base_variables
  for got, want in zip(jax.tree.leaves(frozen), jax.tree.leaves(variables),
                       strict=True):
    np.testing.assert_array_equal(got, want)
  nodes = result.state.params[lora.ADAPTERS]
  assert all(set(node) == {"b"} for node in nodes.values())
  per_client = lora.uplink_bytes(result.state.params)
  assert per_client == 4 * 2 * (8 + 10)
  cohort = 2  # participation 0.5 of 4 clients
  assert result.history.column("uplink_bytes")[1:].tolist() == [
      cohort * per_client * r for r in range(1, ROUNDS + 1)]


def test_a_vmapped_sweep_of_seeds_is_the_runs_of_its_seeds():
  # FFA-LoRA: the frozen A and the base are the adapters' seed's, one
  # network for every member.
  config = _config({"rank": 2}, aggregator="ffa_lora")
  seeds = [0, 1]
  prepared = [experiment.prepare_data(config, seed) for seed in seeds]
  members = experiment.sweep_algorithm(config, "A", seeds, prepared)
  for member, data in zip(members, prepared, strict=True):
    alone = experiment.run_algorithm(config, "A", member.seed, data)
    np.testing.assert_allclose(member.history.column("test_loss"),
                               alone.history.column("test_loss"),
                               rtol=2e-5)


@pytest.mark.parametrize("change,path", [
    ({"adapters": {"rank": 2}, "aggregator": "fedadp"},
     "algorithms.A.aggregator"),
    ({"adapters": {"rank": 2}, "aggregator": "fedavg"},
     "algorithms.A.aggregator"),
    ({"aggregator": "flora"}, "algorithms.A.aggregator"),
    ({"adapters": {"rank": 0}}, "model.adapters.rank"),
    ({"adapters": {"rnk": 2}}, "model.adapters.rnk"),
    ({"adapters": {"rank": 2, "dropout": 1.0}}, "model.adapters.dropout"),
    ({"adapters": {"rank": 2, "seed": -1}}, "model.adapters.seed"),
    ({"adapters": {"rank": 2, "targets": ["fc("]}},
     "model.adapters.targets[0]"),
    ({"adapters": {"rank": 2, "targets": "bert"}}, "model.adapters.targets"),
    ({"adapters": {"rank": 2}, "base": "no/such/folder"}, "model.base"),
])
def test_what_cannot_apply_is_refused_by_name(change, path):
  with pytest.raises(spec.ConfigError) as raised:
    experiment.check_config(_config(**change))
  assert raised.value.path == path, str(raised.value)


def test_a_client_side_for_whole_models_is_refused_with_adapters():
  config = _config({"rank": 2})
  config["algorithms"]["A"]["client"] = "ditto"
  with pytest.raises(spec.ConfigError) as raised:
    experiment.check_config(config)
  assert raised.value.path == "algorithms.A.client"


def test_what_only_the_network_can_tell_is_refused_when_built(tmp_path):
  # Rank past a layer's width, and a base of another network, are named
  # when the network is known (before the first round).
  config = experiment.check_config(_config({"rank": 9}))
  with pytest.raises(spec.ConfigError, match="rank=9") as raised:
    experiment.build(config, "A", experiment.prepare_data(config, SEED))
  assert raised.value.path == "model.adapters"
  other = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1),
                     hidden=16)
  checkpoint.save_variables(str(tmp_path / "other"),
                            other.init(jax.random.key(0)))
  config = experiment.check_config(_config(
      {"rank": 2}, base=str(tmp_path / "other")))
  with pytest.raises(spec.ConfigError) as raised:
    experiment.build(config, "A", experiment.prepare_data(config, SEED))
  assert raised.value.path == "model.base"


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_base_of_another_network_is_refused_before_any_array_is_read(
    tmp_path):
  # The saved tree is compared with the network's before orbax starts
  # reading, so a refusal leaves no abandoned read behind (which would be
  # reported, as an unraisable exception, when collected).
  small = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1),
                     hidden=16)
  checkpoint.save_variables(str(tmp_path / "small"),
                            small.init(jax.random.key(0)))
  wide = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1),
                    hidden=32)
  with pytest.raises(checkpoint.CheckpointError,
                     match=r"\['fc1'\]\['bias'\] is \(16,\) saved, "
                     r"\(32,\) in the network"):
    checkpoint.load_variables(str(tmp_path / "small"),
                              jax.eval_shape(wide.init, jax.random.key(0)))
  cnn = models.get("cnn_mcmahan", num_classes=10, input_shape=(28, 28, 1))
  with pytest.raises(checkpoint.CheckpointError,
                     match="only the (saved variables|network) have"):
    checkpoint.load_variables(str(tmp_path / "small"),
                              jax.eval_shape(cnn.init, jax.random.key(0)))
  gc.collect()
  # The same network's variables still load, exactly.
  again = checkpoint.load_variables(
      str(tmp_path / "small"), jax.eval_shape(small.init, jax.random.key(0)))
  for got, want in zip(jax.tree.leaves(again),
                       jax.tree.leaves(small.init(jax.random.key(0))),
                       strict=True):
    np.testing.assert_array_equal(got, want)


def test_the_command_line_sets_the_adapters():
  run, name = cli.resolve(*cli.parse([
      "--aggregator", "fedit", "--lora-rank", "4", "--lora-alpha", "8",
      "--lora-targets", "transformer", "--model", "transformer_lm",
      "--dataset", "shakespeare", "--dataset-arg", "min_samples=2000"]))
  assert run.model.adapters == spec.AdaptersSpec(4, alpha=8.0,
                                                 targets="transformer")
  assert run.model.adapters.patterns() == lora.TRANSFORMER_TARGETS
  assert run.algorithms[name].aggregator == "fedit"
  with pytest.raises(cli.UsageError, match="--aggregator"):
    cli.resolve(*cli.parse(["--aggregator", "fedadp", "--lora-rank", "4"]))
  # The written-out description reads back as the same run.
  again = spec.Experiment.from_dict(run.to_dict())
  assert again.to_dict() == run.to_dict()
  assert again.model.adapters == run.model.adapters


def test_a_command_line_fine_tuning_run_records_its_adapters(tmp_path,
                                                             capsys):
  import json  # pylint: disable=g-import-not-at-top
  # The command line's network: mlp2 at its defaults.
  variables = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1)
                         ).init(jax.random.key(2))
  checkpoint.save_variables(str(tmp_path / "base"), variables)
  out = tmp_path / "run"
  assert cli.main([
      "--dataset", "fashion_mnist", "--max-train-examples", "400",
      "--num-clients", "4", "--model", "mlp2", "--rounds", "1",
      "--participation", "0.5", "--batch-size", "20", "--no-progress",
      "--no-client-eval", "--aggregator", "flora", "--lora-rank", "2",
      "--base", str(tmp_path / "base"), "--out", str(out)]) == 0
  capsys.readouterr()
  record = json.loads((out / "config.json").read_text())
  assert record["model"]["adapters"] == {"rank": 2, "alpha": None,
                                         "targets": None, "dropout": 0.0,
                                         "seed": 0}
  assert record["model"]["base"] == str(tmp_path / "base")
  # The record runs again as it is: the same description.
  again = experiment.check_config(record)
  assert again.model.adapters == spec.AdaptersSpec(2)
  rows = json.loads((out / "history.json").read_text())["rows"]
  assert len(rows) == 2 and np.isfinite(rows[-1]["test_loss"])


def test_dp_fedavg_privatises_the_adapters_and_accounts_them():
  config = _config({"rank": 2}, aggregator="dp_fedavg")
  config["algorithms"]["A"]["aggregator_args"] = {"clip_norm": 0.1,
                                                  "noise_multiplier": 1.0}
  prepared = experiment.prepare_data(config, SEED)
  result = experiment.run_algorithm(config, "A", SEED, prepared)
  params = result.state.params
  assert lora.is_adapters(params)
  assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(params))
  epsilons = result.history.column("epsilon")[1:]
  assert np.all(np.isfinite(epsilons)) and epsilons[1] > epsilons[0] > 0
  # The noise reaches the adapters: the same run without noise differs.
  quiet = experiment.override(
      config, {"algorithms.A.aggregator_args.noise_multiplier": 0.0})
  plain = experiment.run_algorithm(quiet, "A", SEED, prepared).state.params
  assert any(not np.allclose(a, b) for a, b in zip(
      jax.tree.leaves(params), jax.tree.leaves(plain), strict=True))


def test_a_resume_with_other_adapters_is_refused(tmp_path):
  # The checkpoint's fingerprint holds the adapted network: its base,
  # rank, scale and dropout.
  config = _config({"rank": 2, "alpha": 2.0})
  prepared = experiment.prepare_data(config, SEED)
  folder = str(tmp_path / "checkpoint")
  experiment.run_algorithm(config, "A", SEED, prepared,
                           checkpoint_dir=folder, checkpoint_every=1)
  other = _config({"rank": 2, "alpha": 8.0})
  with pytest.raises(checkpoint.CheckpointError):
    experiment.run_algorithm(other, "A", SEED, prepared,
                             checkpoint_dir=folder, resume=True)


def _ranks_config():
  """Full fine-tuning beside FedIT at two ranks in one config: the model
  has no adapters, each LoRA algorithm gives its own."""
  config = _config()
  config["algorithms"] = {
      "Full": {"aggregator": "fedavg"},
      "FedIT-1": {"aggregator": "fedit", "adapters": {"rank": 1}},
      "FedIT-3": {"aggregator": "fedit",
                  "adapters": {"rank": 3, "alpha": 6.0, "seed": 5}}}
  return config


def test_each_algorithm_may_give_its_own_adapters():
  config = _ranks_config()
  experiment_spec = spec.Experiment.from_dict(config)
  assert experiment_spec.adapters_of("Full") is None
  assert experiment_spec.adapters_of("FedIT-1") == spec.AdaptersSpec(rank=1)
  prepared = experiment.prepare_data(config, SEED)
  # FedIT-3's run is the LoRA model of rank 3 written by hand.
  by_hand = _fedit_by_hand(prepared, rank=3, alpha=6.0, seed=5)
  from_config = experiment.run_algorithm(config, "FedIT-3", SEED, prepared)
  for got, want in zip(jax.tree.leaves(from_config.state.params),
                       jax.tree.leaves(by_hand.state.params), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  # Trainable parameters: the whole network, and r (d_in + d_out) per
  # Dense layer for each rank.
  dense = [(784, 8), (8, 10)]
  counts = {}
  for name in ("Full", "FedIT-1", "FedIT-3"):
    built = experiment.build(config, name, prepared)
    params = built.model.init(jax.random.key(0))
    counts[name] = sum(leaf.size for leaf in jax.tree.leaves(params))
  assert counts["Full"] == sum(i * o + o for i, o in dense)
  assert counts["FedIT-1"] == sum(i + o for i, o in dense)
  assert counts["FedIT-3"] == 3 * counts["FedIT-1"]
  # The written-out config keeps each algorithm's adapters.
  written = experiment_spec.to_dict()
  assert written["algorithms"]["FedIT-3"]["adapters"] == {
      "rank": 3, "alpha": 6.0, "seed": 5}
  assert spec.Experiment.from_dict(written).to_dict() == written
  assert spec.Experiment.from_dict(experiment_spec.to_dict(
      written_out=False)) == experiment_spec


def test_an_algorithm_overrides_the_models_adapters_or_trains_the_whole():
  config = _config({"rank": 2, "targets": ["fc1"]})
  config["algorithms"] = {
      "r2": {"aggregator": "fedit"},
      "r4": {"aggregator": "fedit", "adapters": {"rank": 4}},
      "whole": {"aggregator": "fedavg", "adapters": None}}
  experiment_spec = spec.Experiment.from_dict(config)
  assert experiment_spec.adapters_of("r2") == spec.AdaptersSpec(
      rank=2, targets=["fc1"])
  # The algorithm's keys over the model's: the targets are kept.
  assert experiment_spec.adapters_of("r4") == spec.AdaptersSpec(
      rank=4, targets=["fc1"])
  assert experiment_spec.adapters_of("whole") is None


@pytest.mark.parametrize("algorithm,path,named", [
    ({"aggregator": "fedit", "adapters": {"alpha": 2.0}},
     "algorithms.A.adapters.rank", "must give their rank"),
    ({"aggregator": "fedit", "adapters": {"rank": 0}},
     "algorithms.A.adapters.rank", ">= 1"),
    ({"aggregator": "fedit", "adapters": {"rnak": 2}},
     "algorithms.A.adapters.rnak", "unknown key"),
    ({"aggregator": "fedit", "adapters": [2]},
     "algorithms.A.adapters", "mapping"),
    ({"aggregator": "fedavg", "adapters": {"rank": 2}},
     "algorithms.A.aggregator", "algorithms.A.adapters"),
    ({"aggregator": "fedit", "adapters": None},
     "algorithms.A.aggregator", "works on LoRA adapters"),
])
def test_an_algorithms_adapters_are_checked_naming_their_path(algorithm,
                                                              path, named):
  config = _config()
  config["algorithms"] = {"A": algorithm}
  with pytest.raises(spec.ConfigError) as raised:
    spec.Experiment.from_dict(config)
  assert raised.value.path == path, str(raised.value)
  assert named in str(raised.value)
