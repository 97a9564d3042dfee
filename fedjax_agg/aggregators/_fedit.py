"""FedIT: FedAvg of the LoRA adapters, A and B averaged separately.

Zhang, Vahidian, Kuo, Li, Zhang, Yu, Zhou, Wang, Chen, "Towards Building
the Federated GPT: Federated Instruction Tuning", ICASSP 2024.

FedIT trains LoRA adapters (``models.lora``) on the clients and aggregates
them with FedAvg, each factor on its own:

  A = sum_k p_k A_k,   B = sum_k p_k B_k,   p_k = n_k / sum_j n_j    # Eq. (1)

so the server's update of a layer is B A, where the clients' average update
is sum_k p_k B_k A_k. The two differ (the "inexact aggregation" of FLoRA and
FFA-LoRA):

  inexact_aggregation = ||sum_k p_k B_k A_k - B A||_F
                        / ||sum_k p_k B_k A_k||_F                    # Eq. (2)

over every adapted layer together (the Frobenius norms of the stacked
per-layer differences; 0 when the products are all zero). It is 0 for one
client, for identical clients, and whenever the clients share A (FFA-LoRA;
one local step from B = 0, where A receives no gradient).

Interpretation choices: the paper's Eq. (1) weights by the clients'
examples; ``weighting="uniform"`` is offered as FedAvg's. Padding rows
(mask 0) have p_k = 0 and are selected out.
"""

from typing import NamedTuple

import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.aggregators import _fedavg
from fedjax_agg.models import lora
from fedjax_agg.types import Aggregator, empty_init


class FedITState(NamedTuple):
  """FedIT keeps no state."""


def inexact_aggregation(client_nodes, mean_nodes, weights) -> jnp.ndarray:
  """Eq. (2) for stacked adapters ``client_nodes`` ([K, ...] per path),
  their mean ``mean_nodes`` and the weights p [K]."""
  gap, total = 0.0, 0.0
  for path, node in client_nodes.items():
    # Eq. (2), numerator's first term: sum_k p_k B_k A_k, by stacking.
    product = lora.weighted_product(node["a"], node["b"], weights)
    mean = mean_nodes[path]
    gap += jnp.sum(jnp.square(product - jnp.matmul(
        mean["b"], mean["a"], precision=tree_math.FULL)))
    total += jnp.sum(jnp.square(product))
  return jnp.where(total > 0, jnp.sqrt(gap / jnp.where(total > 0, total, 1.0)),
                   0.0)


def fedit(weighting: str = "num_examples") -> Aggregator:
  """FedIT (FedAvg of A and B) over LoRA adapters.

  Args:
    weighting: "num_examples" (p_k proportional to n_k, the paper's) or
      "uniform".

  Returns:
    An ``Aggregator`` over the adapters of ``models.lora.lora`` (A trained:
    not ``freeze_a``, no "merged"; other trees are refused naming fedit).
    Metrics: ``client_weights`` [K], ``inexact_aggregation`` [] (Eq. (2)).
  """
  checks.check_choice("weighting", weighting, _fedavg.WEIGHTINGS)

  def aggregate(global_params, client_params, info, state):
    _, nodes = lora.check_round("fedit", global_params, client_params, info,
                                weighting=weighting, need=("a", "b"),
                                refuse=("merged",))
    weights = _fedavg.client_weights(info, weighting)
    # Eq. (1): each factor averaged on its own.
    mean = tree_math.weighted_sum(client_params, weights)
    metrics = {"client_weights": weights, "inexact_aggregation":
               inexact_aggregation(nodes, mean[lora.ADAPTERS], weights)}
    new_global = tree_math.keep_if_no_clients(info.mask, mean, global_params)
    return new_global, state, metrics

  return Aggregator(empty_init(FedITState), aggregate)
