"""HetLoRA: heterogeneous ranks by zero-padding, weighted by sparsity.

Cho, Liu, Xu, Fahrezi, Joshi, "Heterogeneous LoRA for Federated
Fine-tuning of On-Device Foundation Models", EMNLP 2024.

Client k holds LoRA adapters of rank r_k <= r_max. The server keeps rank
r_max adapters; client k receives their truncation to its rank (the first
r_k rows of A, columns of B), trains, and sends them back; the server
zero-pads them to r_max and averages:

  A = sum_k p_k pad(A_k),   B = sum_k p_k pad(B_k)                    # Eq. (1)

with the paper's sparsity weights, the Frobenius norm of each client's
reconstructed update:

  S_k = ||Delta W_k||_F = sqrt(sum_l ||B_kl A_kl||_F^2),
  p_k = S_k / sum_j S_j                                               # Eq. (2)

(the norm of B A from r x r Gram matrices, ||B A||_F^2 = sum((B^T B) *
(A A^T)), without forming B A). ``weighting="num_examples"`` or
"uniform" gives the plain zero-padding average of FedAvg's weights.

How it fits the ``Aggregator`` contract: the adapters (``models.lora``) of
every client have r_max components; a client of rank r_k has zeros past
r_k (truncation written as zero padding). The truncation of what a client
receives and of what it sends, and the rank self-pruning, are the client
side's: ``clients.lora_ranks`` (per-client ranks by client id, pruned
ranks kept as its client state). This rule reads no rank: the zeros are
the padding of Eq. (1).

Interpretation choices:

* Scale: every client's adapters scale by alpha / r_max (the model's
  rank, ``models.lora``), whatever its own rank r_k: a client of rank r_k
  is the r_max model with its components past r_k zero, not a model of
  rank r_k scaled by alpha / r_k.
* Self-pruning (``clients.lora_ranks``) shrinks r_k to max(floor(gamma
  r_k), 1): a rank-1 client never prunes (it would keep floor(gamma) = 0
  components), though Eq. (3)'s regulariser still acts on its one
  component.
* S_k is taken over the whole model (all adapted layers together), one
  weight per client; the paper writes it for "the reconstructed model".
* When every real client's S_k is 0 (B = 0 everywhere, e.g. no client
  moved), the real clients share the weight equally.
"""

from typing import NamedTuple

import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.aggregators import _fedavg
from fedjax_agg.models import lora
from fedjax_agg.types import Aggregator, empty_init

WEIGHTINGS = ("sparsity",) + _fedavg.WEIGHTINGS


class HetLoRAState(NamedTuple):
  """HetLoRA keeps no state on the server (ranks are the clients')."""


def product_norms(nodes, mask) -> jnp.ndarray:
  """S_k of Eq. (2) for stacked adapters (path -> [K, ...] node), [K];
  padding rows (mask 0) give 0."""
  live = (mask > 0)[:, None, None]
  total = 0.0
  for node in nodes.values():
    a = jnp.where(live, node["a"], 0.0)
    b = jnp.where(live, node["b"], 0.0)
    # ||B A||_F^2 = sum((B^T B) * (A A^T)): r x r Gram matrices.
    gram_b = jnp.einsum("kor,kos->krs", b, b, precision=tree_math.FULL)
    gram_a = jnp.einsum("kri,ksi->krs", a, a, precision=tree_math.FULL)
    total = total + jnp.sum(gram_b * gram_a, axis=(1, 2))
  # The Gram form is >= 0 only in exact arithmetic; a rounding below 0
  # would make the square root NaN.
  return jnp.sqrt(jnp.maximum(total, 0.0))


def hetlora(weighting: str = "sparsity") -> Aggregator:
  """HetLoRA's server: the zero-padded average of heterogeneous-rank
  adapters.

  Args:
    weighting: "sparsity" (Eq. (2), the paper's), "num_examples" or
      "uniform" (plain zero-padding FedAvg).

  Returns:
    An ``Aggregator`` over the adapters of ``models.lora.lora`` (A trained,
    no "merged"; other trees are refused naming hetlora). Metrics:
    ``client_weights`` [K], ``update_norms`` [K] (S_k).
  """
  checks.check_choice("weighting", weighting, WEIGHTINGS)

  def aggregate(global_params, client_params, info, state):
    _, nodes = lora.check_round("hetlora", global_params, client_params,
                                info, weighting=weighting, need=("a", "b"),
                                refuse=("merged",))
    norms = product_norms(nodes, info.mask)
    if weighting == "sparsity":
      # Eq. (2).
      weights = tree_math.normalize_weights(norms, info.mask)
    else:
      weights = _fedavg.client_weights(info, weighting)
    # Eq. (1): the padded adapters' weighted mean.
    mean = tree_math.weighted_sum(client_params, weights)
    new_global = tree_math.keep_if_no_clients(info.mask, mean, global_params)
    return new_global, state, {"client_weights": weights,
                               "update_norms": norms}

  return Aggregator(empty_init(HetLoRAState), aggregate)
