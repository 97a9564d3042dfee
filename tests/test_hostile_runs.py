"""Hostile cases of whole runs: a privacy column that is never wrong, no
run that overwrites another, no setting silently ignored."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import clients
from fedjax_agg import experiment
from fedjax_agg import spec
from fedjax_agg import history as history_lib
from fedjax_agg import locks
from fedjax_agg import loop
from fedjax_agg import privacy
from fedjax_agg import round_forms
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg.clients import _host_table
from fedjax_agg.config import (Checkpointing, Evaluation, Execution,
                               LocalTraining, Privacy, client_optimizer)
from tests.clients._util import _run_data, linear_model

QUIET = Execution(clients_per_step=2, progress=False)


def _run(aggregator, priv=None, **kwargs):
  data, test = _run_data()
  return simulation.run(linear_model(), data, test, aggregator,
                        num_rounds=kwargs.pop("num_rounds", 2),
                        participation=0.5, execution=QUIET, privacy=priv,
                        seed=0, **kwargs)


# ---------------------------------------------------------------- privacy


def test_privacy_of_a_rule_without_noise_is_refused():
  # Would have recorded epsilon 4.09 for a run that adds no noise.
  with pytest.raises(ValueError, match="adds no calibrated Gaussian noise"):
    _run(aggregators.fedavg(), Privacy(1.0))


def test_a_stated_noise_multiplier_must_be_the_rules():
  # Would have recorded epsilon 0.50 for a rule that adds z = 0.01.
  with pytest.raises(ValueError, match="differs from the noise"):
    _run(aggregators.dp_fedavg(noise_multiplier=0.01), Privacy(5.0))


def test_epsilon_is_that_of_the_noise_the_rule_adds():
  result = _run(aggregators.dp_fedavg(noise_multiplier=1.3), Privacy(),
                num_rounds=3)
  want = privacy.epsilons(1.3, 3, num_clients=6, cohort_size=3, delta=1e-5)
  got = [row["epsilon"] for row in result.history.rows[1:]]
  np.testing.assert_allclose(got, want, rtol=1e-12)
  assert result.history.config["privacy"]["noise_multiplier"] == 1.3


def test_a_server_optimizer_over_dp_is_accounted_as_its_base():
  rule = aggregators.fedavgm(
      server_learning_rate=1.0, momentum=0.5,
      base=aggregators.dp_fedavg(noise_multiplier=0.9))
  result = _run(rule, Privacy(), num_rounds=2)
  want = privacy.epsilons(0.9, 2, num_clients=6, cohort_size=3, delta=1e-5)
  np.testing.assert_allclose(
      [row["epsilon"] for row in result.history.rows[1:]], want,
      rtol=1e-12)


def test_poisson_needs_the_fixed_denominator():
  # Left out, the denominator is the run's q N (as a config fills it in);
  # another one is refused by name.
  with pytest.raises(ValueError, match=r"dp_fedavg: expected_clients=5.0 "
                     r"differs from the expected cohort size q N of Poisson "
                     r"sampling of the run \(3.0\)"):
    _run(aggregators.dp_fedavg(noise_multiplier=1.0, expected_clients=5.0),
         Privacy(sampling="poisson"))
  result = _run(aggregators.dp_fedavg(noise_multiplier=1.0,
                                      expected_clients=3.0),
                Privacy(sampling="poisson"), num_rounds=2)
  left_out = _run(aggregators.dp_fedavg(noise_multiplier=1.0),
                  Privacy(sampling="poisson"), num_rounds=2)
  drop_time = lambda rows: [{k: v for k, v in row.items() if k != "time_s"}
                            for row in rows]
  assert drop_time(left_out.history.rows) == drop_time(result.history.rows)
  want = privacy.epsilons(1.0, 2, num_clients=6, cohort_size=3, delta=1e-5,
                          sampling="poisson")
  np.testing.assert_allclose(
      [row["epsilon"] for row in result.history.rows[1:]], want,
      rtol=1e-9)


def _config(**changes):
  config = {
      "dataset": {"name": "mnist", "source": "mnist_5k"},
      "partition": {"name": "iid", "num_clients": 10},
      "model": {"name": "mlp2"},
      "train": {"participation": 0.5},
      "algorithms": {"DP": {"aggregator": "dp_fedavg",
                            "aggregator_args": {"noise_multiplier": 1.0}}},
  }
  config.update(changes)
  return config


def test_configs_give_poisson_rules_the_fixed_denominator():
  config = _config(privacy={"sampling": "poisson"})
  experiment.check_config(config)
  rule, _ = experiment.build_rule(config, "DP", 10)
  assert rule.expected_clients == 5.0 and rule.noise_multiplier == 1.0
  args, _ = experiment.check_config(config).rule_arguments("DP")
  assert args["expected_clients"] == 5.0
  # Without Poisson sampling the rule divides by the real participants.
  rule, _ = experiment.build_rule(_config(), "DP", 10)
  assert rule.expected_clients is None


def test_an_unreachable_target_epsilon_is_refused_with_the_config():
  one_round = privacy.epsilon(1.0, 1, num_clients=10, cohort_size=5,
                              delta=1e-5)
  with pytest.raises(spec.ConfigError, match="single round") as raised:
    experiment.check_config(_config(
        privacy={"target_epsilon": one_round / 2}))
  assert raised.value.path == "privacy.target_epsilon"
  experiment.check_config(_config(privacy={"target_epsilon":
                                           one_round * 2}))


def test_a_dp_ftrl_target_is_checked_against_one_tree_node():
  # DP-FTRL's first round is one node of its tree, each client once, with
  # no amplification: the Gaussian mechanism's epsilon at z, which is far
  # above DP-FedAvg's sampled first round at the same z.
  node = privacy.tree_epsilons(1.0, np.arange(5)[None], delta=1e-5)[0]
  sampled = privacy.epsilon(1.0, 1, num_clients=10, cohort_size=5,
                            delta=1e-5)
  assert sampled < node
  ftrl = {"DP": {"aggregator": "dp_ftrl",
                 "aggregator_args": {"noise_multiplier": 1.0}}}
  target = (sampled + node) / 2  # the DP-FedAvg estimate would pass it
  with pytest.raises(spec.ConfigError, match="single round"):
    experiment.check_config(_config(algorithms=ftrl,
                                    privacy={"target_epsilon": target}))
  experiment.check_config(_config(algorithms=ftrl,
                                  privacy={"target_epsilon": node * 1.01}))


# --------------------------------------------------------- names and paths


@pytest.mark.parametrize("name", ["../x", "/abs/y", "a/b", "..", ".",
                                  ".hidden", "", "x\x00y", "a\\b", "x.",
                                  "a" * 200])
def test_algorithm_names_must_be_safe_folder_names(name):
  config = _config(algorithms={name: {"aggregator": "fedavg"}})
  with pytest.raises(spec.ConfigError, match="safe folder name"):
    experiment.check_config(config)


def test_committed_style_names_stay_valid():
  for name in ("FedAvg", "ADCT(25,10)", "FedLap_q0.25", "FedAvg-uniform",
               "FedProx mu=0.01"):
    spec.check_algorithm_name(name)


def test_run_config_refuses_an_escaping_name_before_writing(tmp_path):
  config = _config(algorithms={"../escaped": {"aggregator": "fedavg"}})
  with pytest.raises(spec.ConfigError):
    experiment.run_config(config, str(tmp_path / "out"), progress=False)
  assert not (tmp_path / "escaped").exists()
  assert not (tmp_path / "out").exists()


def test_config_nested_past_any_sane_depth_is_a_config_error(tmp_path):
  deep = {}
  node = deep
  for _ in range(200_000):
    node["a"] = {}
    node = node["a"]
  with pytest.raises(spec.ConfigError, match="nested deeper"):
    experiment.check_config(_config(algorithms={"A": {
        "aggregator": "fedavg", "aggregator_args": deep}}))
  path = tmp_path / "deep.json"
  path.write_text("[" * 200_000 + "]" * 200_000)
  with pytest.raises(ValueError, match="nested too deeply"):
    experiment.load_config(str(path))


# ----------------------------------------------------------------- seeds


@pytest.mark.parametrize("seed", [2**32, 2**32 + 5, 2**63, 10**20])
def test_seeds_past_32_bits_are_refused(seed):
  # jax.random.key keeps only the low 32 bits: 2**32 + 5 would be seed 5.
  with pytest.raises(ValueError, match="seed"):
    loop.seed_keys(seed)
  with pytest.raises(spec.ConfigError) as raised:
    experiment.check_config(_config(seeds=[0, seed]))
  assert raised.value.path == "seeds[1]"


def test_the_largest_seed_is_distinct_from_zero():
  a = jax.random.key_data(loop.seed_keys(loop.MAX_SEED)[0])
  b = jax.random.key_data(loop.seed_keys(0)[0])
  assert not np.array_equal(a, b)


# ----------------------------------------------------------------- locks


def test_two_runs_cannot_share_a_checkpoint_folder(tmp_path):
  folder = str(tmp_path / "ckpt")
  first = checkpoint.RunCheckpointer(folder, 1, {"run": 1})
  try:
    with pytest.raises(locks.LockedError, match=f"pid {os.getpid()}"):
      checkpoint.RunCheckpointer(folder, 1, {"run": 2})
  finally:
    first.close()
  # Released at close: the folder can be used again.
  checkpoint.RunCheckpointer(folder, 1, {"run": 2}).close()


def test_a_second_run_in_a_live_checkpoint_folder_fails_up_front(tmp_path):
  folder = str(tmp_path / "ckpt")
  holder = locks.FileLock.for_folder(folder, "x")
  os.makedirs(folder)
  holder.acquire()
  try:
    with pytest.raises(locks.LockedError, match="in use by another run"):
      _run(aggregators.fedavg(), checkpointing=Checkpointing(folder, 1))
  finally:
    holder.release()


def test_a_host_table_never_overwrites_an_existing_file(tmp_path):
  path = tmp_path / "table.bin"
  path.write_bytes(b"another run's rows")
  shapes = {"w": jax.ShapeDtypeStruct((3,), jnp.float32)}
  with pytest.raises(ValueError, match="already exists"):
    _host_table.host_table(4, shapes, str(path))
  assert path.read_bytes() == b"another run's rows"
  fresh = tmp_path / "fresh.bin"
  table = _host_table.host_table(4, shapes, str(fresh))
  # The live file of this table is refused to a second table, and locked.
  with pytest.raises(ValueError, match="already exists"):
    _host_table.host_table(4, shapes, str(fresh))
  with pytest.raises(locks.LockedError):
    locks.FileLock(str(fresh), "t", record_owner=False).acquire()
  assert table.store.file_lock.held


# ---------------------------------------------------------------- resume


def test_resumed_history_files_hold_every_round(tmp_path):
  folder = str(tmp_path / "ckpt")
  _run(aggregators.fedavg(), num_rounds=2,
       checkpointing=Checkpointing(folder, 1))
  out = str(tmp_path / "out")
  writer = history_lib.HistoryWriter(out)
  result = _run(aggregators.fedavg(), num_rounds=4,
                checkpointing=Checkpointing(folder, 1, resume=True),
                callbacks=[writer])
  with open(os.path.join(out, "history.json")) as f:
    written = json.load(f)
  assert [row["round"] for row in written["rows"]] == [0, 1, 2, 3, 4]
  assert [row["round"] for row in written["clients"]] == [1, 2, 3, 4]
  np.testing.assert_allclose(
      [row["test_accuracy"] for row in written["rows"]],
      result.history.column("test_accuracy"))


def test_resume_sees_a_local_updates_own_training_settings(tmp_path):
  data, test = _run_data()
  model = linear_model()
  folder = str(tmp_path / "ckpt")

  def ditto(momentum):
    training = LocalTraining(batch_size=4, learning_rate=0.05,
                             optimizer=client_optimizer("sgd", momentum))
    return clients.ditto(model, training, lam=0.5)

  def run(momentum, resume):
    return simulation.run(
        model, data, test, aggregators.fedavg(), num_rounds=2,
        participation=0.5, execution=QUIET, local_update=ditto(momentum),
        checkpointing=Checkpointing(folder, 1, resume=resume), seed=0)

  run(0.0, resume=False)
  with pytest.raises(checkpoint.CheckpointMismatchError, match="momentum"):
    run(0.9, resume=True)


# ----------------------------------------------------------------- sweeps


def test_sweep_grids_refuse_repeated_values():
  with pytest.raises(ValueError, match="repeats a value"):
    sweep.grid_points({"alpha": [5, 5.0]})
  with pytest.raises(ValueError, match="same float32"):
    sweep.grid_points({"alpha": [5, 5.0000001]})
  names = {sweep.member_name({"alpha": a}, 0) for a in (5, 5.001, 0.1,
                                                        1e-5, 2.5e6)}
  assert len(names) == 5


def _sweep(build, grid, **kwargs):
  data, test = _run_data()
  return sweep.run_sweep(build, grid, seeds=[0], model=linear_model(),
                         data=data, test_data=test, num_rounds=1,
                         participation=0.5, execution=QUIET, **kwargs)


def test_sweeps_refuse_per_client_evaluation_they_cannot_compute():
  data, test = _run_data()
  with pytest.raises(ValueError, match="validation split"):
    sweep.run_sweep(lambda h: aggregators.fedadp(h["alpha"], num_clients=6),
                    {"alpha": [1.0, 2.0]}, seeds=[0], model=linear_model(),
                    data=data._replace(validation=None), test_data=test,
                    num_rounds=1, participation=0.5, execution=QUIET,
                    evaluation=Evaluation(finetune_steps=2))
  with pytest.raises(ValueError, match="personalize"):
    _sweep(lambda h: aggregators.fedadp(h["alpha"], num_clients=6),
           {"alpha": [1.0, 2.0]}, evaluation=Evaluation(personalized=True))


def test_sweeping_a_shape_argument_is_named_before_the_first_round():
  with pytest.raises(round_forms.UntraceableGridError, match="beta"):
    _sweep(lambda h: aggregators.trimmed_mean(h["beta"]),
           {"beta": [0.1, 0.2]})
