"""A server optimizer over any aggregation rule (FedOpt's wrapper).

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar and McMahan,
"Adaptive Federated Optimization", ICLR 2021 (Algorithm 1's server step).

The server treats -Delta_t = w_t - aggregate(clients) as a gradient and
steps an optax transformation with it. The wrapped rule is any
``Aggregator``; ``fedopt`` and its aliases (``_fedopt.py``) wrap FedAvg by
default.

A cohort with no real participant leaves the model and every state
unchanged (no step on an empty pseudo-gradient), unless the wrapped rule
adds calibrated noise (``Aggregator.noise_multiplier`` not None, DP-FedAvg):
its output then differs from w_t by that noise even in an empty round, the
privacy accounting counts the round, and the server steps on it as on any
round. The wrapper passes ``noise_multiplier`` and ``expected_clients`` on,
so the accounting of a run sees the wrapped rule's noise.

Streaming: the server step needs only the wrapped rule's output, so a
wrapped rule with a streaming form (FedAvg, FedNNNN) keeps it; the round then
holds a chunk of client models, never K.
"""

from typing import Any, NamedTuple

import optax

from fedjax_agg import tree_math
from fedjax_agg.types import Aggregator, StreamingForm


class ServerOptState(NamedTuple):
  """State of an aggregator wrapped by ``with_server_optimizer``.

  Attributes:
    base_state: the wrapped aggregator's state.
    opt_state: the optax transformation's state.
  """
  base_state: Any
  opt_state: optax.OptState

  @property
  def eval_params(self):
    """The wrapped rule's evaluated model, if it keeps one (else None)."""
    return getattr(self.base_state, "eval_params", None)


def with_server_optimizer(aggregator: Aggregator,
                          transformation: optax.GradientTransformation
                          ) -> Aggregator:
  """Feeds ``aggregator``'s output through a server optimizer.

  Each round: target = aggregator's new global params; pseudo-gradient
  w_t - target; w_{t+1} = optax.apply_updates(w_t, updates) where
  ``updates`` come from ``transformation.update(pseudo_gradient, ...)``.
  With ``optax.sgd(1.0)`` this returns ``aggregator`` unchanged.

  Args:
    aggregator: any ``Aggregator`` (e.g. ``fedavg()``).
    transformation: an optax ``GradientTransformation`` (its ``update`` gets
      the current global params as ``params``).

  Returns:
    An ``Aggregator`` with ``ServerOptState``; metrics are the wrapped
    rule's plus "pseudo_gradient_norm" and "optimizer_update_norm". It has
    a streaming form when ``aggregator`` has one (the same client
    statistics; the server step runs on the finalized target), and the
    wrapped rule's ``uses_losses``, ``noise_multiplier`` and
    ``expected_clients``.
  """
  if not isinstance(aggregator, Aggregator):
    raise TypeError(
        f"aggregator must be an Aggregator, got {type(aggregator).__name__}")
  if not isinstance(transformation, optax.GradientTransformation):
    raise TypeError(
        "transformation must be an optax.GradientTransformation, got "
        f"{type(transformation).__name__}")

  def init(global_params):
    return ServerOptState(aggregator.init(global_params),
                          transformation.init(global_params))

  def aggregate(global_params, client_params, info, state):
    return server_step(global_params, aggregator.aggregate(
        global_params, client_params, info, state.base_state), info, state)

  def finalize(global_params, summed_stats, info, state):
    return server_step(global_params, aggregator.stream.finalize(
        global_params, summed_stats, info, state.base_state), info, state)

  def server_step(global_params, base_output, info, state):
    target, base_state, metrics = base_output
    # w_t - target, so that optax.sgd(1.0) steps exactly onto the target
    # and the wrapper reduces to the wrapped rule.
    pseudo_gradient = tree_math.tree_sub(global_params, target)
    updates, opt_state = transformation.update(
        pseudo_gradient, state.opt_state, global_params)
    new_global = optax.apply_updates(global_params, updates)
    new_state = ServerOptState(base_state, opt_state)
    # A noisy rule's output in an empty round is a release like any other
    # (module docstring): only a noiseless rule is held still.
    if aggregator.noise_multiplier is None:
      new_global, new_state = tree_math.keep_if_no_clients(
          info.mask, (new_global, new_state), (global_params, state))
    metrics = dict(metrics)
    metrics["pseudo_gradient_norm"] = tree_math.tree_norm(pseudo_gradient)
    metrics["optimizer_update_norm"] = tree_math.tree_norm(updates)
    return new_global, new_state, metrics

  stream = None
  if aggregator.stream is not None:
    stream = StreamingForm(aggregator.stream.client_stats, finalize)
  from_run = None
  if aggregator.from_run is not None:
    # What the inner rule takes from the run, under the same optimizer.
    def from_run(context):
      return with_server_optimizer(aggregator.from_run(context),
                                   transformation)
    from_run.reads = getattr(aggregator.from_run, "reads", frozenset())
  return Aggregator(init, aggregate, stream,
                    uses_losses=aggregator.uses_losses,
                    noise_multiplier=aggregator.noise_multiplier,
                    expected_clients=aggregator.expected_clients,
                    from_run=from_run)
