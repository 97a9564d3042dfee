"""The run's privacy accounting, per member from its rule: the recorded
epsilon is what dp-accounting gives for the noise the run actually adds,
for every way a run can add noise (the rule alone or under a server
optimizer, fixed or adaptive clipping, fixed-size or Poisson cohorts,
empty rounds); a rule that adds no noise is never accounted; the epsilon
column, the stop at a target epsilon, and what sweeps cannot share.
"""

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg import privacy
from fedjax_agg import simulation
from fedjax_agg.aggregators import _dp_fedavg
from fedjax_agg.config import Execution, Privacy
from tests.clients._util import _run_data, linear_model


QUIET = Execution(clients_per_step=2, progress=False)
NUM_CLIENTS, ROUNDS, DELTA, CLIP = 6, 3, 1e-5, 0.7


def _independent_epsilons(z, cohort, sampling, rounds=ROUNDS):
  """epsilon after rounds 1..R from dp-accounting called directly."""
  gaussian = dp_accounting.GaussianDpEvent(z)
  if sampling == "poisson":
    event = dp_accounting.PoissonSampledDpEvent(cohort / NUM_CLIENTS,
                                                gaussian)
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
  else:
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        NUM_CLIENTS, cohort, gaussian)
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
  ledger = rdp.RdpAccountant(neighboring_relation=relation)
  out = []
  for _ in range(rounds):
    ledger.compose(event)
    out.append(ledger.get_epsilon(DELTA))
  return np.array(out)


@settings(max_examples=6, deadline=None)
@given(z=st.floats(0.4, 3.0), poisson=st.booleans(),
       wrapped=st.booleans(), adaptive=st.booleans(),
       cohort=st.sampled_from([1, 3]), seed=st.integers(0, 50))
def test_recorded_epsilon_is_that_of_the_noise_added(z, poisson, wrapped,
                                                    adaptive, cohort, seed):
  sampling = "poisson" if poisson else "without_replacement"
  rule = aggregators.dp_fedavg(
      clip_norm=CLIP, noise_multiplier=z, adaptive=adaptive,
      expected_clients=float(cohort) if poisson else None)
  if wrapped:
    rule = aggregators.fedavgm(server_learning_rate=1.0, momentum=0.5,
                               base=rule)
  data, test = _run_data()
  result = simulation.run(
      linear_model(), data, test, rule, num_rounds=ROUNDS,
      participation=cohort / NUM_CLIENTS, execution=QUIET,
      privacy=Privacy(delta=DELTA, sampling=sampling), seed=seed)
  rows = result.history.rows[1:]
  np.testing.assert_allclose([row["epsilon"] for row in rows],
                             _independent_epsilons(z, cohort, sampling),
                             rtol=1e-9)
  # The noise actually added each round: z (or, with adaptive clipping,
  # the update's share sigma_dw of it) times the round's clip norm over
  # the denominator: q N under Poisson sampling, else the participants.
  update_z = (float(_dp_fedavg.update_noise_multiplier(z, 5.0 * z))
              if adaptive else z)
  for row, clients in zip(rows, result.history.client_rows, strict=True):
    real = int(np.sum(clients.get("mask", np.ones(cohort))))
    denominator = cohort if poisson else max(real, 1)
    np.testing.assert_allclose(
        row["noise_stddev"], update_z * row["clip_norm"] / denominator,
        rtol=1e-5)
    assert row["noise_stddev"] > 0  # empty rounds too


def test_poisson_rounds_that_draw_nobody_are_noised_and_accounted():
  # q = 1/6 over 6 clients: a third of the rounds draw nobody.
  rule = aggregators.dp_fedavg(clip_norm=CLIP, noise_multiplier=1.0,
                               expected_clients=1.0)
  data, test = _run_data()
  result = simulation.run(
      linear_model(), data, test, rule, num_rounds=8, participation=1 / 6,
      execution=QUIET, privacy=Privacy(sampling="poisson"), seed=3)
  empty = [r for r, clients in enumerate(result.history.client_rows)
           if not np.any(clients.get("mask", 1))]
  assert empty, "no empty round drawn; pick another seed"
  for r in empty:
    assert result.history.rows[r + 1]["noise_stddev"] == pytest.approx(CLIP)
  np.testing.assert_allclose(
      result.history.column("epsilon")[1:],
      _independent_epsilons(1.0, 1, "poisson", rounds=8), rtol=1e-9)


# FedACS needs a server model and data; every other rule is built here.
NOISELESS = [name for name in aggregators.REGISTRY.names
             if name not in ("dp_fedavg", "dp_ftrl", "fedacs")]


@pytest.mark.parametrize("name", NOISELESS)
def test_a_rule_without_noise_is_never_accounted(name):
  kwargs = {}
  if "num_participants" in aggregators.REGISTRY.parameters(name):
    kwargs["num_participants"] = 3
  rule = aggregators.get(name, num_clients=NUM_CLIENTS, **kwargs)
  assert rule.noise_multiplier is None
  data, test = _run_data()
  with pytest.raises(ValueError, match="adds no calibrated Gaussian noise"):
    simulation.run(linear_model(), data, test, rule, num_rounds=1,
                   participation=0.5, execution=QUIET, privacy=Privacy())


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


def test_run_refuses_a_privacy_that_is_not_one():
  data, test = _run_data()
  with pytest.raises(TypeError, match="privacy"):
    simulation.run(linear_model(), data, test, aggregators.fedavg(),
                   num_rounds=1, execution=QUIET, privacy={"delta": 1e-5})


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
