"""Sweeps: S members in one vmapped round equal S separate runs."""

import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import cli
from fedjax_agg import clients
from fedjax_agg import data as data_lib
from fedjax_agg import experiment
from fedjax_agg import federated
from fedjax_agg import objectives
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg.config import Checkpointing
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from tests import agg_testutil
from tests.clients._util import _run_data
from tests.clients._util import close
from tests.clients._util import linear_model
from tests.clients._util import QUIET
from tests.clients._util import RUN_TRAINING
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = tiny_model()  # one instance: evaluation compiles once per module
TRAINING = LocalTraining(epochs=2, batch_size=3)
TRAIN = dict(num_rounds=2, participation=0.6,
             execution=Execution(clients_per_step=2, progress=False))


def _training(**changes):
  return dataclasses.replace(TRAINING, **changes)


def _assert_same_run(member, solo, config_differs=()):
  """A sweep member's history and state equal ``simulation.run``'s (its
  config too, but for the keys ``config_differs``)."""
  assert len(member.history.rows) == len(solo.history.rows)
  for got, want in zip(member.history.rows, solo.history.rows, strict=True):
    assert got.keys() == want.keys()
    for key in want:
      if key != "time_s":
        np.testing.assert_allclose(got[key], want[key], rtol=2e-5,
                                   atol=2e-6, err_msg=key)
  for got, want in zip(member.history.client_rows, solo.history.client_rows,
                       strict=True):
    assert got.keys() == want.keys()
    np.testing.assert_array_equal(got["client_ids"], want["client_ids"])
    for key in want:
      np.testing.assert_allclose(got[key], want[key], rtol=2e-5, atol=2e-6,
                                 err_msg=key)
  for got, want in zip(jax.tree.leaves(member.state),
                       jax.tree.leaves(solo.state), strict=True):
    if jnp.issubdtype(got.dtype, jax.dtypes.prng_key):
      got, want = jax.random.key_data(got), jax.random.key_data(want)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  config = {k: v for k, v in solo.history.config.items()
            if k not in config_differs}
  assert {k: member.history.config[k] for k in config} == config


def _partition(seed, sizes=(7, 13, 4, 10, 1)):
  """The pooled tiny data split among 5 clients by a seeded permutation."""
  _, x, y, _ = tiny_data()
  perm = np.random.default_rng(seed).permutation(len(y))
  bounds = np.cumsum((0,) + sizes)
  return federated.from_partition(
      x, y, [perm[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)])


def test_seeds_with_their_own_partitions_equal_separate_runs():
  # Per-seed partitions of different largest client (13 and 15 examples):
  # the stacked index rows are padded, which must change nothing.
  _, x, y, _ = tiny_data()
  seeds = [0, 3]
  data = [_partition(0), _partition(1, sizes=(15, 5, 4, 10, 1))]
  members = sweep.run_sweep(lambda hparams: aggregators.fedavg(), seeds=seeds,
      model=MODEL, data=data, test_data=(x, y), **TRAIN,
      training=_training(learning_rate=0.2))
  assert [m.seed for m in members] == seeds
  for member, member_data in zip(members, data, strict=True):
    solo = simulation.run(MODEL, member_data, (x, y), aggregators.fedavg(),
        seed=member.seed, **TRAIN, training=_training(learning_rate=0.2))
    _assert_same_run(member, solo)
  # Different seeds really differ (cohorts and models).
  assert not np.array_equal(members[0].history.client_rows[0]["client_ids"],
                            members[1].history.client_rows[0]["client_ids"])


def test_grid_of_fedadp_alpha_fedprox_mu_and_client_lr_equals_runs():
  data, x, y, _ = tiny_data()
  grid = {"alpha": [1.0, 8.0], "mu": [0.0, 0.5],
          "learning_rate": [0.1, 0.3]}

  def build(hparams):
    return (aggregators.fedadp(hparams["alpha"], num_clients=5),
            objectives.fedprox(hparams["mu"]))

  members = sweep.run_sweep(build, grid, seeds=[0, 1], model=MODEL, data=data,
      test_data=(x, y), **TRAIN, training=TRAINING)
  assert len(members) == 16
  assert [m.hparams for m in members[:4]] == [
      {"alpha": 1.0, "mu": 0.0, "learning_rate": 0.1}] * 2 + [
          {"alpha": 1.0, "mu": 0.0, "learning_rate": 0.3}] * 2
  assert [m.seed for m in members[:4]] == [0, 1, 0, 1]
  # The last member: another value of every hyperparameter than the first
  # member, and another seed (a solo run compiles its own round: one only).
  member = members[-1]
  aggregator, objective = build(member.hparams)
  solo = simulation.run(MODEL, data, (x, y), aggregator, seed=member.seed,
      **TRAIN, training=_training(
          objective=objective,
          learning_rate=member.hparams["learning_rate"]))
  _assert_same_run(member, solo)
  finals = {m.hparams["alpha"]: m.history.rows[-1]["train_loss"]
            for m in members if m.seed == 0 and m.hparams["mu"] == 0.5
            and m.hparams["learning_rate"] == 0.3}
  assert finals[1.0] != finals[8.0]  # alpha reached the rule


def test_fednnnn_beta_gamma_server_lr_and_fedlap_q_equal_runs():
  # One grid over FedNNNN's beta and gamma, the server learning rate of a
  # FedAvgM wrapped around it, and FedLap's q.
  data, x, y, _ = tiny_data()
  grid = {"beta": [0.6, 1.0], "gamma": [0.0, 0.8], "server_lr": [0.5, 1.5],
          "q": [0.0, 0.5]}

  def build(hparams):
    rule = aggregators.fedavgm(
        hparams["server_lr"], 0.5,
        base=aggregators.fednnnn(hparams["beta"], hparams["gamma"]))
    return rule, objectives.fedlap(hparams["q"], mu=1.0)

  train = dict(TRAIN, training=_training(epochs=1),
               evaluation=Evaluation(clients=False))
  members = sweep.run_sweep(build, grid, seeds=[2], model=MODEL, data=data,
      test_data=(x, y), **train)
  assert len(members) == 16
  aggregator, objective = build(members[-1].hparams)
  solo = simulation.run(MODEL, data, (x, y), aggregator, seed=2,
                        **dict(train, training=_training(
                            epochs=1, objective=objective)))
  _assert_same_run(members[-1], solo)


def test_bad_grid_values_raise_the_factory_error_before_running():
  data, x, y, _ = tiny_data()
  run = lambda build, grid, **kw: sweep.run_sweep(build, grid, model=MODEL,
      data=data, test_data=(x, y), **kw, **TRAIN, training=TRAINING)
  fedadp = lambda h: aggregators.fedadp(h["alpha"], num_clients=5)
  with pytest.raises(ValueError, match="alpha must be > 0, got -1"):
    run(fedadp, {"alpha": [5.0, -1]})
  with pytest.raises(ValueError, match="mu must be >= 0"):
    run(lambda h: (aggregators.fedavg(), objectives.fedprox(h["mu"])),
        {"mu": [0.1, -0.5]})
  with pytest.raises(ValueError, match="q must be in"):
    run(lambda h: (aggregators.fedavg(), objectives.fedlap(h["q"])),
        {"q": [1.5]})
  with pytest.raises(ValueError, match="learning_rate must be > 0"):
    run(fedadp, {"alpha": [5.0], "learning_rate": [0.1, 0.0]})
  with pytest.raises(TypeError, match="grid\\['alpha'\\] must be a number"):
    run(fedadp, {"alpha": ["five"]})
  with pytest.raises(ValueError, match="non-empty list"):
    run(fedadp, {"alpha": []})
  with pytest.raises(ValueError, match="seeds"):
    run(fedadp, {"alpha": [5.0]}, seeds=[])
  with pytest.raises(TypeError, match="build"):
    run(lambda h: "fedavg", None)
  with pytest.raises(ValueError, match="one per seed"):
    sweep.run_sweep(lambda h: aggregators.fedavg(), seeds=[0, 1], model=MODEL,
        data=[data], test_data=(x, y), **TRAIN, training=TRAINING)
  # The federation's size is the run's: a rule built for another is
  # refused before anything runs (run_context.bind).
  with pytest.raises(ValueError, match="num_clients=6 differs from the "
                     "federation's number of clients of the run"):
    run(lambda h: aggregators.fedadp(num_clients=int(h["n"])),
        {"n": [5, 6]})
  # A hyperparameter that sets a state shape cannot be swept in one call.
  with pytest.raises(ValueError, match="differs in shape"):
    run(lambda h: aggregators.fedavg()._replace(
        init=lambda params: jnp.zeros(int(h["n"]))), {"n": [5, 6]})


CONFIG = {
    "name": "tiny_sweep",
    "dataset": {"name": "fashion_mnist", "source": "files",
                "max_train_examples": 600, "max_test_examples": 200},
    "partition": {"name": "shards", "num_clients": 6},
    "model": {"name": "mlp2", "args": {"hidden": 16}},
    "train": {"rounds": 2, "participation": 0.5, "batch_size": 20,
              "learning_rate": 0.1, "eval_clients": False},
    "algorithms": {"FedProx": {"aggregator": "fedavg",
                               "objective": "fedprox",
                               "objective_args": {"mu": 0.1}}},
    "seeds": [0, 1],
}


def test_run_config_vmap_seeds_writes_the_runs_of_each_seed(tmp_path):
  try:
    data_lib.load("fashion_mnist", source="files")
  except data_lib.DatasetNotFoundError as e:
    pytest.skip(f"Fashion-MNIST files not installed: {e}")
  summary = experiment.run_config(CONFIG, str(tmp_path), progress=False,
                                  vmap_seeds=True)
  assert summary["FedProx"]["seeds"] == 2
  # Seed 1 has its own partition (shards are drawn from the seed).
  solo = experiment.run_algorithm(CONFIG, "FedProx", 1)
  saved = pd.read_csv(tmp_path / "seed1" / "history.csv")
  want = solo.history.to_dataframe()
  for column in ("test_accuracy", "test_loss", "train_loss"):
    np.testing.assert_allclose(saved[column], want[column], rtol=2e-5,
                               atol=2e-6, err_msg=column)
  assert (tmp_path / "seed0" / "history.csv").exists()


def test_experiment_grid_names_reach_the_aggregator_or_the_objective():
  config = experiment.override(CONFIG, {"algorithms.FedProx.aggregator":
                                        "fedadp"})
  aggregator, objective = experiment.build_rule(
      config, "FedProx", 6, {"alpha": 2.0, "mu": 0.0,
                             "learning_rate": 0.5})
  assert aggregator is not None and objective is not None
  with pytest.raises(ValueError, match="alpha must be > 0"):
    experiment.build_rule(config, "FedProx", 6, {"alpha": -2.0})
  with pytest.raises(ValueError, match="'gamma' is an argument neither"):
    experiment.build_rule(config, "FedProx", 6, {"gamma": 0.5})


def test_cli_and_script_flags():
  assert cli.parse_grid(["alpha=1,5.5", "lr=0.1"]) == {
      "alpha": [1, 5.5], "learning_rate": [0.1]}
  with pytest.raises(SystemExit):
    cli.parse_grid(["alpha"])
  args = cli.build_parser().parse_args(["--seeds", "0,1", "--sweep",
                                        "alpha=1,5"])
  assert args.seeds == "0,1" and args.sweep == ["alpha=1,5"]
  parser = experiment.script_parser("x")
  args = parser.parse_args(["--config", "c.json", "--vmap-seeds"])
  assert args.vmap_seeds
  assert sweep.member_name({"alpha": 5.0, "mu": 0.25}, 3) == (
      "alpha5_mu0.25_seed3")


def _member_key(member):
  return (tuple(sorted(member.hparams.items())), member.seed)


def test_sweep_resumes_and_extends_from_its_checkpoint(tmp_path):
  data, x, y, _ = tiny_data()
  grid = {"alpha": [1.0, 8.0]}
  build = lambda h: aggregators.fedadp(h["alpha"], num_clients=5)
  kwargs = dict(seeds=[0, 1], model=MODEL, data=data, test_data=(x, y),
                participation=0.6, training=TRAINING,
                execution=Execution(clients_per_step=2, progress=False),
                evaluation=Evaluation(clients=True))
  directory = str(tmp_path / "ckpt")
  sweep.run_sweep(build, grid, num_rounds=2, checkpointing=Checkpointing(
      directory, every=1), **kwargs)
  extended = sweep.run_sweep(build, grid, num_rounds=3,
                             checkpointing=Checkpointing(directory, every=1,
                                                         resume=True),
                             **kwargs)
  straight = sweep.run_sweep(build, grid, num_rounds=3, **kwargs)
  assert [_member_key(m) for m in extended] == [
      _member_key(m) for m in straight]
  for got, want in zip(extended, straight, strict=True):
    _assert_same_run(got, want)
  with pytest.raises(checkpoint.CheckpointMismatchError, match="grid"):
    sweep.run_sweep(build, {"alpha": [1.0, 9.0]}, num_rounds=3,
                    checkpointing=Checkpointing(directory, every=1,
                                                resume=True), **kwargs)


SHARDED_SWEEP = textwrap.dedent("""
    import jax
    import numpy as np
    from fedjax_agg import aggregators, sweep
    from fedjax_agg.config import Execution, LocalTraining
    from tests.test_engine import tiny_data
    from tests.test_sweep import MODEL, _assert_same_run
    assert jax.device_count() == 4, jax.devices()
    data, x, y, _ = tiny_data()
    kwargs = dict(seeds=[0, 1], model=MODEL, data=data, test_data=(x, y),
                  num_rounds=2, participation=0.6,
                  training=LocalTraining(epochs=2, batch_size=3))
    build = lambda h: aggregators.fedadp(h["alpha"], num_clients=5)
    grid = {"alpha": [1.0, 8.0]}
    plain = sweep.run_sweep(build, grid, **kwargs, execution=Execution(
        progress=False, devices=1))
    sharded = sweep.run_sweep(build, grid, **kwargs, execution=Execution(
        progress=False, devices=4))
    for a, b in zip(sharded, plain, strict=True):
      _assert_same_run(a, b, config_differs=("num_devices",))
      # Each member's config records the devices the members went on.
      assert a.history.config["num_devices"] == 4, a.history.config
      assert b.history.config["num_devices"] == 1, b.history.config
    # Config sweeps: with "train.devices" unset the members go on the most
    # devices that divide their count; an explicit count must divide it.
    import tempfile
    from fedjax_agg import experiment
    from tests.test_sweep import CONFIG
    config = experiment.override(CONFIG, {"seeds": [0, 1, 2]})
    calls = []
    real = sweep.run_sweep
    sweep.run_sweep = lambda *a, **k: calls.append(
        k["options"].execution.devices) or real(*a, **k)
    experiment.run_config(config, tempfile.mkdtemp(), progress=False,
                          vmap_seeds=True)
    assert calls == [1], calls  # gcd(3 members, 4 devices)
    try:
      experiment.run_config(
          experiment.override(config, {"train.devices": 2}),
          tempfile.mkdtemp(), progress=False, vmap_seeds=True)
      raise AssertionError("3 members on 2 devices were accepted")
    except ValueError as error:
      assert "multiple of the 2 devices" in str(error), error
    finally:
      sweep.run_sweep = real
    print("OK")
""")


def test_sweep_members_shard_over_devices():
  proc = subprocess.run([sys.executable, "-c", SHARDED_SWEEP], cwd=ROOT,
                        env=agg_testutil.device_env(4, ROOT),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_sweep_members_keep_their_own_client_state():
  data, test = _run_data()
  model = linear_model()
  training = RUN_TRAINING
  update = clients.ditto(model, training, lam=0.5)
  members = sweep.run_sweep(
      lambda h: aggregators.fedavg(), {"learning_rate": [0.1, 0.2]},
      seeds=[0], model=model, data=data, test_data=test, num_rounds=2,
      participation=0.5, training=training, execution=QUIET,
      local_update=update)
  for member, lr in zip(members, [0.1, 0.2], strict=True):
    alone = simulation.run(
        model, data, test, aggregators.fedavg(), num_rounds=2,
        participation=0.5, training=LocalTraining(
            epochs=1, batch_size=4, learning_rate=lr),
        execution=QUIET, local_update=update, seed=0)
    close(member.state.client_state,
          alone.state.client_state, atol=1e-6)
