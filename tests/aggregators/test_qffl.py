"""q-FedAvg (Li, Sanjabi, Beirami & Smith, ICLR 2020).

Golden tests against an independent numpy computation of Algorithm 2
(padding rows hold NaN or 1e30 in their params and losses, clients hold
unequal example counts that q-FedAvg ignores; the rule runs under
``jax.jit``), including q and losses where F^q leaves the float32 range,
and property tests: q = 0 is the unweighted mean, the weights follow the
losses and never sum past 1. The loss policy: refused outside jit,
floored or propagated under jit, excluded by the round.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg import federated
from fedjax_agg import rounds
from fedjax_agg import testing
from fedjax_agg.aggregators._qffl import LOSS_FLOOR
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

K = 6
MASKS = [[1] * K, [1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0]]


def _run(global_params, clients, info, **kwargs):
  return tu.run_rule("qffl", global_params, clients, info, **kwargs)


flat = tu.flat
flat_rows = tu.flat_rows


def garbage_cohort(seed, mask, losses):
  """Params, clients and info whose padding rows hold NaN or 1e30 (params,
  losses) and huge example counts; the real rows' float64 models."""
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, K, scale=0.2)
  mask = np.asarray(mask)
  real = np.flatnonzero(mask)
  models = flat_rows(clients)[real]
  padding = np.flatnonzero(mask == 0)
  losses = np.array(losses, np.float64)
  counts = rng.integers(1, 40, size=K).astype(np.float64)

  for i, row in enumerate(padding):
    losses[row] = np.nan if i % 2 == 0 else -1e30
    counts[row] = 1e9
  info = tu.make_info(np.arange(K), counts, mask)._replace(
      loss_before=jnp.asarray(losses, jnp.float32))
  return (global_params, tu.spoil_rows(clients, padding), info, models,
          np.asarray(losses, np.float32).astype(np.float64)[real])


def np_qffl(global_flat, models, losses, q, lipschitz):
  """Li et al. Algorithm 2, lines 7 and 9, literally, in float64.

  Returns (w^{t+1} [P], c_k = L F_k^q / sum_j h_j [m]).
  """
  delta_w = lipschitz * (global_flat[None] - models)
  deltas = losses[:, None] ** q * delta_w
  h = (q * losses ** (q - 1) * np.sum(delta_w ** 2, axis=1)
       + lipschitz * losses ** q)
  return (global_flat - deltas.sum(0) / h.sum(),
          lipschitz * losses ** q / h.sum())


# ---------------------------------------------------------------------------
# Golden tests.


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("q,lipschitz", [(0.0, 1.0), (0.5, 1.0), (1.0, 10.0),
                                         (5.0, 2.0), (15.0, 1.0)])
def test_qffl_golden(mask, q, lipschitz):
  rng = np.random.default_rng(sum(mask))
  global_params, clients, info, models, losses = garbage_cohort(
      int(q) + sum(mask), mask, rng.uniform(0.05, 3.0, size=K))
  out, _, metrics = _run(global_params, clients, info, q=q,
                         lipschitz=lipschitz)
  expected, weights = np_qffl(flat(global_params), models, losses, q,
                              lipschitz)
  np.testing.assert_allclose(flat(out), expected, rtol=1e-5, atol=1e-6)
  real = np.flatnonzero(mask)
  got_weights = np.asarray(metrics["update_weights"])
  np.testing.assert_allclose(got_weights[real], weights, rtol=1e-5,
                             atol=1e-7)
  np.testing.assert_array_equal(np.delete(got_weights, real), 0.0)
  np.testing.assert_allclose(metrics["step_fraction"], weights.sum(),
                             rtol=1e-5)


@pytest.mark.parametrize("q,low,high", [
    (15.0, 1e-3, 1e-2),   # F^q down to 1e-45: float32 underflows
    (30.0, 20.0, 60.0),   # F^q up to 2e53: float32 overflows
    (0.3, 1e-6, 1e-5),    # F^{q-1} up to 1.6e4, near the loss floor
])
def test_qffl_golden_where_the_powers_leave_the_float32_range(q, low,
                                                              high):
  mask = [1, 0, 1, 1, 1, 1]
  rng = np.random.default_rng(int(q))
  global_params, clients, info, models, losses = garbage_cohort(
      7, mask, np.exp(rng.uniform(np.log(low), np.log(high), size=K)))
  out, _, metrics = _run(global_params, clients, info, q=q, lipschitz=3.0)
  expected, weights = np_qffl(flat(global_params), models, losses, q, 3.0)
  np.testing.assert_allclose(flat(out), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      np.asarray(metrics["update_weights"])[np.flatnonzero(mask)], weights,
      rtol=1e-4, atol=1e-30)
  assert 0.0 < float(metrics["step_fraction"]) <= 1.0


def test_lipschitz_defaults_to_one_over_the_client_learning_rate():
  global_params, clients, info, _, _ = garbage_cohort(
      1, MASKS[1], np.linspace(0.2, 2.0, K))
  by_rate, _, _ = _run(global_params, clients, info, q=2.0,
                       learning_rate=0.125)
  by_lipschitz, _, _ = _run(global_params, clients, info, q=2.0,
                            lipschitz=8.0)
  tu.assert_trees_close(by_rate, by_lipschitz, rtol=0, atol=0)
  # lipschitz, when given, wins over learning_rate.
  both, _, _ = _run(global_params, clients, info, q=2.0, lipschitz=8.0,
                    learning_rate=0.5)
  tu.assert_trees_close(both, by_lipschitz, rtol=0, atol=0)


def test_example_counts_change_nothing():
  global_params, clients, info, _, _ = garbage_cohort(
      2, MASKS[2], np.linspace(0.5, 1.5, K))
  out, _, _ = _run(global_params, clients, info, q=1.0)
  equal = info._replace(num_examples=jnp.ones(K))
  same, _, _ = _run(global_params, clients, equal, q=1.0)
  tu.assert_trees_close(same, out, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# Properties.


def _with_losses(info, losses):
  return info._replace(loss_before=jnp.asarray(losses, jnp.float32))


@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(K),
       losses=st.lists(st.floats(1e-3, 1e3), min_size=K, max_size=K),
       lipschitz=st.sampled_from([0.1, 1.0, 50.0]))
def test_q_zero_is_the_unweighted_mean_of_the_real_clients(cohort, losses,
                                                           lipschitz):
  # q = 0: h_k = L and w - sum_k L (w - w_k) / (m L) = mean_k w_k,
  # whatever the losses.
  global_params, clients, info = cohort
  out, _, metrics = _run(global_params, clients, _with_losses(info, losses),
                         q=0.0, lipschitz=lipschitz)
  real = np.asarray(info.mask) > 0
  expected = jax.tree.map(lambda c: np.asarray(c)[real].mean(0), clients)
  tu.assert_trees_close(out, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(metrics["update_weights"],
                             real / real.sum(), rtol=1e-6)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(K),
       losses=st.lists(st.floats(1e-3, 1e3), min_size=K, max_size=K,
                       unique=True),
       q=st.sampled_from([0.1, 1.0, 5.0]))
def test_weights_follow_the_losses_and_never_overshoot(cohort, losses, q):
  global_params, clients, info = cohort
  losses = np.asarray(losses, np.float32)
  _, _, metrics = _run(global_params, clients, _with_losses(info, losses),
                       q=q, lipschitz=1.0)
  weights = np.asarray(metrics["update_weights"], np.float64)
  real = np.asarray(info.mask) > 0
  assert np.all(weights >= 0) and np.all(weights[~real] == 0)
  assert float(metrics["step_fraction"]) <= 1.0 + 1e-6
  # c_k is F_k^q over a common denominator: larger loss, larger weight.
  np.testing.assert_allclose(
      weights[real] / weights[real].max(),
      (losses[real] / losses[real].max()).astype(np.float64) ** q,
      rtol=1e-4)


def test_zero_updates_keep_the_model_for_any_q():
  rng = np.random.default_rng(3)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, K, zero_rows=range(K))
  info = _with_losses(tu.make_info(np.arange(K), np.ones(K)),
                      np.linspace(0.1, 4.0, K))
  for q in (0.0, 0.5, 3.0):
    out, _, metrics = _run(global_params, clients, info, q=q)
    tu.assert_trees_close(out, global_params, rtol=0, atol=0)
    assert np.isfinite(np.asarray(metrics["update_weights"])).all()


# ---------------------------------------------------------------------------
# Losses.


@pytest.mark.parametrize("bad", [np.nan, np.inf, -0.5])
def test_a_bad_real_loss_is_refused_outside_jit(bad):
  global_params, clients, info, _, _ = garbage_cohort(
      4, MASKS[1], np.ones(K))
  rule = aggregators.qffl()
  losses = np.asarray(info.loss_before).copy()
  losses[2] = bad
  with pytest.raises(ValueError, match="info.loss_before"):
    rule.aggregate(global_params, clients, _with_losses(info, losses),
                   rule.init(global_params))
  # On a padding row (mask 0) any loss is fine: the check, on the same
  # concrete info, lets it through (the rest is only traced).
  losses[1] = bad
  losses[2] = 1.0
  padded = _with_losses(info, losses)
  jax.eval_shape(lambda params, stacked, state: rule.aggregate(
      params, stacked, padded, state), global_params, clients,
                 rule.init(global_params))


def test_under_jit_a_negative_loss_counts_as_the_floor_and_nan_propagates():
  global_params, clients, info, _, _ = garbage_cohort(
      5, MASKS[0], np.linspace(0.5, 2.0, K))
  losses = np.asarray(info.loss_before).copy()
  floored, negative = losses.copy(), losses.copy()
  floored[3], negative[3] = LOSS_FLOOR, -2.0
  tiny = losses.copy()
  tiny[3] = LOSS_FLOOR / 10
  want, _, _ = _run(global_params, clients, _with_losses(info, floored),
                    q=0.5)
  for other in (negative, tiny):
    got, _, _ = _run(global_params, clients, _with_losses(info, other),
                     q=0.5)
    tu.assert_trees_close(got, want, rtol=0, atol=0)
  # A NaN loss reaches the rule only with nonfinite="propagate": it
  # propagates as a NaN client model would.
  losses[3] = np.nan
  out, _, _ = _run(global_params, clients, _with_losses(info, losses),
                   q=0.5)
  assert np.isnan(flat(out)).all()


def test_the_round_excludes_a_client_with_a_nan_loss():
  _, x, y, parts = tiny_data()
  poisoned = np.array(x)
  poisoned[parts[1][0], 0] = np.nan
  data = federated.from_partition(poisoned, y, parts)
  model = tiny_model()
  rule = aggregators.qffl(q=2.0, learning_rate=0.2)
  training = LocalTraining(batch_size=3, learning_rate=0.2)
  round_fn = rounds.make_round_fn(
      model, rule, training,
      execution=Execution(clients_per_step=2, progress=False))
  state = rounds.init_state(model.init(jax.random.key(0)), rule, seed=2)
  cohort = jnp.array([0, 1, 2, 3])
  got, out = round_fn(state, data, cohort, jnp.ones(4))
  assert list(np.asarray(out.finite)) == [True, False, True, True]
  want, _ = round_fn(state, data, cohort, jnp.array([1.0, 0.0, 1.0, 1.0]))
  assert np.isfinite(flat(got.params)).all()
  tu.assert_trees_close(got.params, want.params, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="compute_losses"):
    rounds.make_round_fn(model, rule, LocalTraining(batch_size=3,
                                                    compute_losses=False))


# ---------------------------------------------------------------------------
# Arguments.


@pytest.mark.parametrize("kwargs,arg", [
    ({"q": -0.5}, "q"),
    ({"q": float("nan")}, "q"),
    ({"q": "fair"}, "q"),
    ({"lipschitz": 0.0}, "lipschitz"),
    ({"lipschitz": -1.0}, "lipschitz"),
    ({"lipschitz": float("inf")}, "lipschitz"),
    ({"learning_rate": 0.0}, "learning_rate"),
])
def test_bad_arguments_name_the_argument(kwargs, arg):
  with pytest.raises((ValueError, TypeError), match=arg):
    aggregators.qffl(**kwargs)


def test_q_and_the_learning_rate_can_be_swept_as_traced_values():
  # A sweep builds the rule inside jax.vmap with traced hyperparameters.
  global_params, clients, info, _, _ = garbage_cohort(
      8, MASKS[1], np.linspace(0.3, 3.0, K))
  grid = [(0.0, 0.1), (2.0, 0.5), (15.0, 0.05)]

  def aggregate(q, learning_rate):
    rule = aggregators.qffl(q=q, learning_rate=learning_rate)
    return rule.aggregate(global_params, clients, info,
                          rule.init(global_params))[0]
  swept = jax.jit(jax.vmap(aggregate))(*jnp.asarray(grid, jnp.float32).T)
  for i, (q, learning_rate) in enumerate(grid):
    want, _, _ = _run(global_params, clients, info, q=q,
                      learning_rate=learning_rate)
    tu.assert_trees_close(jax.tree.map(lambda x, i=i: x[i], swept), want)


def test_registered_under_its_name_and_reads_the_losses():
  assert aggregators.REGISTRY["qffl"] is aggregators.qffl
  rule = aggregators.get("qffl", num_clients=5, q=2.0)
  assert rule.uses_losses and rule.stream is None
