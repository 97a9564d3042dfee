"""Clipped client updates as running sums (norm bounding, DP-FedAvg).

Both rules clip each real participant's update w_k - w_t to a whole-model
L2 norm and average the results; the sum over clients is their streaming
form (``types.StreamingForm``), and their stacked ``aggregate`` sums the
same per-client statistics over the client axis, so both forms agree to
the bit.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import tree_math
from fedjax_agg.types import ClientInfo, INFO_AXES, Params, StackedParams

__all__ = ["ClippedSums", "clipped_update_stats", "summed_client_stats"]



class ClippedSums(NamedTuple):
  """One client's (or the cohort's summed) clipped update statistics.

  Attributes:
    sums: ``tree_math.MaskedSums`` of the clipped updates.
    num_clipped: [] real clients whose update norm exceeded the bound.
  """
  sums: tree_math.MaskedSums
  num_clipped: jax.Array


def clipped_update_stats(global_params: Params, client_params: Params,
                         info_k: ClientInfo, max_norm,
                         weighted: bool) -> ClippedSums:
  """One client's term: its update scaled by min(1, max_norm / |update|).

  Args:
    global_params: w_t.
    client_params: w_k (one model).
    info_k: the client's row of the cohort's ``ClientInfo``.
    max_norm: the bound (a scalar, possibly traced).
    weighted: weight by ``num_examples`` (else every client counts 1).

  Returns:
    The ``ClippedSums`` term; zeros for a padding row (mask 0).
  """
  update = tree_math.tree_sub(client_params, global_params)
  norm = tree_math.tree_norm(update)
  clipped = tree_math.tree_scale(tree_math.clip_scale(norm, max_norm),
                                 update)
  raw_weight: Optional[jax.Array] = (info_k.num_examples if weighted
                                     else None)
  return ClippedSums(
      tree_math.client_sums(clipped, info_k.mask, raw_weight),
      jnp.where((info_k.mask > 0) & (norm > max_norm), 1.0, 0.0))


def summed_client_stats(client_stats, global_params: Params,
                        client_params: StackedParams, info: ClientInfo):
  """sum_k client_stats(w_t, w_k, info_k) over the [K] client axis."""
  # The stacked form vmaps the very function the streaming form calls per
  # client, which is what makes both forms agree to the bit.
  stats = jax.vmap(client_stats, in_axes=(None, 0, INFO_AXES))(
      global_params, client_params, info)
  return tree_math.sum_over_clients(stats)
