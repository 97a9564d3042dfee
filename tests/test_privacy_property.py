"""Property: the recorded epsilon is what dp-accounting gives for the noise
the run actually adds, for every way a run can add noise (the rule alone
or under a server optimizer, fixed or adaptive clipping, fixed-size or
Poisson cohorts, empty rounds); a rule that adds no noise is never
accounted."""

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg.aggregators import _dp_fedavg
from fedjax_agg import simulation
from fedjax_agg.config import Execution, Privacy
from tests.clients.test_clients import _run_data, linear_model

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
