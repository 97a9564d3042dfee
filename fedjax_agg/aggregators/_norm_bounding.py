"""Norm bounding: FedAvg of updates clipped to a fixed norm.

Sun, Kairouz, Suresh and McMahan, "Can You Really Backdoor Federated
Learning?", 2019 (Sec. 3, norm thresholding of updates).

Over the real participants (mask 1), p_k = n_k / n:

  Sec. 3   dw_k <- dw_k min(1, M / |dw_k|),  dw_k = w_k - w_t
           w_{t+1} = w_t + sum_k p_k dw_k

Interpretations:
* |.| is the whole-model L2 norm (all leaves together).
* The clipped updates are averaged weighted by the number of examples,
  as FedAvg (the paper's weighted averaging).
* A cohort with no real participant leaves the model unchanged.

Breakdown point: 0 in the Byzantine sense (one client moves the mean by
up to p_k M, and many clients without bound in direction); the rule bounds
each client's influence to p_k M, the defence the paper studies against
boosted backdoor updates.

Memory: a sum over clients, so the rule streams (``Aggregator.stream``)
and a round holds ``clients_per_step`` client models, whatever K.
"""

import functools
from typing import NamedTuple

import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.aggregators._clipped_sums import clipped_update_stats
from fedjax_agg.aggregators._clipped_sums import summed_client_stats
from fedjax_agg.types import Aggregator, empty_init, StreamingForm

__all__ = ["NormBoundingState", "norm_bounding"]


class NormBoundingState(NamedTuple):
  """Norm bounding keeps no state."""


def norm_bounding(max_norm: float = 1.0) -> Aggregator:
  """Norm-bounding aggregator (clipped updates, FedAvg weights).

  Args:
    max_norm: M > 0, the largest whole-model update norm.

  Returns:
    An ``Aggregator`` with a streaming form; metrics hold
    "fraction_clipped" [], the share of real clients whose update was
    clipped.
  """
  checks.check_range("max_norm", max_norm, 0, low_open=True)
  client_stats = functools.partial(clipped_update_stats, max_norm=max_norm,
                                   weighted=True)

  init = empty_init(NormBoundingState)

  def finalize(global_params, stats, info, state):
    new_global = tree_math.keep_if_no_clients(
        info.mask, tree_math.add_update(
            global_params, tree_math.mean_from_sums(stats.sums)),
        global_params)
    fraction = stats.num_clipped / jnp.maximum(stats.sums.count, 1.0)
    return new_global, state, {"fraction_clipped": fraction}

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info)
    return finalize(global_params, summed_client_stats(
        client_stats, global_params, client_params, info), info, state)

  return Aggregator(init, aggregate, StreamingForm(client_stats, finalize))
