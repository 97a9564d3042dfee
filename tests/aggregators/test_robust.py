"""Coordinate-wise median and trimmed mean (Yin et al., ICML 2018)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES

K = 6
MEDIAN = aggregators.fedmedian()
MEDIAN_AGG = jax.jit(MEDIAN.aggregate)
TRIMMED = {beta: aggregators.trimmed_mean(beta) for beta in (0.0, 0.2, 0.34)}
TRIMMED_AGG = {beta: jax.jit(rule.aggregate) for beta, rule in
               TRIMMED.items()}
MASKS = st.lists(st.sampled_from([0.0, 1.0]), min_size=K,
                 max_size=K).filter(any)


def np_trimmed_mean(values, beta):
  """Yin et al. Definition 2 on [m, ...] values (floor(beta m) per end)."""
  num = values.shape[0]
  cut = int(np.floor(beta * num + 1e-9))
  return np.mean(np.sort(values, axis=0)[cut:num - cut], axis=0)


def _cohort(seed, mask):
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, K, scale=1.0)
  info = tu.make_info(np.arange(K), rng.integers(1, 9, size=K), mask)
  return global_params, clients, info, np.flatnonzero(np.asarray(mask))


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=MASKS)
def test_median_golden(seed, mask):
  global_params, clients, info, real = _cohort(seed, mask)
  out, _, _ = MEDIAN_AGG(global_params, clients, info,
                         MEDIAN.init(global_params))
  expected = jax.tree.map(lambda c: np.median(np.asarray(c)[real], axis=0),
                          clients)
  tu.assert_trees_close(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("beta", sorted(TRIMMED))
def test_trimmed_mean_golden(beta):
  for seed, mask in enumerate([[1] * K, [1, 0, 1, 1, 0, 1], [0, 0, 1, 0, 0,
                                                                0]]):
    global_params, clients, info, real = _cohort(seed, mask)
    out, _, metrics = TRIMMED_AGG[beta](global_params, clients, info,
                                        TRIMMED[beta].init(global_params))
    expected = jax.tree.map(
        lambda c, rows=real: np_trimmed_mean(np.asarray(c)[rows], beta),
        clients)
    tu.assert_trees_close(out, expected, rtol=1e-5, atol=1e-6)
    assert int(metrics["num_trimmed"]) == int(np.floor(beta * len(real)
                                                       + 1e-9))


def test_trimmed_count_is_exact_for_decimal_beta():
  # float32(0.35) * 20 = 6.9999998: the count must still be 7.
  rule = aggregators.trimmed_mean(0.35)
  params = {"w": jnp.zeros((1,))}
  clients = {"w": jnp.arange(20.0).reshape(20, 1)}
  info = tu.make_info(np.arange(20) % tu.NUM_CLIENTS, np.ones(20))
  out, _, metrics = jax.jit(rule.aggregate)(params, clients, info,
                                            rule.init(params))
  assert int(metrics["num_trimmed"]) == 7
  np.testing.assert_allclose(out["w"], [np.mean(np.arange(7.0, 13.0))])


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), num_bad=st.integers(0, 2),
       sign=st.sampled_from([-1.0, 1.0]))
def test_a_minority_of_huge_outliers_stays_outside(seed, num_bad, sign):
  # 2 of 6 real clients send +-1e6 (the same side: the worst case); the
  # median and the 0.34-trimmed mean stay within the honest clients' range.
  global_params, clients, info, _ = _cohort(seed, [1.0] * K)
  clients = jax.tree.map(lambda c: c.at[:num_bad].set(sign * 1e6), clients)
  honest = jax.tree.map(lambda c: np.asarray(c)[num_bad:], clients)
  for rule, aggregate in ((MEDIAN, MEDIAN_AGG),
                          (TRIMMED[0.34], TRIMMED_AGG[0.34])):
    out, _, _ = aggregate(global_params, clients, info,
                          rule.init(global_params))
    for got, values in zip(jax.tree.leaves(out), jax.tree.leaves(honest),
                           strict=True):
      assert np.all(got >= values.min(axis=0) - 1e-5)
      assert np.all(got <= values.max(axis=0) + 1e-5)


def test_bad_beta_raises():
  for beta in (-0.1, 0.5, 0.7):
    with pytest.raises(ValueError, match="beta"):
      aggregators.trimmed_mean(beta)
