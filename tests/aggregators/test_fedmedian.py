"""The coordinate-wise median (Yin et al., ICML 2018) against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES
from tests.aggregators._util import _cohort
from tests.aggregators._util import K
from tests.aggregators._util import MEDIAN
from tests.aggregators._util import MEDIAN_AGG


MASKS = st.lists(st.sampled_from([0.0, 1.0]), min_size=K,
                 max_size=K).filter(any)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=MASKS)
def test_median_golden(seed, mask):
  global_params, clients, info, real = _cohort(seed, mask)
  out, _, _ = MEDIAN_AGG(global_params, clients, info,
                         MEDIAN.init(global_params))
  expected = jax.tree.map(lambda c: np.median(np.asarray(c)[real], axis=0),
                          clients)
  tu.assert_trees_close(out, expected, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------
# Values near the float's largest: the middle pair is halved before it is
# summed.

FLOAT32_MAX = float(np.finfo(np.float32).max)
# Real-client counts odd and even, padding rows first, last and between.
EXTREME_MASKS = [[1] * K, [1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 1],
                 [0, 0, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0]]


def _rows_cohort(rows, mask):
  """A cohort of one [P] leaf per client, global model 0."""
  rows = np.asarray(rows, np.float32)
  global_params = {"w": jnp.zeros(rows.shape[1:], jnp.float32)}
  info = tu.make_info(np.arange(K), np.ones(K), mask)
  return global_params, {"w": jnp.asarray(rows)}, info


def _median(rows, mask):
  global_params, clients, info = _rows_cohort(rows, mask)
  out, _, _ = MEDIAN_AGG(global_params, clients, info,
                         MEDIAN.init(global_params))
  return np.asarray(out["w"])


@pytest.mark.parametrize("mask", EXTREME_MASKS)
def test_median_near_float32_max_is_numpys(mask):
  # (low + high) / 2 was inf for these finite rows, for odd counts too
  # (low == high); numpy's float64 median, cast once, is the exact median
  # rounded once, as low / 2 + high / 2 is.
  rng = np.random.default_rng(sum(mask))
  magnitude = rng.uniform(0.5, 1.0, size=(K, 64)) * FLOAT32_MAX
  sign = np.where(rng.random((K, 64)) < 0.8, 1.0, -1.0)
  rows = (sign * magnitude).astype(np.float32)
  rows[:, 0] = np.float32(FLOAT32_MAX)  # every row the largest float
  rows[:, 1] = -np.float32(FLOAT32_MAX)
  rows[:, 2] = np.float32(3e38)
  real = np.flatnonzero(mask)
  expected = np.median(rows[real].astype(np.float64), axis=0).astype(
      np.float32)
  got = _median(rows, mask)
  assert np.all(np.isfinite(got))
  np.testing.assert_array_equal(got.view(np.uint32),
                                expected.view(np.uint32))


def _ordinary_rows(rng, shape):
  """float32 values of both signs, magnitudes 1e-30 to 1e30."""
  magnitude = 10.0 ** rng.uniform(-30, 30, size=shape)
  sign = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
  return (sign * magnitude).astype(np.float32)


def test_halving_first_is_bitwise_the_old_formula():
  # Halving a normal float is exact and rounding commutes with it, so
  # low / 2 + high / 2 == (low + high) / 2 to the bit below overflow:
  # histories computed with the old formula do not move.
  rng = np.random.default_rng(0)
  low, high = (_ordinary_rows(rng, (200_000,)) for _ in range(2))
  old = jax.jit(lambda a, b: (a + b) / 2)(low, high)
  new = jax.jit(lambda a, b: a / 2 + b / 2)(low, high)
  np.testing.assert_array_equal(np.asarray(new).view(np.uint32),
                                np.asarray(old).view(np.uint32))


@pytest.mark.parametrize("mask", EXTREME_MASKS)
def test_median_of_ordinary_values_is_the_old_formula_bitwise(mask):
  rng = np.random.default_rng(10 + sum(mask))
  rows = _ordinary_rows(rng, (K, 4096))
  real = np.flatnonzero(mask)
  ordered = np.sort(rows[real], axis=0)
  low = ordered[(len(real) - 1) // 2]
  high = ordered[len(real) // 2]
  old = (low + high) / np.float32(2)  # float32 arithmetic, as before
  np.testing.assert_array_equal(_median(rows, mask).view(np.uint32),
                                old.view(np.uint32))
