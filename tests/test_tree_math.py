"""Tree math: masked sums and weighted means, norms and cosines that are
scale safe, rows of weight zero skipped whatever they hold.
"""

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import tree_math
from tests import agg_testutil as tu
from tests._util import _np_cosines


@hypothesis.given(
    raw=st.lists(st.sampled_from([0.0, 0.5, 3.0, 7.0]), min_size=1,
                 max_size=6),
    mask_bits=st.integers(0, 63), uniform=st.booleans())
@hypothesis.settings(max_examples=tu.EXAMPLES)
def test_masked_sums_give_the_normalized_weighted_mean(raw, mask_bits,
                                                       uniform):
  num = len(raw)
  mask = np.array([(mask_bits >> k) & 1 for k in range(num)], np.float32)
  values = np.random.default_rng(num).normal(size=(num, 3)).astype(
      np.float32)
  values[mask == 0] = np.nan  # padding rows never leak in
  raw_weights = np.ones(num, np.float32) if uniform else np.asarray(
      raw, np.float32)

  @jax.jit
  def streamed(values, raw_weights, mask):
    terms = jax.vmap(tree_math.client_sums)(
        values, mask, None if uniform else raw_weights)
    return tree_math.mean_from_sums(tree_math.sum_over_clients(terms))

  got = np.asarray(streamed(values, raw_weights, mask))
  # numpy reference of normalize_weights' rule, fallbacks included.
  real = mask > 0
  total = raw_weights[real].sum()
  if total > 0:
    weights = np.where(real, raw_weights, 0.0) / total
  else:
    weights = mask / max(mask.sum(), 1.0)
  expected = (weights[:, None] * np.where(real[:, None], values, 0.0)).sum(0)
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("magnitude", [1e-30, 1e25, 1e37])
def test_tree_math_norms_and_cosines_are_scale_safe(magnitude):
  rng = np.random.default_rng(2)
  a = rng.normal(size=(6, 40)).astype(np.float32)
  b = rng.normal(size=(6, 40)).astype(np.float32)
  b[3] = 0.0  # no direction: cosine 0
  params = tu.make_params(rng)
  structure = tree_math.layer_structure(params)

  @jax.jit
  def stats(a, b, params):
    return (tree_math.cosines(a, b), tree_math.vector_norm(a, axis=1),
            tree_math.layer_norms(params, structure))

  unit = stats(a, b, params)
  scaled = stats(a * magnitude, b * magnitude,
                 jax.tree.map(lambda x: x * magnitude, params))
  np.testing.assert_allclose(scaled[0], unit[0], rtol=1e-5, atol=1e-6)
  assert unit[0][3] == 0
  np.testing.assert_allclose(unit[0][:3], _np_cosines(a[:3], b[:3]),
                             rtol=1e-5)
  for got, want in zip(scaled[1:], unit[1:], strict=True):
    np.testing.assert_allclose(np.asarray(got, np.float64) / magnitude, want,
                               rtol=1e-5)


def test_weighted_sum_skips_rows_of_weight_zero_whatever_they_hold():
  stacked = {"w": jnp.asarray([[1.0, 2.0], [jnp.nan, jnp.inf], [3.0, 4.0]])}
  out = jax.jit(tree_math.weighted_sum)(stacked, jnp.asarray([0.5, 0.0, 0.5]))
  np.testing.assert_allclose(out["w"], [2.0, 3.0])
  weights = tree_math.normalize_weights(jnp.asarray([1.0, jnp.nan, 3.0]),
                                        jnp.asarray([1.0, 0.0, 1.0]))
  np.testing.assert_allclose(weights, [0.25, 0.0, 0.75])


def test_norms_of_values_near_the_float32_maximum_are_not_flushed_to_zero():
  # Under jit XLA divides by a scale as a product with its reciprocal; the
  # reciprocal of 2^127 is subnormal and the CPU flushes it to 0, so the
  # scale stops at 2^126 and these norms keep their value.
  rows = np.array([[2e38, 1e38], [1.7014118e38, 0.0], [3.0e38, -1.0],
                   [1e-3, 2.5e38]], np.float32)
  norm = jax.jit(tree_math.tree_norm)
  scale = jax.jit(tree_math.power_of_two_scale)
  for row in rows:
    want = np.linalg.norm(row.astype(np.float64))
    got = float(norm({"w": jnp.asarray(row)}))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    biggest = jnp.asarray(np.abs(row).max())
    ratio = float(jax.jit(tree_math.divide_by_scale)(biggest,
                                                     scale(biggest)))
    assert 1.0 <= ratio < 4.0, ratio
