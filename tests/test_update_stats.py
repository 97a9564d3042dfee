"""update_stats' chunked client-update statistics against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import tree_math
from fedjax_agg import update_stats
from tests import agg_testutil as tu
from tests._util import _np_cosines


@pytest.mark.parametrize("num_clients,chunk", [
    (1, None), (5, 4), (9, 2), (6, 10)])
def test_moments_and_cosines_match_numpy(num_clients, chunk):
  rng = np.random.default_rng(num_clients)
  offset = tu.make_params(rng)
  stacked = tu.make_clients(rng, offset, num_clients, scale=0.5)
  other = tu.make_params(rng)
  weights = rng.uniform(size=num_clients).astype(np.float32)
  structure = tree_math.layer_structure(offset)

  @jax.jit
  def stats(stacked, offset, other, weights):
    moments = update_stats.update_moments(stacked, offset, weights,
                                          chunk=chunk)
    return moments.weighted_sum, moments.squares.norm(), (
        update_stats.update_cosines(stacked, offset, other, moments.squares,
                                    structure, chunk=chunk))

  total, norms, cosines = stats(stacked, offset, other, weights)
  updates = jax.tree.map(lambda s, o: np.asarray(s, np.float64) - o[None],
                         stacked, tu.np_tree(offset))
  tu.assert_trees_close(
      total, jax.tree.map(lambda u: np.tensordot(weights, u, axes=1),
                          updates), rtol=1e-5, atol=1e-6)
  flat = [u.reshape(num_clients, -1) for u in jax.tree.leaves(updates)]
  np.testing.assert_allclose(
      norms, np.stack([np.sqrt(np.sum(u**2, axis=1)) for u in flat], axis=1),
      rtol=1e-5)
  others = [np.ravel(y) for y in jax.tree.leaves(tu.np_tree(other))]
  layer_of = np.asarray(structure.leaf_to_layer)
  for layer in range(structure.num_layers):
    leaves = np.flatnonzero(layer_of == layer)
    u = np.concatenate([flat[p] for p in leaves], axis=1)
    y = np.concatenate([others[p] for p in leaves])
    np.testing.assert_allclose(cosines[:, layer], _np_cosines(u, y[None]),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("magnitude", [1e-30, 1e20, 1e30, 3e37])
def test_statistics_do_not_overflow_or_underflow(magnitude):
  # The same updates at magnitude 1 and at `magnitude`: equal cosines, norms
  # in proportion, all finite, under jit.
  rng = np.random.default_rng(7)
  offset = jax.tree.map(jnp.zeros_like, tu.make_params(rng))
  stacked = tu.make_clients(rng, offset, 5, scale=1.0)
  structure = tree_math.layer_structure(offset)
  mask = jnp.asarray([1.0, 1.0, 0.0, 1.0, 1.0])
  weights = tree_math.normalize_weights(jnp.ones(5), mask)

  @jax.jit
  def stats(stacked):
    moments = update_stats.update_moments(stacked, offset, weights, mask)
    return moments.squares.norm(), update_stats.update_cosines(
        stacked, offset, moments.weighted_sum, moments.squares, structure,
        mask)

  norms, cosines = stats(stacked)
  big_norms, big_cosines = stats(
      jax.tree.map(lambda x: x * magnitude, stacked))
  assert np.all(np.isfinite(big_norms)) and np.all(np.isfinite(big_cosines))
  np.testing.assert_allclose(big_cosines, cosines, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(big_norms, np.float64) / magnitude,
                             norms, rtol=1e-5)
  assert np.all(np.asarray(cosines)[2] == 0)  # the padding row


def test_padding_rows_are_zero_updates_whatever_they_hold():
  rng = np.random.default_rng(3)
  offset = tu.make_params(rng)
  stacked = tu.make_clients(rng, offset, 4)
  mask = jnp.asarray([1.0, 0.0, 1.0, 0.0])
  weights = jnp.asarray([0.5, 0.0, 0.5, 0.0])
  dirty = jax.tree.map(
      lambda x: x.at[1].set(jnp.nan).at[3].set(jnp.inf), stacked)
  structure = tree_math.single_layer_structure(offset)

  def stats(stacked):
    moments = update_stats.update_moments(stacked, offset, weights, mask,
                                          chunk=3)
    return moments, update_stats.update_cosines(
        stacked, offset, moments.weighted_sum, moments.squares, structure,
        mask, chunk=3)

  clean_stats, dirty_stats = stats(stacked), stats(dirty)
  tu.assert_trees_close(dirty_stats, clean_stats, rtol=0, atol=0)
  assert np.all(np.asarray(dirty_stats[0].squares.scaled)[[1, 3]] == 0)


def test_bad_chunk_raises():
  params = tu.make_params(np.random.default_rng(0))
  stacked = tu.make_clients(np.random.default_rng(1), params, 2)
  with pytest.raises(ValueError, match="chunk"):
    update_stats.update_moments(stacked, params, jnp.ones(2), chunk=0)
