"""A run on the simulated clock (``config.Systems``): columns, cohorts,
codecs, degenerate cases and refusals, against numpy recomputations."""

import dataclasses

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import compression
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg import systems as systems_lib
from fedjax_agg.config import (Checkpointing, Evaluation, Execution,
                               LocalTraining, Privacy, Systems)
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

MODEL = tiny_model()
ROUNDS = 3
BATCH, EPOCHS = 3, 2
SIZES = (7, 13, 4, 10, 1, 9, 6, 12)


def _run(systems=None, aggregator=None, rounds=ROUNDS, participation=0.5,
         stream=None, **kwargs):
  data, x, y, _ = tiny_data(SIZES)
  return simulation.run(
      MODEL, data, (x, y), aggregator or aggregators.fedavg(),
      num_rounds=rounds, participation=participation,
      training=LocalTraining(batch_size=BATCH, epochs=EPOCHS,
                             learning_rate=0.1),
      execution=Execution(progress=False, stream=stream), systems=systems,
      seed=3,
      **kwargs)


def _strip(rows, extra=("time_s", "sim_time_s", "uplink_bytes",
                        "downlink_bytes", "dropped", "compression_error")):
  return [{k: v for k, v in row.items() if k not in extra} for row in rows]


def _mask(clients):
  """A client row's mask (written only when some row is padding)."""
  return np.asarray(clients.get("mask", np.ones(len(clients["client_ids"]))))


def _model_bytes(params):
  return sum(leaf.size * leaf.dtype.itemsize
             for leaf in jax.tree.leaves(params))


@pytest.fixture(scope="module")
def plain():
  return _run()


def test_measuring_clock_keeps_the_run_and_adds_exact_columns(plain):
  profiles = {"speed_median": 50.0, "speed_sigma": 1.0,
              "uplink_median": 2e3, "uplink_sigma": 0.5,
              "downlink_median": 8e3, "downlink_sigma": 0.5}
  timed = _run(Systems(profiles="lognormal", profile_args=profiles, seed=5))
  assert _strip(timed.history.rows) == _strip(plain.history.rows)
  jax.tree.map(np.testing.assert_array_equal, timed.state.params,
               plain.state.params)
  # Independent recomputation of the clock from the recorded cohorts.
  population = systems_lib.lognormal_profiles(len(SIZES), 5, **profiles)
  size = _model_bytes(plain.state.params)
  t = up = down = 0.0
  for r, clients in enumerate(plain.history.client_rows):
    ids = np.asarray(clients["client_ids"])
    examples = -(-np.asarray(SIZES)[ids] // BATCH) * BATCH * EPOCHS
    times = (examples / population.speed[ids] + size
             / population.downlink[ids] + size / population.uplink[ids])
    t += times.max()
    up += size * ids.size
    down += size * ids.size
    row = timed.history.rows[r + 1]
    np.testing.assert_allclose(row["sim_time_s"], t, rtol=1e-12)
    assert row["uplink_bytes"] == up and row["downlink_bytes"] == down
    assert row["dropped"] == 0


def test_identity_codec_equals_no_codec_bit_for_bit():
  # A codec hands the rule stacked models (never a stream): the run
  # without it is compared in the same form.
  plain = _run(stream=False)
  coded = _run(Systems(codec="identity"))
  assert all(row["compression_error"] == 0.0
             for row in coded.history.rows[1:])
  assert _strip(coded.history.rows) == _strip(plain.history.rows)
  jax.tree.map(np.testing.assert_array_equal, coded.state.params,
               plain.state.params)


def test_codec_bytes_and_error_feedback_residuals():
  systems = Systems(codec="uniform", codec_args={"bits": 4},
                    error_feedback=True)
  result = _run(systems)
  message = compression.message_bytes(compression.uniform(4),
                                      result.state.params)
  cohort = 4  # floor(0.5 * 8)
  for r in range(1, ROUNDS + 1):
    assert result.history.rows[r]["uplink_bytes"] == r * cohort * message
  assert message < _model_bytes(result.state.params) / 4
  residuals = result.state.client_state.residuals
  sampled = set()
  for clients in result.history.client_rows:
    sampled |= set(np.asarray(clients["client_ids"]).tolist())
  norms = np.sqrt(sum(np.square(np.asarray(leaf)).reshape(len(SIZES), -1)
                      .sum(1) for leaf in jax.tree.leaves(residuals)))
  # Every client that sent an update keeps a residual; no other does.
  assert set(np.flatnonzero(norms > 0).tolist()) == sampled


def test_over_selection_aggregates_the_fastest_and_ends_with_them():
  profiles = {"speed_median": 20.0, "speed_sigma": 1.5}
  systems = Systems(profiles="lognormal", profile_args=profiles,
                    over_selection=0.5, seed=1)
  result = _run(systems)
  population = systems_lib.lognormal_profiles(len(SIZES), 1, **profiles)
  size = _model_bytes(result.state.params)
  t = 0.0
  for r, clients in enumerate(result.history.client_rows):
    ids = np.asarray(clients["client_ids"])
    mask = _mask(clients) > 0
    assert ids.size == 6 and mask.sum() == 4  # ceil(4 * 1.5) selected
    examples = -(-np.asarray(SIZES)[ids] // BATCH) * BATCH * EPOCHS
    times = (examples / population.speed[ids] + size
             / population.downlink[ids] + size / population.uplink[ids])
    assert set(ids[mask]) == set(ids[np.argsort(times, kind="stable")[:4]])
    t += times[mask].max()
    np.testing.assert_allclose(result.history.rows[r + 1]["sim_time_s"], t,
                               rtol=1e-12)
    assert result.history.rows[r + 1]["dropped"] == 0


def test_over_selection_is_bounded_and_beyond_n_selects_everyone():
  """An over-selection too large to be a number of clients is refused by
  name when the Systems is built (not as numpy's "maximum allowed
  dimension" in the run); one that asks for more than the N = 8 clients
  selects all of them: 8 rows a round, the run of x = 1 (m = 4, 8 rows)."""
  for bad in (1e300, 150.0):
    with pytest.raises(ValueError, match=r"^over_selection must be .*"
                       r"MAX_OVER_SELECTION = 100\]"):
      _run(Systems(over_selection=bad))
  profiles = {"speed_median": 20.0, "speed_sigma": 1.5}
  beyond = _run(Systems(profiles="lognormal", profile_args=profiles,
                        over_selection=100.0, seed=1))
  exactly = _run(Systems(profiles="lognormal", profile_args=profiles,
                         over_selection=1.0, seed=1))
  for clients in beyond.history.client_rows:
    assert len(clients["client_ids"]) == len(SIZES)
    assert (_mask(clients) > 0).sum() == 4
  for got, want in zip(beyond.history.client_rows,
                       exactly.history.client_rows, strict=True):
    assert got.keys() == want.keys()
    for key in got:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  assert _strip(beyond.history.rows, ("time_s",)) == _strip(
      exactly.history.rows, ("time_s",))


def test_fednova_on_a_secure_sum_is_refused_with_the_cause_first():
  with pytest.raises(ValueError, match=r"^secure aggregation cannot run "
                     r"fednova: "):
    _run(Systems(secagg_bits=16),
         aggregator=aggregators.fednova(learning_rate=0.1), rounds=1)


def test_deadline_drops_the_late_and_availability_the_offline():
  systems = Systems(profiles="lognormal",
                    profile_args={"speed_median": 5.0, "speed_sigma": 1.0},
                    availability="markov",
                    availability_args={"mean_online_s": 30.0,
                                       "mean_offline_s": 30.0},
                    deadline_s=8.0, seed=2)
  result = _run(systems, rounds=4)
  speed = systems_lib.lognormal_profiles(len(SIZES), 2, speed_median=5.0,
                                         speed_sigma=1.0)
  size = _model_bytes(result.state.params)
  examples = -(-np.asarray(SIZES) // BATCH) * BATCH * EPOCHS
  task = (examples / speed.speed + size / speed.downlink
          + size / speed.uplink)
  assert (task > 8.0).any() and (task <= 8.0).any()  # the deadline bites
  start, dropped = 0.0, 0
  for r, clients in enumerate(result.history.client_rows):
    accepted = np.asarray(clients["client_ids"])[_mask(clients) > 0]
    row = result.history.rows[r + 1]
    # Only clients whose task fits the deadline are aggregated; the others
    # selected are dropped (late or offline), never aggregated.
    assert (task[accepted] <= 8.0).all()
    assert accepted.size + row["dropped"] <= 4
    assert row["sim_time_s"] >= start
    start = row["sim_time_s"]
    dropped += row["dropped"]
  assert dropped > 0
  assert np.all(np.diff([row["sim_time_s"]
                         for row in result.history.rows[1:]]) >= 0)
  assert result.history.config["systems"]["deadline_s"] == 8.0


def test_resume_and_extension_replay_the_same_plan(tmp_path):
  systems = Systems(profiles="lognormal", over_selection=0.25,
                    availability="markov",
                    availability_args={"mean_online_s": 50.0,
                                       "mean_offline_s": 20.0}, seed=4)
  # Client losses every round: a schedule that does not depend on R.
  every = Evaluation(clients=True)
  full = _run(systems, rounds=4, evaluation=every)
  directory = str(tmp_path / "ckpt")
  _run(systems, rounds=2, evaluation=every,
       checkpointing=Checkpointing(directory=directory, every=1))
  resumed = _run(systems, rounds=4, evaluation=every,
                 checkpointing=Checkpointing(directory=directory, every=1,
                                             resume=True))
  assert _strip(resumed.history.rows, ("time_s",)) == _strip(
      full.history.rows, ("time_s",))
  with pytest.raises(checkpoint.CheckpointMismatchError):
    _run(dataclasses.replace(systems, seed=5), rounds=4, evaluation=every,
         checkpointing=Checkpointing(directory=directory, resume=True))


def test_resume_needs_the_same_trace_content_not_just_its_path(tmp_path):
  trace = tmp_path / "speeds.csv"
  rows = lambda speed: "client_id,speed,uplink,downlink\n" + "".join(
      f"{i},{speed + i},1000,4000\n" for i in range(len(SIZES)))
  trace.write_text(rows(20.0))
  systems = Systems(profiles="trace", profile_args={"path": str(trace)})
  directory = str(tmp_path / "ckpt")
  _run(systems, rounds=1,
       checkpointing=Checkpointing(directory=directory, every=1))
  trace.write_text(rows(30.0))  # same path, other clients
  with pytest.raises(checkpoint.CheckpointMismatchError,
                     match="systems_traces"):
    _run(systems, rounds=2,
         checkpointing=Checkpointing(directory=directory, resume=True))


def test_zero_rounds_on_the_clock_evaluate_the_initial_model():
  result = _run(Systems(over_selection=0.5), rounds=0)
  assert [row["round"] for row in result.history.rows] == [0]


def test_refusals_name_the_argument(tmp_path):
  data, x, y, _ = tiny_data(SIZES)
  with pytest.raises(ValueError, match="systems: a sweep"):
    sweep.run_sweep(lambda h: aggregators.fedavg(), seeds=(0, 1),
                    model=MODEL, data=data, test_data=(x, y), num_rounds=1,
                    execution=Execution(progress=False),
                    systems=Systems())
  with pytest.raises(TypeError, match="systems must be a config.Systems"):
    _run({"codec": "uniform"})
  with pytest.raises(ValueError, match="privacy accountant"):
    _run(Systems(over_selection=0.5),
         aggregator=aggregators.dp_fedavg(1.0, 1.0),
         privacy=Privacy())
  empty = tmp_path / "never.csv"
  empty.write_text("client_id,start_s,end_s\n")
  with pytest.raises(ValueError, match="online"):
    _run(Systems(availability="intervals",
                 availability_args={"path": str(empty)}))
  for bad, match in ((dict(over_selection=-0.1), "over_selection"),
                     (dict(deadline_s=0.0), "deadline_s"),
                     (dict(codec="qsgd", codec_args={"bits": 1}), "bits"),
                     (dict(codec="uniform", codec_args={"bitz": 2}),
                      "bitz"),
                     (dict(profiles="lognormal",
                           profile_args={"speed_sigma": -1.0}), "sigma"),
                     (dict(profiles="trace", profile_args={}), "path"),
                     (dict(error_feedback=True), "needs a codec"),
                     (dict(availability="sometimes"), "availability")):
    with pytest.raises((ValueError, TypeError), match=match):
      _run(Systems(**bad))


def test_flags_config_and_python_build_the_same_systems():
  from fedjax_agg import cli  # pylint: disable=g-import-not-at-top
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import spec  # pylint: disable=g-import-not-at-top
  args, given = cli.parse([
      "--aggregator", "fedavg", "--profiles", "lognormal", "--profile-arg",
      "speed_sigma=1.5", "--over-selection", "0.3", "--codec", "qsgd",
      "--codec-arg", "bits=3", "--error-feedback"])
  config, _ = cli.resolve(args, given)
  config = config.to_dict(written_out=False)
  assert config["systems"] == {
      "profiles": "lognormal", "profile_args": {"speed_sigma": 1.5},
      "over_selection": 0.3, "codec": "qsgd", "codec_args": {"bits": 3},
      "error_feedback": True}
  built = spec.Experiment.from_dict(config)
  assert Systems(**dataclasses.asdict(built.systems)) == Systems(
      profiles="lognormal", profile_args={"speed_sigma": 1.5},
      over_selection=0.3, codec="qsgd", codec_args={"bits": 3},
      error_feedback=True)
  # Without systems flags the section is absent.
  args, given = cli.parse(["--aggregator", "fedavg"])
  assert cli.resolve(args, given)[0].systems is None
  for block, path in (({"profile_args": {"speed_sigma": 1.0}},
                       "systems.profile_args"),
                      ({"codec": "uniform", "codec_args": {"bits": 40}},
                       "systems.codec_args"),
                      ({"error_feedback": True}, "systems.error_feedback"),
                      ({"deadline_s": -1}, "systems.deadline_s"),
                      ({"codecs": "sign"}, "systems.codecs")):
    with pytest.raises(spec.ConfigError, match=path):
      experiment.check_config({**config, "systems": block})
