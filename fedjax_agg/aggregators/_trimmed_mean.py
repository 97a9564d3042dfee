"""Coordinate-wise trimmed mean of the client models.

Yin, Chen, Ramchandran and Bartlett, "Byzantine-Robust Distributed Learning:
Towards Optimal Statistical Rates", ICML 2018 (Definition 2, coordinate-wise
beta-trimmed mean).

For every coordinate i, of the m real participants' values w^k[i] the
floor(beta m) largest and floor(beta m) smallest are removed and the
remaining m - 2 floor(beta m) >= 1 are averaged (beta in [0, 1/2); the paper
assumes beta m is an integer, flooring is the general case). Padded clients
(mask 0) are excluded; the estimator is unweighted (number of examples
unused). beta = 0 is the unweighted mean. The mean never overflows: where
the plain sum of finite values near the float's largest is inf, it is taken
again over values divided by a power of two (``kept_mean``). A cohort with
no real participant leaves the model unchanged.

Ties. No client is selected: each coordinate's values are sorted and a
range of ranks kept, and equal values may be sorted either way round
without changing the sorted values. Ties (and the order of the clients)
therefore cannot change the result, which is bitwise the same for any
permutation of the cohort.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.aggregators._fedmedian import sorted_real_first
from fedjax_agg.types import Aggregator, empty_init, Params, StackedParams


class TrimmedMeanState(NamedTuple):
  """The trimmed mean keeps no state."""


def kept_mean(values: jax.Array, keep: jax.Array,
              count: jax.Array) -> jax.Array:
  """Mean over axis 0 of the ``values`` where ``keep``, ``count`` (>= 1) of
  them in every coordinate; finite for finite values of any magnitude.

  [K, ...] -> [...]. Values where ``keep`` is False are never read.
  """
  total = jnp.sum(jnp.where(keep, values, 0.0), axis=0)

  def rescaled():
    # The plain sum overflows for finite values (three of 3e38 sum to inf)
    # whose mean is finite. Divided by 2^(k+1) >= 2K first, K of them sum
    # to at most half the float's range, so rounding cannot carry the sum
    # to inf. Dividing by a power of two is exact, and only the overflowed
    # coordinates take this result: the others keep the plain sum's to the
    # bit.
    shift = 2.0 ** ((values.shape[0] - 1).bit_length() + 1)
    small = jnp.sum(jnp.where(keep, values / shift, 0.0), axis=0)
    # Near the largest float, rounding up by one ulp is inf: the mean is
    # held within its values' range, which holds the exact mean (an inf
    # or NaN value passes through: the bounds are then inf or NaN).
    lowest = jnp.min(jnp.where(keep, values, jnp.inf), axis=0)
    highest = jnp.max(jnp.where(keep, values, -jnp.inf), axis=0)
    mean = jnp.clip((small / count) * shift, lowest, highest)
    return jnp.where(jnp.isfinite(total), total / count, mean)
  # A finite total proves no partial sum overflowed: the rescaled pass runs
  # only for a leaf that needs it (under vmap both run; same result).
  return jax.lax.cond(jnp.all(jnp.isfinite(total)), lambda: total / count,
                      rescaled)


def masked_trimmed_mean(stacked: StackedParams, mask: jax.Array,
                        num_trimmed: jax.Array) -> Params:
  """Coordinate-wise mean of the real values left after trimming.

  Per coordinate, the ``num_trimmed`` largest and ``num_trimmed`` smallest
  of the m real values are removed and the other ``m - 2 num_trimmed`` are
  averaged (the caller keeps that count >= 1). Padded rows (mask 0) are
  never read.
  """
  num_real = jnp.sum(mask > 0).astype(jnp.int32)
  num_kept = jnp.maximum(num_real - 2 * num_trimmed, 1)

  def leaf_mean(leaf):
    ordered = sorted_real_first(leaf, mask)
    rank = jnp.arange(leaf.shape[0]).reshape(
        (-1,) + (1,) * (leaf.ndim - 1))
    # The kept ranks depend on the traced m: chosen by a mask over the static
    # K rows, not by a slice; padding, sorted last, is never inside them.
    keep = (rank >= num_trimmed) & (rank < num_real - num_trimmed)
    return kept_mean(ordered, keep, num_kept).astype(leaf.dtype)
  return jax.tree.map(leaf_mean, stacked)


def trimmed_mean(beta: float = 0.1) -> Aggregator:
  """Coordinate-wise beta-trimmed mean aggregator.

  Args:
    beta: fraction trimmed from each end, in [0, 0.5).

  Returns:
    An ``Aggregator``; metrics hold "num_trimmed" [], the values removed
    from each end of every coordinate.
  """
  checks.check_range("beta", beta, 0, 0.5, high_open=True)

  init = empty_init(TrimmedMeanState)

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=False)
    num_real = jnp.sum(info.mask > 0)
    # floor(beta m) for every possible m, in float64 at trace time so that
    # e.g. beta = 0.35, m = 20 trims 7 (float32 would give 6.9999 -> 6).
    table = np.floor(beta * np.arange(info.mask.shape[0] + 1) + 1e-9)
    num_trimmed = jnp.asarray(table, jnp.int32)[num_real]
    new_global = masked_trimmed_mean(client_params, info.mask, num_trimmed)
    new_global = tree_math.keep_if_no_clients(info.mask, new_global,
                                              global_params)
    return new_global, state, {"num_trimmed": num_trimmed}

  return Aggregator(init, aggregate)
