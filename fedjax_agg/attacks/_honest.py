"""Coordinate-wise statistics of the honest clients' updates of a round.

The omniscient attacks (``little_is_enough``, ``inner_product``) shape the
malicious models from the updates Δ_k = w_k − g of the round's honest real
clients (mask 1, not malicious). A malicious client's own update never
enters them. Means are unweighted over the honest clients, as in both
papers.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import tree_math
from fedjax_agg.attacks._attack import Cohort
from fedjax_agg.types import Params, StackedParams

__all__ = ["HonestStats", "honest_stats", "send_to_all"]


class HonestStats(NamedTuple):
  """Attributes:
    mean: μ, the mean honest update (a tree like the params).
    std: σ, the coordinate-wise population standard deviation of the
      honest updates (divisor: the number of honest clients).
    count: [] float32, the number of honest clients (0: μ = σ = 0).
  """
  mean: Params
  std: Params
  count: jax.Array


def honest_stats(global_params: Params, client_params: StackedParams,
                 cohort: Cohort) -> HonestStats:
  """μ and σ over the honest rows; malicious and padding rows are skipped
  (whatever they hold, NaN included)."""
  honest = cohort.honest.astype(jnp.float32)
  # With no honest row every weight is 0 (not a uniform fallback), so μ and
  # σ are 0 and send_to_all sends g.
  weights = tree_math.normalize_weights(honest, honest)
  updates = jax.tree.map(lambda w, g: w - g[None], client_params,
                         global_params)
  mean = tree_math.weighted_sum(updates, weights)
  # Two passes, squares of deviations from μ: the one-pass E[x^2] - μ^2
  # cancels catastrophically in float32 when the spread is small next to μ.
  variance = tree_math.weighted_sum(
      jax.tree.map(lambda d, m: jnp.square(d - m[None]), updates, mean),
      weights)
  return HonestStats(mean, jax.tree.map(jnp.sqrt, variance),
                     jnp.sum(honest))


def send_to_all(stats: HonestStats, attacked: Params, global_params: Params,
                client_params: StackedParams) -> StackedParams:
  """[K] copies of ``attacked`` (of g when the round has no honest client),
  in the dtypes of the client models."""
  def leaf(a, g, w):
    row = jnp.where(stats.count > 0, a, g).astype(w.dtype)
    return jnp.broadcast_to(row, w.shape)
  return jax.tree.map(leaf, attacked, global_params, client_params)
