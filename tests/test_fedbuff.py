"""Asynchronous buffered aggregation (FedBuff) as a run mode: the server
steps against an independent numpy recomputation over the run's own event
sequence, the degenerate cases, codecs, resume and refusals."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import clients
from fedjax_agg import compression
from fedjax_agg import fedbuff
from fedjax_agg import loop
from fedjax_agg import objectives
from fedjax_agg import rounds
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg.types import ClientInfo
from fedjax_agg.config import (Checkpointing, Evaluation, Execution,
                               LocalTraining, Privacy, Systems)
from tests.test_engine import reference_client
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

MODEL = tiny_model()
BATCH, EPOCHS, LR, SEED = 3, 2, 0.1, 3
SIZES = (7, 13, 4, 10, 1, 9, 6, 12)
SPEEDS = {"speed_median": 50.0, "speed_sigma": 1.0}
TRAINING = LocalTraining(batch_size=BATCH, epochs=EPOCHS, learning_rate=LR)


def _run(systems, aggregator=None, num_rounds=5, participation=0.375,
         sizes=SIZES, **kwargs):
  data, x, y, _ = tiny_data(sizes)
  return simulation.run(
      MODEL, data, (x, y), aggregator or aggregators.fedavg(),
      num_rounds=num_rounds, participation=participation, training=TRAINING,
      execution=Execution(progress=False), systems=systems, seed=SEED,
      **kwargs)


def _column(result, name):
  return [np.asarray(row[name]) for row in result.history.client_rows]


def _numpy_fedbuff(client_rows, sizes, weight, num_steps, equal=False):
  """FedBuff from the recorded events: each client trained alone from the
  version it started from (a Python loop of SGD steps), the server step
  x_{t+1} = x_t + sum_k p_k w(s_k) (x_k - x_{v_k}) in float64."""
  data, x, y, parts = tiny_data(sizes)
  init_key, state_key = loop.seed_keys(SEED)
  versions = [MODEL.init(init_key)]
  for r in range(num_steps):
    state_key, train_key, _, _ = jax.random.split(state_key, 4)
    ids = np.asarray(client_rows[r]["client_ids"])
    starts = np.asarray(client_rows[r]["start_version"])
    staleness = np.asarray(client_rows[r]["staleness"])
    np.testing.assert_array_equal(staleness, r - starts)
    counts = np.asarray([sizes[i] for i in ids], np.float64)
    p = (np.full(len(ids), 1.0 / len(ids)) if equal  # the paper's 1 / K
         else counts / counts.sum())
    current = versions[-1]
    total = jax.tree.map(lambda a: np.zeros(a.shape, np.float64), current)
    for k, client in enumerate(ids):
      start = versions[starts[k]]
      trained, _ = reference_client(
          MODEL, start, x, y, parts[client],
          jax.random.fold_in(train_key, int(client)), LR, BATCH, EPOCHS,
          10**6, objectives.cross_entropy(),
          TRAINING.optimizer)
      scale = p[k] * weight(staleness[k])
      total = jax.tree.map(
          lambda t, w, s, c=scale: t + c * (
              np.asarray(w, np.float64) - np.asarray(s, np.float64)),
          total, trained, start)
    versions.append(jax.tree.map(
        lambda c, t: (np.asarray(c, np.float64) + t).astype(np.float32),
        current, total))
  return versions[-1]


def test_server_steps_match_numpy_over_the_recorded_events():
  systems = Systems(concurrency=6, profiles="lognormal", profile_args=SPEEDS,
                    staleness="polynomial", staleness_args={"a": 0.5})
  result = _run(systems, num_rounds=5)
  staleness = np.concatenate(_column(result, "staleness"))
  assert staleness.max() >= 1  # stale updates, weighted below 1
  expected = _numpy_fedbuff(result.history.client_rows, SIZES,
                            lambda s: (1.0 + s) ** -0.5, 5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                       atol=1e-6),
               result.state.params, expected)
  rows = result.history.rows[1:]
  for row, s in zip(rows, _column(result, "staleness"), strict=True):
    assert row["staleness_mean"] == pytest.approx(s.mean())
    assert row["staleness_max"] == s.max()
  times = [row["sim_time_s"] for row in rows]
  assert times == sorted(times) and times[0] > 0


def test_the_papers_equal_weighting_is_fedavg_uniform():
  # FedBuff (Nguyen et al. 2022, Alg. 1) averages the buffer with 1 / K;
  # the async mode keeps the run's rule, so that weighting is
  # fedavg(weighting="uniform") (docs/systems.md, "Asynchronous buffered
  # aggregation").
  systems = Systems(concurrency=6, profiles="lognormal", profile_args=SPEEDS)
  result = _run(systems, aggregators.fedavg(weighting="uniform"),
                num_rounds=4)
  expected = _numpy_fedbuff(result.history.client_rows, SIZES,
                            lambda s: (1.0 + s) ** -0.5, 4, equal=True)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                       atol=1e-6),
               result.state.params, expected)


def test_equal_tasks_and_c_equal_to_k_is_the_synchronous_round():
  sizes = (6,) * 8
  result = _run(Systems(concurrency=3), sizes=sizes, num_rounds=4)
  assert all((s == 0).all() for s in _column(result, "staleness"))
  # The synchronous round over the same cohorts, from the same state.
  data, _, _, _ = tiny_data(sizes)
  init_key, run_key = loop.seed_keys(SEED)
  aggregator = aggregators.fedavg()
  state = rounds.init_state(MODEL.init(init_key), aggregator)._replace(
      key=run_key)
  round_fn = rounds.make_round_fn(MODEL, aggregator, TRAINING,
                                  execution=Execution(stream=False))
  for clients_row in result.history.client_rows:
    cohort = jnp.asarray(clients_row["client_ids"])
    state, _ = round_fn(state, data, cohort, jnp.ones(cohort.shape))
  jax.tree.map(np.testing.assert_array_equal, result.state.params,
               state.params)


def test_columns_count_every_message():
  result = _run(Systems(concurrency=5, profiles="lognormal",
                        profile_args=SPEEDS), num_rounds=4)
  size = sum(leaf.size * 4 for leaf in jax.tree.leaves(result.state.params))
  k = 3
  for r, row in enumerate(result.history.rows[1:], start=1):
    # Always online: no drops, no discards; every finish restarts a client.
    assert row["dropped"] == 0 and row["stale"] == 0
    assert row["uplink_bytes"] == k * r * size
    assert row["downlink_bytes"] == (k * r + 5) * size


def test_identity_codec_and_server_optimizer_compose():
  systems = Systems(concurrency=5, profiles="lognormal", profile_args=SPEEDS)
  plain = _run(systems, num_rounds=3)
  coded = _run(dataclasses.replace(systems, codec="identity"), num_rounds=3)
  jax.tree.map(np.testing.assert_array_equal, coded.state.params,
               plain.state.params)
  quantised = _run(dataclasses.replace(systems, codec="uniform",
                                       codec_args={"bits": 2}), num_rounds=3)
  message = compression.message_bytes(compression.get("uniform", bits=2),
                                      plain.state.params)
  assert quantised.history.rows[-1]["uplink_bytes"] == 3 * 3 * message
  assert message < plain.history.rows[-1]["uplink_bytes"] / 9 / 5
  # One step from version 0: the server learning rate scales the move.
  one = _run(systems, num_rounds=1)
  doubled = _run(systems, aggregator=aggregators.with_server_optimizer(
      aggregators.fedavg(), optax.sgd(2.0)), num_rounds=1)
  init = MODEL.init(loop.seed_keys(SEED)[0])
  jax.tree.map(lambda d, o, x0: np.testing.assert_allclose(
      d - x0, 2 * (o - x0), rtol=1e-5, atol=1e-7),
      doubled.state.params, one.state.params, init)


def test_resume_equals_the_uninterrupted_run(tmp_path):
  systems = Systems(concurrency=6, profiles="lognormal", profile_args=SPEEDS,
                    availability="markov",
                    availability_args={"mean_online_s": 2.0,
                                       "mean_offline_s": 1.0})
  every = Evaluation(clients=True)
  full = _run(systems, num_rounds=4, evaluation=every)
  directory = str(tmp_path / "ckpt")
  _run(systems, num_rounds=2, evaluation=every,
       checkpointing=Checkpointing(directory=directory, every=1))
  resumed = _run(systems, num_rounds=4, evaluation=every,
                 checkpointing=Checkpointing(directory=directory, every=1,
                                             resume=True))
  strip = lambda rows: [{k: v for k, v in row.items() if k != "time_s"}
                        for row in rows]
  assert strip(resumed.history.rows) == strip(full.history.rows)
  jax.tree.map(np.testing.assert_array_equal, resumed.state.params,
               full.state.params)
  with pytest.raises(checkpoint.CheckpointMismatchError):
    _run(dataclasses.replace(systems, concurrency=5), num_rounds=4,
         evaluation=every,
         checkpointing=Checkpointing(directory=directory, resume=True))


def test_ring_holds_the_versions_clients_start_from():
  aggregator = fedbuff.buffered(aggregators.fedavg(), 3)
  params = {"w": jnp.zeros((2,))}
  state = aggregator.init(params)
  info = lambda r: ClientInfo(
      jnp.zeros(1, jnp.int32), jnp.ones(1), jnp.ones(1), jnp.zeros(1),
      jnp.zeros(1), jnp.asarray(r, jnp.int32), jax.random.key(0))
  step = jax.jit(aggregator.aggregate)
  for r in range(1, 5):
    params, state, _ = step(params, {"w": jnp.full((1, 2), float(r))},
                            info(r), state)
  # Versions 2, 3, 4 at slots 2, 0, 1.
  np.testing.assert_array_equal(state.versions["w"][:, 0], [3.0, 4.0, 2.0])


def test_refusals_name_the_argument():
  systems = Systems(concurrency=4)
  with pytest.raises(ValueError, match="local_update: asynchronous"):
    _run(systems, local_update=clients.scaffold(MODEL, TRAINING))
  with pytest.raises(ValueError, match="stream=True"):
    data, x, y, _ = tiny_data(SIZES)
    simulation.run(MODEL, data, (x, y), aggregators.fedavg(), num_rounds=1,
                   participation=0.375, training=TRAINING,
                   execution=Execution(progress=False, stream=True),
                   systems=systems)
  with pytest.raises(ValueError, match="privacy accountant"):
    _run(systems, aggregator=aggregators.dp_fedavg(1.0, 1.0),
         privacy=Privacy())
  with pytest.raises(ValueError, match="concurrency=2 must lie between"):
    _run(Systems(concurrency=2))
  with pytest.raises(ValueError, match="concurrency=9 must lie between"):
    _run(Systems(concurrency=9))
  with pytest.raises(ValueError, match="over_selection: asynchronous"):
    Systems(concurrency=4, over_selection=0.5)
  with pytest.raises(ValueError, match="error_feedback: not available"):
    Systems(concurrency=4, codec="sign", error_feedback=True)
  with pytest.raises(ValueError, match="staleness='hinge' applies to"):
    Systems(staleness="hinge")
  # Names and their arguments are checked where their objects are built,
  # once a run (clock.built), before its first round.
  from fedjax_agg import clock  # pylint: disable=g-import-not-at-top
  with pytest.raises(clock.SystemsError,
                     match="staleness_args: a must be >= 0"):
    clock.built(Systems(concurrency=4, staleness_args={"a": -1.0}))
  with pytest.raises(ValueError, match="staleness_args: a must be >= 0"):
    _run(Systems(concurrency=4, staleness_args={"a": -1.0}))
  with pytest.raises(ValueError, match="staleness must be one of"):
    _run(Systems(concurrency=4, staleness="linear"))
  with pytest.raises(ValueError, match="max_staleness"):
    Systems(concurrency=4, max_staleness=-1)
  with pytest.raises(ValueError, match="systems: a sweep"):
    data, x, y, _ = tiny_data(SIZES)
    sweep.run_sweep(lambda h: aggregators.fedavg(), seeds=(0, 1),
                    model=MODEL, data=data, test_data=(x, y), num_rounds=1,
                    execution=Execution(progress=False), systems=systems)


def test_flags_and_config_keys_reach_the_same_systems():
  from fedjax_agg import cli  # pylint: disable=g-import-not-at-top
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import spec  # pylint: disable=g-import-not-at-top
  args, given = cli.parse([
      "--aggregator", "fedavg", "--concurrency", "6", "--staleness", "hinge",
      "--staleness-arg", "b=2", "--max-staleness", "5"])
  config, _ = cli.resolve(args, given)
  config = config.to_dict(written_out=False)
  assert config["systems"] == {"concurrency": 6, "staleness": "hinge",
                               "staleness_args": {"b": 2},
                               "max_staleness": 5}
  built = spec.Experiment.from_dict(config)
  assert Systems(**dataclasses.asdict(built.systems)) == Systems(
      concurrency=6, staleness="hinge", staleness_args={"b": 2},
      max_staleness=5)
  for block, path in (({"staleness": "hinge"}, "systems.staleness"),
                      ({"concurrency": 0}, "systems.concurrency"),
                      ({"concurrency": 4, "staleness_args": {"a": -2}},
                       "systems.staleness_args"),
                      ({"max_staleness": 3}, "systems.max_staleness"),
                      ({"concurrency": 4, "deadline_s": 3.0},
                       "systems")):
    with pytest.raises(spec.ConfigError, match=path):
      experiment.check_config({**config, "systems": block})
