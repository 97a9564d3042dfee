"""The coordinate-wise trimmed mean (Yin et al., ICML 2018): numpy's
Definition 2, the trimmed count, bad beta.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from tests import agg_testutil as tu
from tests.aggregators._util import _cohort
from tests.aggregators._util import K
from tests.aggregators._util import TRIMMED
from tests.aggregators._util import TRIMMED_AGG


def np_trimmed_mean(values, beta):
  """Yin et al. Definition 2 on [m, ...] values (floor(beta m) per end)."""
  num = values.shape[0]
  cut = int(np.floor(beta * num + 1e-9))
  return np.mean(np.sort(values, axis=0)[cut:num - cut], axis=0)


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


def test_bad_beta_raises():
  for beta in (-0.1, 0.5, 0.7):
    with pytest.raises(ValueError, match="beta"):
      aggregators.trimmed_mean(beta)


# ---------------------------------------------------------------------------
# Values near the float's largest: the plain sum of the kept values is inf.

FLOAT32_MAX = float(np.finfo(np.float32).max)
EXTREME_MASKS = [[1] * K, [1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 1],
                 [0, 0, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]]


def _extreme_rows(rng, num_columns):
  """[K, num_columns] float32 rows near +-FLOAT32_MAX, mostly positive;
  column 0 holds the largest float in every row."""
  magnitude = rng.uniform(0.5, 1.0, size=(K, num_columns)) * FLOAT32_MAX
  sign = np.where(rng.random((K, num_columns)) < 0.8, 1.0, -1.0)
  rows = (sign * magnitude).astype(np.float32)
  rows[:, 0] = np.float32(FLOAT32_MAX)
  return rows


def _trimmed(beta, rows, mask):
  global_params = {"w": jnp.zeros(rows.shape[1:], jnp.float32)}
  info = tu.make_info(np.arange(K), np.ones(K), mask)
  out, _, _ = TRIMMED_AGG[beta](global_params, {"w": jnp.asarray(rows)},
                                info, TRIMMED[beta].init(global_params))
  return np.asarray(out["w"])


@pytest.mark.parametrize("mask", EXTREME_MASKS)
@pytest.mark.parametrize("beta", sorted(TRIMMED))
def test_trimmed_mean_near_float32_max_is_finite_and_numpys(beta, mask):
  rows = _extreme_rows(np.random.default_rng(sum(mask)), 64)
  real = np.flatnonzero(mask)
  expected = np_trimmed_mean(rows[real].astype(np.float64), beta)
  got = _trimmed(beta, rows, mask)
  assert np.all(np.isfinite(got))
  # A float32 sum of at most K values, each rounded: a few ulps of the
  # largest value summed.
  np.testing.assert_allclose(got, expected, rtol=1e-6,
                             atol=1e-6 * FLOAT32_MAX)


@pytest.mark.parametrize("mask", EXTREME_MASKS)
@pytest.mark.parametrize("beta", sorted(TRIMMED))
def test_overflow_leaves_the_other_coordinates_bitwise(beta, mask):
  # Only the coordinates whose plain sum overflows are summed again
  # rescaled: the ordinary ones keep the plain result to the bit, as in a
  # leaf without any huge value.
  rng = np.random.default_rng(20 + sum(mask))
  ordinary = (rng.normal(size=(K, 256)) * 10.0 ** rng.uniform(
      -20, 20, size=(K, 256))).astype(np.float32)
  mixed = np.concatenate([_extreme_rows(rng, 8), ordinary], axis=1)
  plain = _trimmed(beta, ordinary, mask)
  np.testing.assert_array_equal(_trimmed(beta, mixed, mask)[8:].view(
      np.uint32), plain.view(np.uint32))
