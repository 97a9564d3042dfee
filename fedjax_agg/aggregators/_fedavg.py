"""FedAvg: the weighted mean of client models.

McMahan, Moore, Ramage, Hampson, y Arcas, "Communication-Efficient Learning of
Deep Networks from Decentralized Data", AISTATS 2017.

w_{t+1} = sum_k p_k w_k with p_k = n_k / sum_j n_j over the real participants
(weighting="num_examples") or p_k = 1 / K' (weighting="uniform"; K' = number
of real participants). Padded clients (mask 0) get p_k = 0. A cohort with no
real participant leaves the model unchanged.

Streaming form (``Aggregator.stream``): w_{t+1} = w_t + sum_k p_k (w_k - w_t)
from the running sums of raw_k (w_k - w_t) and raw_k over the cohort
(``tree_math.MaskedSums``; raw_k = n_k or 1), so a round never holds more
than a chunk of client models.
"""

from typing import NamedTuple

import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.types import Aggregator, ClientInfo, empty_init, StreamingForm

WEIGHTINGS = ("num_examples", "uniform")


class FedAvgState(NamedTuple):
  """FedAvg keeps no state."""


def client_weights(info: ClientInfo, weighting: str) -> jnp.ndarray:
  """p_k over the cohort, [K], summing to 1 over real participants."""
  if weighting == "num_examples":
    raw = info.num_examples.astype(jnp.float32)
  elif weighting == "uniform":
    raw = jnp.ones_like(info.mask, dtype=jnp.float32)
  else:
    raise ValueError(
        f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
  return tree_math.normalize_weights(raw, info.mask)


def raw_client_weight(info_k: ClientInfo, weighting: str):
  """One client's unnormalised weight: n_k, or None for "uniform"."""
  return info_k.num_examples if weighting == "num_examples" else None


def fedavg(weighting: str = "num_examples") -> Aggregator:
  """FedAvg aggregator.

  Args:
    weighting: "num_examples" (p_k proportional to n_k, the paper's rule) or
      "uniform" (every real participant counts the same).

  Returns:
    An ``Aggregator`` with a streaming form; metrics hold the client
    weights [K].
  """
  checks.check_choice("weighting", weighting, WEIGHTINGS)

  init = empty_init(FedAvgState)

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=weighting == "num_examples")
    weights = client_weights(info, weighting)
    new_global = tree_math.keep_if_no_clients(
        info.mask, tree_math.weighted_sum(client_params, weights),
        global_params)
    return new_global, state, {"client_weights": weights}

  def client_stats(global_params, client_params, info_k):
    return tree_math.client_sums(
        tree_math.tree_sub(client_params, global_params), info_k.mask,
        raw_client_weight(info_k, weighting))

  def finalize(global_params, sums, info, state):
    mean_update = tree_math.mean_from_sums(sums)
    new_global = tree_math.keep_if_no_clients(
        info.mask, tree_math.add_update(global_params, mean_update),
        global_params)
    return new_global, state, {"client_weights": client_weights(info,
                                                                weighting)}

  return Aggregator(init, aggregate, StreamingForm(client_stats, finalize))
