"""The geometric median (RFA, Pillutla et al., IEEE TSP 2022).

Golden tests against an independent numpy smoothed Weiszfeld (padding rows
hold NaN or 1e30 and must be ignored; the rule runs under ``jax.jit``),
the number of steps it runs (also when the weighted sums jitter by a few
ulps, as another backend's summation order makes them), and robustness to
an outlier.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from jax.experimental import io_callback

from fedjax_agg import aggregators
from fedjax_agg import tree_math
from fedjax_agg.aggregators._geometric_median import SETTLE_WINDOW
from tests.agg_testutil import EXAMPLES
from tests.aggregators._util import _assert_update
from tests.aggregators._util import _run
from tests.aggregators._util import flat
from tests.aggregators._util import garbage_cohort
from tests.aggregators._util import K
from tests.aggregators._util import MASKS


def np_geometric_median(updates, alpha, max_iterations, tolerance,
                        smoothing):
  """Pillutla et al. Alg. 3 (smoothed Weiszfeld), weights alpha; stops
  after the first step with |z_t - z_{t-1}| <= tolerance |z_t|."""
  alpha = alpha / alpha.sum()
  z = alpha @ updates

  def objective(z):
    dist = np.linalg.norm(updates - z, axis=1)
    return dist, alpha @ dist
  dist, obj = objective(z)
  settled, iterations = False, 0
  while iterations < max_iterations and not settled:
    beta = alpha / np.maximum(smoothing, dist)
    previous, z = z, beta @ updates / beta.sum()
    settled = np.linalg.norm(z - previous) <= tolerance * np.linalg.norm(z)
    dist, obj = objective(z)
    iterations += 1
  return z, iterations, obj


@pytest.mark.parametrize("mask", MASKS)
def test_geometric_median_golden(mask):
  global_params, clients, info, updates, counts = garbage_cohort(
      7 + sum(mask), mask)
  out, _, metrics = _run("geometric_median", global_params, clients, info,
                         max_iterations=50, tolerance=1e-5)
  expected, _, objective = np_geometric_median(updates, counts, 50, 1e-5,
                                               1e-6)
  _assert_update(out, global_params, expected, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(metrics["gm_objective"], objective, rtol=1e-4)


@pytest.mark.parametrize("max_iterations", [1, 3])
def test_geometric_median_runs_exactly_the_steps_asked(max_iterations):
  mask = [1, 0, 1, 1, 1, 1]
  global_params, clients, info, updates, counts = garbage_cohort(3, mask)
  out, _, metrics = _run("geometric_median", global_params, clients, info,
                         max_iterations=max_iterations, tolerance=0.0)
  expected, iterations, _ = np_geometric_median(updates, counts,
                                                max_iterations, 0.0, 1e-6)
  assert int(metrics["gm_iterations"]) == iterations == max_iterations
  _assert_update(out, global_params, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mask", [[1] * K, [1, 0, 1, 1, 0, 1]])
def test_geometric_median_without_tolerance_reaches_the_float64_median(
    seed, mask):
  # tolerance=0 once stopped where the float32 objective stopped changing
  # (7 to 104 steps here), up to 4e-3 relative (2.3e-2 absolute) from the
  # median; stopping on the iterate's movement runs until float32 z has
  # converged (no movement, or no net movement over a window beyond one
  # step's rounding): within 5e-6 relative of float64 Weiszfeld run to its
  # end.
  global_params, clients, info, updates, counts = garbage_cohort(seed, mask)
  out, _, metrics = _run("geometric_median", global_params, clients, info,
                         max_iterations=5000, tolerance=0.0)
  expected, _, objective = np_geometric_median(updates, counts, 100_000,
                                               0.0, 1e-6)
  got = flat(out) - flat(global_params)
  assert (np.linalg.norm(got - expected)
          <= 1e-5 * np.linalg.norm(expected))
  np.testing.assert_allclose(metrics["gm_objective"], objective, rtol=1e-6)
  assert int(metrics["gm_iterations"]) < 5000  # z settled in float32


def test_geometric_median_without_tolerance_runs_every_step_while_moving():
  # This cohort converges slowly: float64 z still moves by 1e-5 |z| at
  # step 150, far above float32 resolution, so all 150 steps run (the
  # objective rule stopped after 104).
  mask = [1, 0, 1, 1, 0, 1]
  global_params, clients, info, updates, counts = garbage_cohort(3, mask)
  out, _, metrics = _run("geometric_median", global_params, clients, info,
                         max_iterations=150, tolerance=0.0)
  expected, iterations, _ = np_geometric_median(updates, counts, 150, 0.0,
                                                1e-6)
  previous, _, _ = np_geometric_median(updates, counts, 149, 0.0, 1e-6)
  assert (np.linalg.norm(expected - previous)
          > 1e-6 * np.linalg.norm(expected))
  assert int(metrics["gm_iterations"]) == iterations == 150
  _assert_update(out, global_params, expected, rtol=1e-5, atol=1e-5)


def _jittery_weighted_sum(exact_weighted_sum):
  """``weighted_sum`` moving every coordinate by -2 to 2 ulps, fresh at
  each call (a host counter): a backend whose reductions round differently
  from one call to the next, so that the iteration has no fixed point."""
  calls = itertools.count()

  def weighted_sum(stacked, weights):
    total = exact_weighted_sum(stacked, weights)
    call = io_callback(lambda: np.int32(next(calls)),
                       jax.ShapeDtypeStruct((), jnp.int32))
    leaves, treedef = jax.tree.flatten(total)
    keys = jax.random.split(jax.random.fold_in(jax.random.key(0), call),
                            len(leaves))
    return jax.tree.unflatten(treedef, [
        leaf + jax.random.randint(key, leaf.shape, -2, 3) * jnp.spacing(leaf)
        for leaf, key in zip(leaves, keys, strict=True)])
  return weighted_sum


def test_geometric_median_without_tolerance_stops_despite_jitter(
    monkeypatch):
  # With tolerance=0, stopping only on a step that leaves z where it was
  # ran all 5,000 steps on a GPU. Under emulated jitter no step does, and
  # the rounding stop (at the end of a window) ends the loop far below the
  # maximum, as close to the median as the exact iteration gets (the test
  # above, on the same cohorts).
  try:
    jax.devices("cpu")
  except RuntimeError:
    pytest.skip("the emulated jitter's host counter (io_callback) needs the "
                "CPU platform, which JAX_PLATFORMS leaves out")
  monkeypatch.setattr(tree_math, "weighted_sum",
                      _jittery_weighted_sum(tree_math.weighted_sum))
  rule = aggregators.geometric_median(max_iterations=5000, tolerance=0.0)
  aggregate = jax.jit(rule.aggregate)
  for mask in ([1] * K, [1, 0, 1, 1, 0, 1]):
    for seed in range(4):
      global_params, clients, info, updates, counts = garbage_cohort(seed,
                                                                     mask)
      out, _, metrics = aggregate(global_params, clients, info,
                                  rule.init(global_params))
      iterations = int(metrics["gm_iterations"])
      assert iterations <= 1000
      assert iterations % SETTLE_WINDOW == 0
      expected, _, _ = np_geometric_median(updates, counts, 100_000, 0.0,
                                           1e-6)
      got = flat(out) - flat(global_params)
      assert (np.linalg.norm(got - expected)
              <= 1e-5 * np.linalg.norm(expected))


@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**31), size=st.sampled_from([10.0, 1e4, 1e8]))
def test_geometric_median_moves_less_than_the_mean_for_an_outlier(seed,
                                                                  size):
  global_params, clients, info, _, _ = garbage_cohort(seed, [1] * K)
  info = info._replace(num_examples=jnp.ones(K))
  attacked = jax.tree.map(lambda c: c.at[0].add(size), clients)

  def moves(name):
    before, _, _ = _run(name, global_params, clients, info)
    after, _, _ = _run(name, global_params, attacked, info)
    return np.linalg.norm(flat(after) - flat(before))
  assert moves("geometric_median") < 0.5 * moves("fedavg")
