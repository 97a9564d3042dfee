"""Shared inputs of the robust rules' tests: cohorts whose padding rows
hold garbage, the numpy Multi-Krum, the coordinate-wise rules.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from tests import agg_testutil as tu


K = 6
MASKS = [[1] * K, [1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0],
         [1, 1, 0, 0, 0, 0]]


_run = tu.run_rule
flat = tu.flat
flat_rows = tu.flat_rows


def garbage_cohort(seed, mask, scale=1.0):
  """Global params, clients with garbage padding rows, info; the real
  rows' updates [m, P] (float64) and example counts [m]."""
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, K, scale=scale)
  real = np.flatnonzero(np.asarray(mask))
  counts = rng.integers(1, 30, size=K).astype(np.float64)
  updates = flat_rows(clients)[real] - flat(global_params)
  padding = np.flatnonzero(np.asarray(mask) == 0)
  garbage = {row: (np.nan if i % 2 == 0 else 1e30)
             for i, row in enumerate(padding)}

  def spoil(leaf):
    leaf = np.array(leaf)
    for row, value in garbage.items():
      leaf[row] = value
    return jnp.asarray(leaf)
  counts_in = counts.copy()
  counts_in[padding] = 1e9
  info = tu.make_info(np.arange(K), counts_in, mask)
  return (global_params, jax.tree.map(spoil, clients), info, updates,
          counts[real])


def permute_info(info, perm):
  """The cohort's per-client fields in the order ``perm``."""
  return info._replace(**{
      field: getattr(info, field)[perm] for field in (
          "client_ids", "num_examples", "mask", "loss_before",
          "loss_after")})


def _assert_update(out, global_params, expected, rtol=1e-5, atol=1e-6):
  np.testing.assert_allclose(flat(out) - flat(global_params), expected,
                             rtol=rtol, atol=atol)


def np_sq_distances(updates):
  return ((updates[:, None, :] - updates[None, :, :]) ** 2).sum(-1)


def np_krum(updates, num_byzantine, num_selected):
  """Blanchard et al. Sec. 4 (Multi-Krum) on [m, P]; clamped counts."""
  m = updates.shape[0]
  n = min(max(m - num_byzantine - 2, 1), m - 1)
  dist = np_sq_distances(updates)
  scores = np.array([np.sort(np.delete(dist[i], i))[:n].sum()
                     for i in range(m)])
  chosen = np.argsort(scores, kind="stable")[:min(num_selected, m)]
  return updates[chosen].mean(0), chosen


MEDIAN = aggregators.fedmedian()
MEDIAN_AGG = jax.jit(MEDIAN.aggregate)
TRIMMED = {beta: aggregators.trimmed_mean(beta) for beta in (0.0, 0.2, 0.34)}
TRIMMED_AGG = {beta: jax.jit(rule.aggregate) for beta, rule in
               TRIMMED.items()}


def _cohort(seed, mask):
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, K, scale=1.0)
  info = tu.make_info(np.arange(K), rng.integers(1, 9, size=K), mask)
  return global_params, clients, info, np.flatnonzero(np.asarray(mask))
