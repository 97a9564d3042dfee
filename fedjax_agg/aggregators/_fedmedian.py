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

Ties. The median is an order statistic of each coordinate's values: equal
values may be sorted either way round without changing the sorted values,
so ties (and the order of the clients) cannot change the result, which is
bitwise the same for any permutation of the cohort.

This module also holds the one ordering of clients by a score that the
selecting rules share (``client_order``, ``client_ranks``): lower score
first, exact ties to the lower cohort position (row index).
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


def client_order(keys, mask: jax.Array) -> jax.Array:
  """The cohort's rows ordered by ``keys``, lowest first. [K] int32.

  The one tie rule of the selecting rules (Krum, Bulyan, FedACS): real rows
  (mask 1) before padding rows, then lexicographically by ``keys``, then
  by row index, the lower first. The row index is an explicit last key, so
  that no two rows compare equal and the order depends neither on the
  backend's sort stability nor on how an argmin or top_k breaks ties.

  Args:
    keys: a [K] array or a tuple of them; floats compare with -0.0 equal to
      0.0 and NaN after +inf (padding rows may hold anything).
    mask: [K], 1 for a real row.

  Returns:
    [K] the row indices, first the lowest-keyed real row.
  """
  keys = keys if isinstance(keys, tuple) else (keys,)
  num = mask.shape[0]
  # -0.0 == 0.0 is an exact tie; the sort's total order would split it.
  keys = tuple(jnp.where(key == 0, jnp.zeros_like(key), key)
               for key in keys)
  rows = jnp.arange(num, dtype=jnp.int32)
  # Padding is the first key, so real rows come first whatever their
  # scores; the scores of padding rows (possibly NaN) then never matter.
  padding = jnp.where(mask > 0, 0, 1).astype(jnp.int32)
  *_, order = jax.lax.sort((padding, *keys, rows), num_keys=len(keys) + 2)
  return order


def client_ranks(keys, mask: jax.Array) -> jax.Array:
  """Each row's place in ``client_order(keys, mask)`` (0: the first). [K]."""
  order = client_order(keys, mask)
  return jnp.zeros_like(order).at[order].set(
      jnp.arange(order.shape[0], dtype=order.dtype))


def masked_median(stacked: StackedParams, mask: jax.Array) -> Params:
  """Coordinate-wise median over the real clients (mask 1).

  An even number m of real clients gives the mean of the two middle values
  (finite for any finite values, up to the float's largest). With no real
  client the result is undefined (the caller handles it).
  """
  num_real = jnp.sum(mask > 0).astype(jnp.int32)
  # m depends on the mask and is traced, so the middle ranks are read by
  # dynamic indexing. For odd m, lower == upper: the middle value itself.
  lower = jnp.maximum(num_real - 1, 0) // 2
  upper = num_real // 2

  def leaf_median(leaf):
    ordered = sorted_real_first(leaf, mask)
    low = jax.lax.dynamic_index_in_dim(ordered, lower, keepdims=False)
    high = jax.lax.dynamic_index_in_dim(
        ordered, jnp.minimum(upper, leaf.shape[0] - 1), keepdims=False)
    # Halves first: low + high overflows to inf for finite values above
    # half the float's range (even for odd m, where low == high). Halving
    # is exact for normal floats and rounding commutes with it, so this is
    # bitwise (low + high) / 2 wherever that did not overflow.
    return (low / 2 + high / 2).astype(leaf.dtype)
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
