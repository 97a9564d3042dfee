"""Privacy accounting (fedjax_agg.privacy) against dp_accounting itself."""

import math

import dp_accounting
from dp_accounting import pld
from dp_accounting import rdp
import numpy as np
import pytest

from fedjax_agg import privacy
from tests._util import _direct_epsilons
from tests._util import SPECIAL

N, M, DELTA = 1000, 50, 1e-5
WOR = dict(num_clients=N, cohort_size=M, delta=DELTA)


def _direct(sigma, rounds, sampling, accountant):
  """The same events built by hand and composed round by round."""
  gaussian = dp_accounting.GaussianDpEvent(sigma)
  if sampling == "poisson":
    event = dp_accounting.PoissonSampledDpEvent(M / N, gaussian)
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
  else:
    event = dp_accounting.SampledWithoutReplacementDpEvent(N, M, gaussian)
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
  ledger = (rdp.RdpAccountant(neighboring_relation=relation)
            if accountant == "rdp"
            else pld.PLDAccountant(neighboring_relation=relation))
  values = []
  for _ in range(rounds):
    ledger.compose(event)
    values.append(ledger.get_epsilon(DELTA))
  return np.asarray(values)


@pytest.mark.parametrize("sampling,accountant", [
    ("without_replacement", "rdp"), ("poisson", "rdp"), ("poisson", "pld")])
@pytest.mark.parametrize("sigma", [0.8, 2.0])
def test_epsilons_match_dp_accounting_round_by_round(sampling, accountant,
                                                     sigma):
  # Three rounds: rounds 2 and 3 each compose one more round in, as six
  # would; PLD's cost grows with every round composed.
  rounds = 3
  expected = _direct(sigma, rounds, sampling, accountant)
  got = privacy.epsilons(sigma, rounds, sampling=sampling,
                         accountant=accountant, **WOR)
  assert got.shape == (rounds,)
  np.testing.assert_allclose(got, expected, rtol=1e-9 if accountant == "rdp"
                             else 1e-6)
  # One value composes all rounds at once (PLD: a self-composition, up to
  # discretization).
  single = privacy.epsilon(sigma, rounds, sampling=sampling,
                           accountant=accountant, **WOR)
  np.testing.assert_allclose(single, expected[-1],
                             rtol=1e-9 if accountant == "rdp" else 1e-2)


def test_full_participation_is_the_plain_gaussian_mechanism():
  got = privacy.epsilon(1.5, 10, num_clients=20, cohort_size=20,
                        delta=DELTA, sampling="poisson")
  ledger = rdp.RdpAccountant()
  ledger.compose(dp_accounting.GaussianDpEvent(1.5), 10)
  np.testing.assert_allclose(got, ledger.get_epsilon(DELTA), rtol=1e-12)


def test_monotone_in_rounds_and_decreasing_in_sigma():
  values = privacy.epsilons(1.0, 40, **WOR)
  assert np.all(np.diff(values) > 0)
  by_sigma = [privacy.epsilon(s, 20, **WOR) for s in (0.5, 1.0, 1.2, 3.0)]
  assert np.all(np.diff(by_sigma) < 0)
  # Fewer clients sampled per round: less privacy spent.
  assert privacy.epsilon(1.0, 20, num_clients=N, cohort_size=10,
                         delta=DELTA) < by_sigma[1]


def test_zero_noise_gives_infinite_epsilon():
  assert privacy.epsilon(0.0, 3, **WOR) == math.inf
  assert np.all(np.isinf(privacy.epsilons(0.0, 3, **WOR)))
  assert privacy.rounds_for_epsilon(5.0, 0.0, **WOR) == 0


@pytest.mark.parametrize("target", [0.5, 2.0, 8.0])
def test_rounds_for_epsilon_is_the_last_round_within_the_target(target):
  rounds = privacy.rounds_for_epsilon(target, 1.0, **WOR)
  # epsilon at R and R + 1 alone (epsilons(1.0, R + 1) would compute every
  # round before them: thousands for the largest target).
  after = privacy.epsilon(1.0, rounds + 1, **WOR)
  if rounds == 0:
    assert after > target
  else:
    assert privacy.epsilon(1.0, rounds, **WOR) <= target < after


def test_rounds_for_epsilon_stops_at_max_rounds():
  assert privacy.rounds_for_epsilon(1e6, 5.0, max_rounds=37, **WOR) == 37


@pytest.mark.parametrize("kwargs,arg", [
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier"),
    (dict(num_rounds=0), "num_rounds"),
    (dict(num_rounds=2.0), "num_rounds"),
    (dict(num_clients=0), "num_clients"),
    (dict(cohort_size=N + 1), "cohort_size"),
    (dict(cohort_size=0), "cohort_size"),
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(sampling="shuffle"), "sampling"),
    (dict(accountant="moments"), "accountant"),
    (dict(accountant="pld"), "accountant='pld'"),
])
@pytest.mark.parametrize("function", [privacy.epsilon, privacy.epsilons])
def test_bad_arguments_name_the_argument(function, kwargs, arg):
  arguments = dict(noise_multiplier=1.0, num_rounds=3, **WOR)
  arguments.update(kwargs)
  with pytest.raises((ValueError, TypeError), match=arg):
    function(arguments.pop("noise_multiplier"), arguments.pop("num_rounds"),
             **arguments)


def test_rounds_for_epsilon_checks_its_own_arguments():
  with pytest.raises(ValueError, match="target_epsilon"):
    privacy.rounds_for_epsilon(0.0, 1.0, **WOR)
  with pytest.raises(ValueError, match="max_rounds"):
    privacy.rounds_for_epsilon(1.0, 1.0, max_rounds=0, **WOR)


@pytest.mark.parametrize("restart_every", [None, 1, 2, 3])
def test_tree_epsilons_equal_dp_accounting(restart_every):
  cohorts = np.array([[0, 1], [2, 3], [0, 4], [1, 5], [0, 2], [3, 4],
                      [0, 5]])
  got = privacy.tree_epsilons(1.3, cohorts, delta=1e-5,
                              restart_every=restart_every)
  np.testing.assert_allclose(
      got, _direct_epsilons(1.3, cohorts, restart_every, 1e-5), rtol=1e-12)
  assert np.all(np.diff(got) >= 0)
  ledger = rdp.RdpAccountant(neighboring_relation=SPECIAL)
  ledger.compose(privacy.tree_event(1.3, cohorts, restart_every))
  assert ledger.get_epsilon(1e-5) == pytest.approx(got[-1], rel=1e-12)


def test_one_participation_per_tree_is_dp_accountings_restarted_tree():
  # Each client once per tree of 3 rounds (the paper's epochs): the
  # SelfComposedDpEvent that dp_accounting documents for restarts.
  cohorts = np.array([[0, 1], [2, 3], [4, 5]] * 4)
  got = privacy.tree_epsilons(0.9, cohorts, delta=1e-6, restart_every=3)
  ledger = rdp.RdpAccountant(neighboring_relation=SPECIAL)
  ledger.compose(dp_accounting.SelfComposedDpEvent(
      dp_accounting.SingleEpochTreeAggregationDpEvent(0.9, 3), 4))
  assert got[-1] == pytest.approx(ledger.get_epsilon(1e-6), rel=1e-12)
  np.testing.assert_array_equal(
      privacy.tree_participations(cohorts, 3), np.ones(12))
  assert np.all(np.isinf(privacy.tree_epsilons(0.0, cohorts, delta=1e-6)))


@pytest.mark.parametrize("call,name", [
    (lambda: privacy.tree_epsilons(1.0, [[0, 1]], delta=0.0), "delta"),
    (lambda: privacy.tree_epsilons(-1.0, [[0]], delta=1e-5),
     "noise_multiplier"),
    (lambda: privacy.tree_epsilons(1.0, [0, 1], delta=1e-5), "cohorts"),
    (lambda: privacy.tree_epsilons(1.0, [[-1]], delta=1e-5), "cohorts"),
    (lambda: privacy.tree_epsilons(1.0, [[0.5]], delta=1e-5), "cohorts"),
    (lambda: privacy.tree_epsilons(1.0, [[0]], delta=1e-5,
                                   restart_every=0), "restart_every"),
])
def test_accounting_arguments_are_named(call, name):
  with pytest.raises((ValueError, TypeError), match=name):
    call()
