"""Runs with privacy accounting: the epsilon column, Poisson cohorts and
the stop at a target epsilon."""

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import privacy
from fedjax_agg import sampling
from fedjax_agg import simulation
from fedjax_agg.config import Execution, Privacy
from tests.clients.test_clients import _run_data, linear_model

QUIET = Execution(clients_per_step=2, progress=False)


def test_poisson_cohort_draws_each_client_with_the_rate():
  num_clients, rate, capacity = 50, 0.2, 30
  draws = [sampling.poisson_cohort(jax.random.key(i), num_clients, rate,
                                   capacity) for i in range(400)]
  joined = np.zeros(num_clients)
  for ids, mask, count in draws:
    ids, mask, count = np.asarray(ids), np.asarray(mask), int(count)
    real = ids[mask > 0]
    assert len(real) == count and len(set(real.tolist())) == count
    assert list(real) == sorted(real)
    joined[real] += 1
  freq = joined / len(draws)
  # Every client's frequency near q (binomial sd = 0.02 for 400 draws).
  assert np.all(np.abs(freq - rate) < 0.1), freq
  assert abs(freq.mean() - rate) < 0.01


def test_poisson_capacity_covers_the_draws():
  assert sampling.poisson_capacity(1000, 0.1) == 158  # 100 + 6 * 9.49
  assert sampling.poisson_capacity(10, 1.0) == 10


def _run(priv, num_rounds=4, participation=0.5):
  data, test = _run_data()
  # Under Poisson sampling the rule divides by the expected cohort size
  # q N = m = floor(participation N) (McMahan et al. 2018).
  expected = (float(int(participation * 6)) if priv.sampling == "poisson"
              else None)
  return simulation.run(
      linear_model(), data, test,
      aggregators.dp_fedavg(clip_norm=1.0,
                            noise_multiplier=priv.noise_multiplier,
                            expected_clients=expected),
      num_rounds=num_rounds, participation=participation, execution=QUIET,
      privacy=priv, seed=0)


def test_epsilon_column_equals_the_accountant():
  result = _run(Privacy(1.2, delta=1e-5))
  got = [row["epsilon"] for row in result.history.rows[1:]]
  want = privacy.epsilons(1.2, 4, num_clients=6, cohort_size=3,
                          delta=1e-5)
  np.testing.assert_allclose(got, want, rtol=1e-12)
  assert result.history.config["privacy"]["final_epsilon"] == want[-1]


def test_poisson_runs_are_accounted_as_poisson_and_record_the_padding():
  # Three rounds (PLD composes one round at a time): seed 0 draws cohorts
  # of 3, 0 and 2 clients.
  result = _run(Privacy(1.0, sampling="poisson", accountant="pld"),
                num_rounds=3)
  got = [row["epsilon"] for row in result.history.rows[1:]]
  want = privacy.epsilons(1.0, 3, num_clients=6, cohort_size=3,
                          delta=1e-5, sampling="poisson", accountant="pld")
  np.testing.assert_allclose(got, want, rtol=1e-9)
  sizes = [int(np.sum(row.get("mask", np.ones(len(row["client_ids"])))))
           for row in result.history.client_rows]
  assert len(set(sizes)) > 1  # cohorts of varying size


def test_target_epsilon_ends_the_run_early():
  want = privacy.epsilons(1.0, 6, num_clients=6, cohort_size=3, delta=1e-5)
  target = float((want[2] + want[3]) / 2)
  with pytest.warns(UserWarning, match="ends there"):
    result = _run(Privacy(1.0, target_epsilon=target), num_rounds=6)
  assert [row["round"] for row in result.history.rows] == [0, 1, 2, 3]
  assert int(result.state.round) == 3
  assert result.history.config["privacy"]["rounds_run"] == 3
  with pytest.raises(ValueError, match="single round"):
    _run(Privacy(1.0, target_epsilon=float(want[0]) / 2))


@pytest.mark.parametrize("kwargs,name", [
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier"),
    (dict(noise_multiplier=1.0, delta=0.0), "delta"),
    (dict(noise_multiplier=1.0, accountant="moments"), "accountant"),
    (dict(noise_multiplier=1.0, sampling="shuffle"), "sampling"),
    (dict(noise_multiplier=1.0, accountant="pld"), "pld"),
    (dict(noise_multiplier=1.0, target_epsilon=0.0), "target_epsilon"),
])
def test_privacy_config_names_the_bad_field(kwargs, name):
  with pytest.raises(ValueError, match=name):
    Privacy(**kwargs)


def test_run_refuses_a_privacy_that_is_not_one():
  data, test = _run_data()
  with pytest.raises(TypeError, match="privacy"):
    simulation.run(linear_model(), data, test, aggregators.fedavg(),
                   num_rounds=1, execution=QUIET, privacy={"delta": 1e-5})


# ------------------------------------------------ sweeps: one accounting each


def _dp_sweep(priv, grid, num_rounds=4):
  from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
  data, test = _run_data()
  return sweep.run_sweep(
      lambda h: aggregators.dp_fedavg(clip_norm=1.0,
                                      noise_multiplier=h["noise"]),
      grid, seeds=[0, 1], model=linear_model(), data=data, test_data=test,
      num_rounds=num_rounds, participation=0.5, execution=QUIET,
      privacy=priv)


def test_sweep_members_are_accounted_from_their_own_rule():
  members = _dp_sweep(Privacy(delta=1e-5), {"noise": [0.8, 1.5]})
  assert len(members) == 4
  for member in members:
    z = member.hparams["noise"]
    got = [row["epsilon"] for row in member.history.rows[1:]]
    want = privacy.epsilons(z, 4, num_clients=6, cohort_size=3, delta=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    recorded = member.history.config["privacy"]
    assert recorded["noise_multiplier"] == pytest.approx(z)
    assert recorded["final_epsilon"] == pytest.approx(want[-1])
  # A member equals the one run with its seed and rule, epsilon included.
  alone = _run(Privacy(0.8, delta=1e-5))
  np.testing.assert_allclose(
      [row["epsilon"] for row in members[0].history.rows[1:]],
      [row["epsilon"] for row in alone.history.rows[1:]], rtol=1e-6)
  np.testing.assert_allclose(members[0].history.column("test_loss"),
                             alone.history.column("test_loss"), rtol=1e-5)


def test_sweeps_refuse_what_members_cannot_share():
  with pytest.raises(ValueError, match="vmapped call cannot share"):
    _dp_sweep(Privacy(delta=1e-5, sampling="poisson"), {"noise": [1.0]})
  # z = 0.8 passes epsilon 20 before z = 3.0 does: one vmapped call
  # cannot end its members at different rounds.
  with pytest.raises(ValueError, match="different numbers of rounds"):
    _dp_sweep(Privacy(delta=1e-5, target_epsilon=float(
        privacy.epsilons(0.8, 30, num_clients=6, cohort_size=3,
                         delta=1e-5)[9])), {"noise": [0.8, 3.0]},
              num_rounds=30)
  with pytest.raises(ValueError, match="no calibrated Gaussian noise"):
    from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
    data, test = _run_data()
    sweep.run_sweep(lambda h: aggregators.fedavg(), None, seeds=[0, 1],
                    model=linear_model(), data=data, test_data=test,
                    num_rounds=1, execution=QUIET, privacy=Privacy())
