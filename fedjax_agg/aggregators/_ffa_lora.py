"""FFA-LoRA: A frozen at its random initialisation, only B trained and averaged.

Sun, Li, Li, Ding, "Improving LoRA in Privacy-preserving Federated
Learning", ICLR 2024.

With A fixed and shared by every client (``models.lora.lora(...,
freeze_a=True)``: A lives in the model, drawn once from its key), a client
trains and sends only B, and the server averages it:

  B = sum_k p_k B_k,   p_k = n_k / sum_j n_j                          # Eq. (1)

The aggregation is then exact, since A is common to all clients:

  B A = (sum_k p_k B_k) A = sum_k p_k (B_k A)                          # Eq. (2)

(FedIT's "inexact aggregation" of Eq. (2) in ``aggregators.fedit`` is 0),
and the uplink is r d_out numbers per adapted layer instead of r (d_in +
d_out): half of FedIT's for square layers.

Streaming form (``Aggregator.stream``): FedAvg's over B, B = B_t + sum_k
p_k (B_k - B_t), so that a cohort is summed a chunk at a time and secure
aggregation (``secagg``, the paper's privacy-preserving setting) can wrap
the rule: the server then sees only the sum of the clients' B updates.

Interpretation choices: the paper aggregates with FedAvg (example
weights); ``weighting="uniform"`` is offered as FedAvg's. The paper's
larger scale alpha is the model's (``lora(alpha=...)``), not the rule's.
"""

from typing import NamedTuple

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.aggregators import _fedavg
from fedjax_agg.models import lora
from fedjax_agg.types import Aggregator, empty_init, StreamingForm


class FFALoRAState(NamedTuple):
  """FFA-LoRA keeps no state."""


def ffa_lora(weighting: str = "num_examples") -> Aggregator:
  """FFA-LoRA (FedAvg of B, A frozen in the model).

  Args:
    weighting: "num_examples" (p_k proportional to n_k) or "uniform".

  Returns:
    An ``Aggregator`` with a streaming form over the adapters of
    ``models.lora.lora(..., freeze_a=True)`` (only "b" leaves; a tree
    holding A, which this rule would average as FedIT does, is refused
    naming ffa_lora). Metrics: ``client_weights`` [K].
  """
  checks.check_choice("weighting", weighting, _fedavg.WEIGHTINGS)

  def aggregate(global_params, client_params, info, state):
    lora.check_round("ffa_lora", global_params, client_params, info,
                     weighting=weighting, need=("b",), refuse=("a", "merged"))
    weights = _fedavg.client_weights(info, weighting)
    # Eq. (1); Eq. (2) holds with the model's frozen A.
    mean = tree_math.weighted_sum(client_params, weights)
    new_global = tree_math.keep_if_no_clients(info.mask, mean, global_params)
    return new_global, state, {"client_weights": weights}

  averaged = _fedavg.fedavg(weighting).stream

  def client_stats(global_params, client_params, info_k):
    # The streaming path bypasses check_round, so the tree is checked here,
    # while tracing: averaging a tree that holds A would silently be FedIT.
    for name, params in (("global_params", global_params),
                         ("client_params", client_params)):
      lora.check_adapters(params, "ffa_lora", name, need=("b",),
                          refuse=("a", "merged"))
    # Eq. (1) as a sum: p_k (B_k - B_t), accumulated over the chunks.
    return averaged.client_stats(global_params, client_params, info_k)

  return Aggregator(empty_init(FFALoRAState), aggregate,
                    StreamingForm(client_stats, averaged.finalize))
