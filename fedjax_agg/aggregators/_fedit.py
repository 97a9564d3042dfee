"""FedIT: FedAvg of the LoRA adapters, A and B averaged separately.

Zhang, Vahidian, Kuo, Li, Zhang, Yu, Zhou, Wang, Chen, "Towards Building
the Federated GPT: Federated Instruction Tuning", ICASSP 2024.

FedIT trains LoRA adapters (``models.lora``) on the clients and aggregates
them with FedAvg, each factor on its own:

  A = sum_k p_k A_k,   B = sum_k p_k B_k,   p_k = n_k / sum_j n_j    # Eq. (1)

so the server's new product of a layer is B A, where the average of the
clients' products is sum_k p_k B_k A_k. The two differ (the "inexact
aggregation" of FLoRA and FFA-LoRA). Their gap is reported against two
references, over every adapted layer together (the Frobenius norms of the
stacked per-layer matrices):

  gap = ||sum_k p_k B_k A_k - B A||_F                                  # Eq. (2)

  inexact_aggregation = gap / ||sum_k p_k B_k A_k||_F                  # Eq. (3)

  inexact_aggregation_of_update
      = gap / ||sum_k p_k B_k A_k - B_t A_t||_F                        # Eq. (4)

where B_t A_t is the global adapters' product the round started from.
Eq. (3) divides by the whole product the adapters have accumulated over
the rounds, which grows while each round's step stays small, so it falls
as training goes on; Eq. (4) divides by the round's own update (the
clients' mean update of the product, since sum_k p_k = 1), the change the
gap distorts: the average update is sum_k p_k B_k A_k - B_t A_t and FedIT
applies B A - B_t A_t, so Eq. (4) is the relative error of the applied
update. Each is 0 when its denominator is 0 (no product, or no update);
an update as small as the float32 rounding of the product leaves Eq. (4)
rounding over rounding.
Both are 0 for one client, for identical clients, and whenever the
clients share A (FFA-LoRA; one local step from B = 0, where A receives no
gradient); they are equal when the round starts from B_t A_t = 0.

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


def inexact_aggregation(global_nodes, client_nodes, mean_nodes, weights
                        ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Eq. (3) and Eq. (4) for the global adapters ``global_nodes`` (B_t,
  A_t per path), the stacked adapters ``client_nodes`` ([K, ...] per
  path), their mean ``mean_nodes`` and the weights p [K]; -> (gap over
  the product, gap over the round's update)."""
  gap, product_norm, update_norm = 0.0, 0.0, 0.0
  # Squares are summed over every layer before the square root: the norms
  # of Eqs. (2)-(4) are those of all adapted layers stacked together.
  for path, node in client_nodes.items():
    # Eq. (2)'s first term: sum_k p_k B_k A_k, by stacking.
    product = lora.weighted_product(node["a"], node["b"], weights)
    mean, start = mean_nodes[path], global_nodes[path]
    gap += jnp.sum(jnp.square(product - jnp.matmul(
        mean["b"], mean["a"], precision=tree_math.FULL)))
    product_norm += jnp.sum(jnp.square(product))
    # Eq. (4)'s denominator: the clients' mean update of B A.
    update_norm += jnp.sum(jnp.square(product - jnp.matmul(
        start["b"], start["a"], precision=tree_math.FULL)))
  ratio = lambda total: jnp.where(
      total > 0, jnp.sqrt(gap / jnp.where(total > 0, total, 1.0)), 0.0)
  return ratio(product_norm), ratio(update_norm)


def fedit(weighting: str = "num_examples") -> Aggregator:
  """FedIT (FedAvg of A and B) over LoRA adapters.

  Args:
    weighting: "num_examples" (p_k proportional to n_k, the paper's) or
      "uniform".

  Returns:
    An ``Aggregator`` over the adapters of ``models.lora.lora`` (A trained:
    not ``freeze_a``, no "merged"; other trees are refused naming fedit).
    Metrics: ``client_weights`` [K], ``inexact_aggregation`` [] (Eq. (3):
    the gap over the product) and ``inexact_aggregation_of_update`` []
    (Eq. (4): the gap over the round's mean update).
  """
  checks.check_choice("weighting", weighting, _fedavg.WEIGHTINGS)

  def aggregate(global_params, client_params, info, state):
    global_nodes, nodes = lora.check_round(
        "fedit", global_params, client_params, info, weighting=weighting,
        need=("a", "b"), refuse=("merged",))
    weights = _fedavg.client_weights(info, weighting)
    # Eq. (1): each factor averaged on its own.
    mean = tree_math.weighted_sum(client_params, weights)
    of_product, of_update = inexact_aggregation(
        global_nodes, nodes, mean[lora.ADAPTERS], weights)
    metrics = {"client_weights": weights, "inexact_aggregation": of_product,
               "inexact_aggregation_of_update": of_update}
    new_global = tree_math.keep_if_no_clients(info.mask, mean, global_params)
    return new_global, state, metrics

  return Aggregator(empty_init(FedITState), aggregate)
