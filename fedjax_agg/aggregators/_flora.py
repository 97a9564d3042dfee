"""FLoRA: stacking the clients' adapters, so the aggregate is exact.

Wang, Shen, He, Sun, Wang, Lyu, Li, "FLoRA: Federated Fine-Tuning Large
Language Models with Heterogeneous Low-Rank Adaptations", NeurIPS 2024.

Client k trains adapters of its own rank r_k from a fresh start (A_k
random, B_k = 0) and sends them. The server stacks them along the rank
axis, the weight p_k on A:

  A = [p_1 A_1; ...; p_K A_K]  [sum_k r_k, d_in]
  B = [B_1, ..., B_K]          [d_out, sum_k r_k]                     # Eq. (3)

so that B A = sum_k p_k B_k A_k: the average of the clients' updates,
exactly (FedIT's averages of A and B are not). The stacked rank grows with
the clients and rounds, so the clients merge B A into their weights and
start new adapters:

  W <- W + (alpha / r) B A,   A <- random,   B <- 0                    # Eq. (4)

How it fits the ``Aggregator`` contract (fixed shapes): the model is
``models.lora.lora(..., merged=True)``, whose adapters carry a frozen
"merged" [d_out, d_in] per layer that the model adds to the base weight
(W = W0 + (alpha / r) (merged + B A); W0 itself never changes). The rule
computes B A by the stacking of Eq. (3), adds it to the global "merged"
(Eq. (4)) and broadcasts fresh adapters: A drawn from the round's key (the
model's initialisation), B = 0. The clients' copies of "merged" are never
read. Heterogeneous ranks: every client holds r_max = the model's rank
components, a client of rank r_k < r_max with the ones past r_k zero
(``clients.lora_ranks`` truncates what it receives and what it sends);
zero components add nothing to the stacked product, so no rank is read
here. ``stacked_rank`` counts the rows of the stacked A that are not zero,
sum_k r_k over the real clients (read from the first adapted layer).

Interpretation choices:

* p_k = n_k / sum_j n_j (the paper's); ``weighting="uniform"`` as FedAvg's.
* One fresh A per round, drawn by the server and truncated by each client
  (the paper's clients draw their own).
* Scale: one alpha / r_max for every client. The authors' clients all use
  scale 2: their code sets each client's LoRA alpha to 2 r_k, so alpha /
  r_k = 2 whatever the rank; ``alpha = 2 r_max`` (e.g. ``--lora-alpha``)
  gives every client here that same scale 2.
* Memory: a client's "merged" leaves are dense [d_out, d_in] per layer, as
  the paper's clients merge into their weights; the engine stacks them with
  the adapters (the cost of training the adapted layers in full).
  ``models.lora.uplink_bytes`` counts what a client sends (A and B).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.aggregators import _fedavg
from fedjax_agg.models import lora
from fedjax_agg.types import Aggregator, empty_init


class FLoRAState(NamedTuple):
  """FLoRA keeps no state: the merged updates travel in the params."""


def flora(weighting: str = "num_examples") -> Aggregator:
  """FLoRA (stacked aggregation, merged every round).

  The clients' factors are stacked along the rank axis, p_k folded into
  A, so that the stacked product is the weighted mean of the products;
  it is added to the "merged" leaves and the adapters restart (B = 0, a
  fresh A from the round's key).

  Args:
    weighting: "num_examples" (p_k proportional to n_k) or "uniform".

  Returns:
    An ``Aggregator`` over the adapters of ``models.lora.lora(...,
    merged=True)`` (other trees are refused naming flora). Metrics:
    ``client_weights`` [K], ``stacked_rank`` [].
  """
  checks.check_choice("weighting", weighting, _fedavg.WEIGHTINGS)

  def aggregate(global_params, client_params, info, state):
    global_nodes, client_nodes = lora.check_round(
        "flora", global_params, client_params, info, weighting=weighting,
        need=("a", "b", "merged"))
    weights = _fedavg.client_weights(info, weighting)
    new_nodes = {}
    # Layers in sorted path order: each gets its own fold of the round key,
    # the same whatever order the params dict was built in.
    for index, path in enumerate(sorted(global_nodes)):
      node, clients = global_nodes[path], client_nodes[path]
      # Eq. (3): B A of the stacked adapters, sum_k p_k B_k A_k.
      product = lora.weighted_product(clients["a"], clients["b"], weights)
      rank, d_in = node["a"].shape
      # Eq. (4): merged into the weights; new adapters from the model's
      # initialisation.
      new_nodes[path] = {
          "merged": (node["merged"] + product).astype(node["merged"].dtype),
          "a": lora.init_a(jax.random.fold_in(info.key, index), rank,
                           d_in).astype(node["a"].dtype),
          "b": jnp.zeros_like(node["b"])}
    # An empty round keeps the old adapters too: no merge, no fresh A.
    new_global = tree_math.keep_if_no_clients(
        info.mask, {lora.ADAPTERS: new_nodes}, global_params)
    # Ranks are read off the first layer in the same sorted order; every
    # layer of a client has the same rank.
    first = client_nodes[min(client_nodes)]["a"]
    live_rows = jnp.any(first != 0, axis=-1) & (info.mask > 0)[:, None]
    return new_global, state, {
        "client_weights": weights,
        "stacked_rank": jnp.sum(live_rows).astype(jnp.float32)}

  return Aggregator(empty_init(FLoRAState), aggregate)
