"""Bulyan (El Mhamdi et al., ICML 2018).

Golden tests against an independent numpy computation of the paper's two
steps (padding rows hold NaN or 1e30, clients hold unequal example counts
that Bulyan ignores; the rule runs under ``jax.jit``), the bound
K >= 4f + 3, and property tests: f = 0 is the unweighted mean, client
order does not matter, far attackers stay out of the result.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg import testing
from fedjax_agg.aggregators._bulyan import mean_around_median
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES

K = 11  # 4f + 3 for f = 2
MASKS = [[1] * K,
         [1, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1],  # 9 real: clamped for f = 2
         [0, 1, 1, 0, 1, 1, 1, 0, 1, 1, 0],  # 7 real
         [1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0],  # 3 real
         [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]]  # 1 real


def _run(global_params, clients, info, **kwargs):
  return tu.run_rule("bulyan", global_params, clients, info, **kwargs)


flat = tu.flat
flat_rows = tu.flat_rows


def garbage_cohort(seed, mask, num=K):
  """Params, clients whose padding rows hold NaN or 1e30 (and huge example
  counts), info with unequal counts; the real rows' float64 updates."""
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, num)
  mask = np.asarray(mask)
  real = np.flatnonzero(mask)
  updates = flat_rows(clients)[real] - flat(global_params)
  padding = np.flatnonzero(mask == 0)

  counts = rng.integers(1, 40, size=num).astype(np.float64)
  counts[padding] = 1e9
  info = tu.make_info(np.arange(num) % tu.NUM_CLIENTS, counts, mask)
  return global_params, tu.spoil_rows(clients, padding), info, updates


# ---------------------------------------------------------------------------
# The numpy reference.


def np_krum_pick(points, num_byzantine):
  """Index (into ``points``) of Krum's choice: lowest sum of squared
  distances to the |R| - f - 2 nearest others (clamped to [1, |R| - 1]);
  equal scores to the lowest sum of squared distances to all others, then
  to the first."""
  size = len(points)
  n = min(max(size - num_byzantine - 2, 1), size - 1)
  keys = []
  for i in range(size):
    others = [np.sum((points[i] - points[j]) ** 2)
              for j in range(size) if j != i]
    keys.append((sum(sorted(others)[:n]), sum(others), i))
  return min(keys)[2]


def np_bulyan(updates, num_byzantine):
  """El Mhamdi et al. Sec. 4 on [m, P] float64 rows; clamped counts.

  Returns (aggregate [P], the chosen rows in the order Krum chose them).
  """
  m = len(updates)
  f = num_byzantine
  theta = min(max(m - 2 * f, 1), m)
  beta = min(max(theta - 2 * f, 1), theta)
  remaining, chosen = list(range(m)), []
  while len(chosen) < theta:  # Step 1
    pick = remaining[np_krum_pick(updates[remaining], f)]
    remaining.remove(pick)
    chosen.append(pick)
  committee = updates[sorted(chosen)]
  median = np.median(committee, axis=0)  # Step 2
  result = np.empty(updates.shape[1])
  for i in range(updates.shape[1]):
    order = np.argsort(np.abs(committee[:, i] - median[i]), kind="stable")
    result[i] = committee[order[:beta], i].mean()
  return result, chosen


# ---------------------------------------------------------------------------
# Golden tests.


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("num_byzantine", [0, 1, 2])
def test_bulyan_golden(mask, num_byzantine):
  global_params, clients, info, updates = garbage_cohort(
      sum(mask) + 10 * num_byzantine, mask)
  out, _, metrics = _run(global_params, clients, info,
                         num_byzantine=num_byzantine)
  expected, chosen = np_bulyan(updates, num_byzantine)
  np.testing.assert_allclose(flat(out) - flat(global_params), expected,
                             rtol=1e-5, atol=1e-6)
  real = np.flatnonzero(mask)
  selected = np.zeros(K)
  selected[real[chosen]] = 1.0
  np.testing.assert_array_equal(metrics["bulyan_selected"], selected)
  theta = min(max(len(real) - 2 * num_byzantine, 1), len(real))
  assert int(metrics["num_selected"]) == theta == len(chosen)
  assert int(metrics["num_kept"]) == min(max(theta - 2 * num_byzantine, 1),
                                         theta)


def test_bulyan_golden_with_an_even_committee():
  # theta = 12 - 2 = 10: the median of S is the mean of its two middle
  # values, both among the beta = 8 kept.
  mask = [1] * 12
  global_params, clients, info, updates = garbage_cohort(3, mask, num=12)
  out, _, metrics = _run(global_params, clients, info, num_byzantine=1)
  expected, _ = np_bulyan(updates, 1)
  assert int(metrics["num_selected"]) == 10
  assert int(metrics["num_kept"]) == 8
  np.testing.assert_allclose(flat(out) - flat(global_params), expected,
                             rtol=1e-5, atol=1e-6)


def test_example_counts_change_nothing():
  mask = MASKS[1]
  global_params, clients, info, _ = garbage_cohort(4, mask)
  out, _, _ = _run(global_params, clients, info, num_byzantine=2)
  equal = info._replace(num_examples=jnp.ones(K))
  same, _, _ = _run(global_params, clients, equal, num_byzantine=2)
  tu.assert_trees_close(same, out, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# The bound K >= 4f + 3.


@pytest.mark.parametrize("num_byzantine,rows", [(1, 6), (2, 10), (3, 14)])
def test_a_cohort_below_the_bound_is_refused(num_byzantine, rows):
  global_params, clients, info, _ = garbage_cohort(0, [1] * rows, num=rows)
  rule = aggregators.bulyan(num_byzantine=num_byzantine)
  bound = 4 * num_byzantine + 3
  match = (rf"K >= 4 num_byzantine \+ 3 = {bound} .*"
           rf"num_byzantine={num_byzantine}.*K={rows}")
  for aggregate in (rule.aggregate, jax.jit(rule.aggregate)):
    with pytest.raises(ValueError, match=match):
      aggregate(global_params, clients, info, rule.init(global_params))
  # One row more is enough (the bound is on shapes: tracing shows it).
  global_params, clients, info, _ = garbage_cohort(0, [1] * (rows + 1),
                                                   num=rows + 1)
  jax.eval_shape(rule.aggregate, global_params, clients, info,
                 rule.init(global_params))


def test_num_participants_checks_the_bound_when_built():
  with pytest.raises(ValueError, match=r"num_participants >= 4 num_byzantine"
                     r" \+ 3 = 11 .*num_participants=10"):
    aggregators.bulyan(num_byzantine=2, num_participants=10)
  aggregators.bulyan(num_byzantine=2, num_participants=11)
  # Without it, the first round checks the cohort it is given.
  aggregators.bulyan(num_byzantine=2)


@pytest.mark.parametrize("kwargs,arg", [
    ({"num_byzantine": -1}, "num_byzantine"),
    ({"num_byzantine": 1.0}, "num_byzantine"),
    ({"num_participants": 0}, "num_participants"),
    ({"num_participants": 2.5}, "num_participants"),
])
def test_bad_arguments_name_the_argument(kwargs, arg):
  with pytest.raises((ValueError, TypeError), match=arg):
    aggregators.bulyan(**kwargs)


# ---------------------------------------------------------------------------
# Properties.


@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(7))
def test_no_byzantine_is_the_unweighted_mean_of_the_real_clients(cohort):
  global_params, clients, info = cohort
  out, _, metrics = _run(global_params, clients, info, num_byzantine=0)
  real = np.asarray(info.mask) > 0
  expected = jax.tree.map(lambda c: np.asarray(c)[real].mean(0), clients)
  tu.assert_trees_close(out, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(metrics["bulyan_selected"], real)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(7), perm_seed=st.integers(0, 2**31))
def test_permuting_the_clients_changes_nothing(cohort, perm_seed):
  global_params, clients, info = cohort
  perm = np.random.default_rng(perm_seed).permutation(7)
  out, _, _ = _run(global_params, clients, info, num_byzantine=1)
  permuted = info._replace(**{
      field: getattr(info, field)[perm] for field in (
          "client_ids", "num_examples", "mask", "loss_before",
          "loss_after")})
  p_out, _, _ = _run(global_params, tu.take_rows(clients, perm), permuted,
                     num_byzantine=1)
  tu.assert_trees_close(p_out, out, rtol=1e-5, atol=1e-5)


@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**31), num_bad=st.integers(1, 2),
       distance=st.sampled_from([2.0, 1e3, 1e6]))
def test_far_attackers_stay_out_of_the_result(seed, num_bad, distance):
  global_params, clients, info, bad = tu.colluding_cohort(
      seed, K, num_bad, distance)
  out, _, metrics = _run(global_params, clients, info, num_byzantine=2)
  selected = np.asarray(metrics["bulyan_selected"])
  assert selected.sum() == K - 4
  if num_bad == 1:  # Alone, it is never nearest to anyone.
    assert selected[bad].sum() == 0
  # Two colluders may enter S at the last picks (one neighbour: they
  # score 0), but Step 2 keeps every coordinate among the honest values.
  honest = np.setdiff1d(np.arange(K), bad)
  rows = flat_rows(clients)[honest]
  got = flat(out)
  assert np.all(got >= rows.min(0) - 1e-6)
  assert np.all(got <= rows.max(0) + 1e-6)


def test_a_single_real_participant_is_its_own_aggregate():
  global_params, clients, info, updates = garbage_cohort(2, MASKS[-1])
  out, _, metrics = _run(global_params, clients, info, num_byzantine=2)
  np.testing.assert_allclose(flat(out) - flat(global_params), updates[0],
                             rtol=1e-5, atol=1e-6)
  assert int(metrics["num_selected"]) == int(metrics["num_kept"]) == 1


def test_num_byzantine_can_be_swept_as_a_traced_value():
  # A sweep builds the rule inside jax.vmap with traced hyperparameters.
  global_params, clients, info, _ = garbage_cohort(6, MASKS[0])

  def aggregate(num_byzantine):
    rule = aggregators.bulyan(num_byzantine=num_byzantine)
    return rule.aggregate(global_params, clients, info,
                          rule.init(global_params))[0]
  swept = jax.jit(jax.vmap(aggregate))(jnp.array([0.0, 1.0, 2.0]))
  for i, num_byzantine in enumerate([0, 1, 2]):
    want, _, _ = _run(global_params, clients, info,
                      num_byzantine=num_byzantine)
    tu.assert_trees_close(jax.tree.map(lambda x, i=i: x[i], swept), want)


def test_registered_under_its_name():
  assert aggregators.REGISTRY["bulyan"] is aggregators.bulyan
  rule = aggregators.get("bulyan", num_clients=5, num_byzantine=1)
  assert rule.stream is None and not rule.uses_losses


# ---------------------------------------------------------------------------
# Values near the float's largest.

FLOAT32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("num_byzantine", [0, 1, 2])
def test_bulyan_of_huge_updates_is_finite_and_numpys(mask, num_byzantine):
  # Updates of 0.9e38 to 1.7e38: any three sum past the float's range, so
  # the plain sum of Step 2 was inf. (They stay below 2^127: above it,
  # Step 1's distances, divided by the common scale 2^127, flush to 0 on
  # XLA's CPU; Step 2 alone is tested up to the largest float below.)
  rng = np.random.default_rng(sum(mask) + num_byzantine)
  rows = rng.uniform(0.9e38, 1.7e38, size=(K, 1, 8))
  rows *= np.where(rng.random((K, 1, 8)) < 0.8, 1.0, -1.0)
  rows = rows.astype(np.float32)
  real = np.flatnonzero(mask)
  global_params = {"w": jnp.zeros((1, 8), jnp.float32)}
  clients = tu.spoil_rows({"w": jnp.asarray(rows)},
                          np.flatnonzero(np.asarray(mask) == 0))
  info = tu.make_info(np.arange(K) % tu.NUM_CLIENTS, np.ones(K), mask)
  out, _, _ = _run(global_params, clients, info,
                   num_byzantine=num_byzantine)
  expected, _ = np_bulyan(rows[real].reshape(len(real), -1).astype(
      np.float64), num_byzantine)
  assert np.all(np.isfinite(flat(out)))
  np.testing.assert_allclose(flat(out), expected, rtol=1e-6,
                             atol=1e-6 * FLOAT32_MAX)


def np_mean_around_median(values, mask, num_kept):
  """Step 2 on [K, P] float64 values: per column, the mean of the
  ``num_kept`` real values nearest the real values' median (equal
  distances to the lower row)."""
  real = values[np.flatnonzero(mask)]
  median = np.median(real, axis=0)
  result = np.empty(values.shape[1])
  for i in range(values.shape[1]):
    order = np.argsort(np.abs(real[:, i] - median[i]), kind="stable")
    result[i] = real[order[:num_kept], i].mean()
  return result


@pytest.mark.parametrize("mask", MASKS[:4])
def test_step_two_near_float32_max_keeps_the_nearest_values(mask):
  # Up to the largest float, of both signs: a value can lie beyond the
  # float's range from the median (its distance is inf), and padding rows
  # (NaN, 1e30) must still sort after every committee member.
  rng = np.random.default_rng(30 + sum(mask))
  rows = rng.uniform(0.5, 1.0, size=(K, 64)) * FLOAT32_MAX
  rows *= np.where(rng.random((K, 64)) < 0.6, 1.0, -1.0)
  rows = rows.astype(np.float32)
  rows[:, 0] = np.float32(FLOAT32_MAX)
  padding = np.flatnonzero(np.asarray(mask) == 0)
  stacked = tu.spoil_rows({"w": jnp.asarray(rows)}, padding)
  step_two = jax.jit(mean_around_median)
  for num_kept in range(1, sum(mask) + 1):
    got = np.asarray(step_two(stacked, jnp.asarray(mask, jnp.float32),
                              jnp.asarray(num_kept, jnp.int32))["w"])
    expected = np_mean_around_median(rows.astype(np.float64), mask,
                                     num_kept)
    assert np.all(np.isfinite(got)), num_kept
    np.testing.assert_allclose(got, expected, rtol=1e-6,
                               atol=1e-6 * FLOAT32_MAX, err_msg=num_kept)
