"""FedMedian: the coordinate-wise median of the client models.

Yin, Chen, Ramchandran and Bartlett, "Byzantine-Robust Distributed Learning:
Towards Optimal Statistical Rates", ICML 2018 (Definition 1, coordinate-wise
median).

w_{t+1}[i] = med{ w^k_{t+1}[i] : k a real participant } for every coordinate
i. With an even number of real clients the median is the mean of the two
middle values. Padded clients (mask 0) are excluded; the number of examples
plays no role (the estimator is unweighted). Because the median commutes
with a common shift, the median of the models equals w_t plus the median of
the updates. A cohort with no real participant leaves the model unchanged.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.types import Aggregator, empty_init, Params, StackedParams


class FedMedianState(NamedTuple):
  """FedMedian keeps no state."""


def sorted_real_first(leaf: jax.Array, mask: jax.Array) -> jax.Array:
  """Sorts [K, ...] along the client axis with padded rows moved last.

  Padded rows (mask 0) are replaced by +inf before the sort, so what they
  held (NaN included) never reaches the first ``sum(mask > 0)`` ranks.
  """
  mask = mask.reshape((-1,) + (1,) * (leaf.ndim - 1))
  return jnp.sort(jnp.where(mask > 0, leaf, jnp.inf), axis=0)


def masked_median(stacked: StackedParams, mask: jax.Array) -> Params:
  """Coordinate-wise median over the real clients (mask 1).

  An even number m of real clients gives the mean of the two middle values.
  With no real client the result is undefined (the caller handles it).
  """
  num_real = jnp.sum(mask > 0).astype(jnp.int32)
  lower = jnp.maximum(num_real - 1, 0) // 2
  upper = num_real // 2

  def leaf_median(leaf):
    ordered = sorted_real_first(leaf, mask)
    low = jax.lax.dynamic_index_in_dim(ordered, lower, keepdims=False)
    high = jax.lax.dynamic_index_in_dim(
        ordered, jnp.minimum(upper, leaf.shape[0] - 1), keepdims=False)
    return ((low + high) / 2).astype(leaf.dtype)
  return jax.tree.map(leaf_median, stacked)


def fedmedian() -> Aggregator:
  """Coordinate-wise median aggregator (no hyperparameters).

  Returns:
    An ``Aggregator``; metrics hold "num_real" [], the real clients counted.
  """

  init = empty_init(FedMedianState)

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=False)
    new_global = masked_median(client_params, info.mask)
    new_global = tree_math.keep_if_no_clients(info.mask, new_global,
                                              global_params)
    return new_global, state, {"num_real": (info.mask > 0).sum()}

  return Aggregator(init, aggregate)
