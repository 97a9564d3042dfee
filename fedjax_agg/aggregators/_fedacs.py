"""FedACS: aggregate only the clients whose updated models score best.

Putra, Putri, Zainudin, Kim, Lee, "ACS: Accuracy-based client selection
mechanism for federated industrial IoT", Internet of Things 21, 100657, 2023.

What the paper's description fixes: ACS "relies only on the updated local
parameter, which is evaluated in the FL server" and "considers the
highest-performing clients". What it leaves open, and the choices made here:

* when the selection acts: after local training, on the models to aggregate
  (the updated local parameters exist only then); every sampled client
  trains, the selected ones are averaged;
* how many: the top ``ceil(fraction * K')`` of the K' real participants by
  accuracy, at least one. Ties, frequent since an accuracy is a count of
  hits over M, follow the rule of every selecting rule
  (``_fedmedian.client_order``): the higher accuracy (lower score -acc)
  first, then the lower cohort position (row index), by an explicit key;
* on what: a server-held evaluation set ``(x_eval, y_eval)``, kept in the
  rule's state so it enters the jitted round as an argument;
* the averaging of the selected models: FedAvg's (``weighting``).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.aggregators._fedavg import WEIGHTINGS, client_weights
from fedjax_agg.aggregators._fedmedian import client_ranks
from fedjax_agg.validation import client_accuracies
from fedjax_agg.federated import FederatedData
from fedjax_agg.types import Aggregator, Model


class FedACSState(NamedTuple):
  """The server's evaluation set: x_eval [M, ...], y_eval [M] int32."""
  x_eval: jax.Array
  y_eval: jax.Array


def select_top(accuracy: jax.Array, mask: jax.Array, fraction: float
               ) -> jax.Array:
  """[K] 1.0 for the ceil(fraction * K') most accurate real clients (equal
  accuracies: the lower row first)."""
  real = mask > 0
  num_real = jnp.sum(real)
  # K' is traced, so the count is compared with ranks rather than used as
  # a slice length.
  num_kept = jnp.maximum(jnp.ceil(fraction * num_real), 1)
  rank = client_ranks(-accuracy, mask)
  return ((rank < num_kept) & real).astype(jnp.float32)


def fedacs(model: Model, x_eval, y_eval, *, fraction: float = 0.5,
           weighting: str = "num_examples", eval_batch_size: int = 256
           ) -> Aggregator:
  """FedACS aggregator.

  Args:
    model: the network, to evaluate the client models.
    x_eval: [M, ...] the server's evaluation inputs.
    y_eval: [M] their labels.
    fraction: share of the real participants aggregated, in (0, 1].
    weighting: FedAvg weighting of the selected clients.
    eval_batch_size: examples per forward pass.

  Returns:
    An ``Aggregator``; metrics hold ``client_accuracy`` [K], ``selected``
    [K] and ``client_weights`` [K].
  """
  checks.check_range("fraction", fraction, 0, 1, low_open=True)
  checks.check_choice("weighting", weighting, WEIGHTINGS)
  checks.check_int("eval_batch_size", eval_batch_size, 1)
  if len(x_eval) != len(y_eval) or len(y_eval) == 0:
    raise ValueError("x_eval and y_eval must hold the same positive number "
                     f"of examples, got {len(x_eval)} and {len(y_eval)}")
  num_eval = len(y_eval)
  batch_size = min(eval_batch_size, num_eval)

  def init(global_params):
    del global_params
    return FedACSState(jnp.asarray(x_eval), jnp.asarray(y_eval, jnp.int32))

  def aggregate(global_params, client_params, info, state):
    num_clients = checks.check_cohort(
        global_params, client_params, info,
        uses_num_examples=weighting == "num_examples")
    # The evaluation set as one client holding every example.
    server = FederatedData(state.x_eval, state.y_eval,
                           jnp.arange(num_eval, dtype=jnp.int32)[None],
                           jnp.full((1,), num_eval, jnp.int32))
    # The accuracies choose the cohort: at full float32 precision on every
    # backend, as the rest of the aggregation math (tree_math.FULL).
    with jax.default_matmul_precision("highest"):
      # Every client model is evaluated on the same "client" 0 of ``server``:
      # the whole evaluation set.
      accuracy = client_accuracies(model, client_params, server,
                                   jnp.zeros((num_clients,), jnp.int32),
                                   batch_size)
    selected = select_top(accuracy, info.mask, fraction)
    # ``selected`` doubles as the mask: FedAvg's weights renormalised over
    # the selected clients only.
    weights = tree_math.normalize_weights(
        client_weights(info, weighting) * selected, selected)
    new_global = tree_math.keep_if_no_clients(
        info.mask, tree_math.weighted_sum(client_params, weights),
        global_params)
    return new_global, state, {"client_accuracy": accuracy,
                               "selected": selected,
                               "client_weights": weights}

  return Aggregator(init, aggregate)
