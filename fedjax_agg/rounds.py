"""One federated round as a pure function: train locally, aggregate.

``make_round_fn`` gives ``round_fn(state, data, cohort, mask) ->
(new_state, RoundOutput)``: the cohort's local training in one call, the
exclusion of non-finite clients, and the aggregation. It knows no
algorithm: the local training is a pluggable ``LocalUpdate`` (default: the
engine's trainer, or its streaming reducer when the rule has a
``StreamingForm``) and the rule an ``Aggregator``. A round is a pure
function of its inputs, so independent runs can be ``jax.vmap``-ed
(``fedjax_agg.sweep``).

Extension point. ``LocalUpdate(init, update)`` is what every client-side
algorithm plugs in: ``init(num_clients) -> client_state`` (a pytree with a
leading [N] axis, or ``()``) and ``update(client_state, global_params,
data, client_ids, mask, learning_rates, num_steps, round, key) ->
(LocalResult, new_client_state, metrics)``. ADCT's per-client grid search
is one (``clients.adct_update``). A plain function with the
engine's interface ``(global_params, data, client_ids, learning_rates,
num_steps, key) -> LocalResult`` is accepted too (``stateless``).

Non-finite clients. With ``nonfinite="exclude"`` (or "raise", which the
driver turns into an error after the round) a participant whose trained
model -- or, for rules that read them, whose losses -- holds a NaN/Inf is
handed to the rule as a padding row: mask 0 and the global model in place
of its model; so are the padding rows themselves, whatever they hold. The
rule and its state never see a non-finite client value. ``RoundOutput.finite``
flags the clients; "propagate" hands everything over as it is.
"""

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import config as config_lib
from fedjax_agg import engine
from fedjax_agg import sampling
from fedjax_agg.federated import FederatedData
from fedjax_agg.types import (Aggregator, ClientInfo, LocalUpdate, Model,
                              Params, PRNGKey)

__all__ = ["LocalUpdate", "RoundOutput", "ServerState", "aggregation_info",
           "as_local_update", "exclude_rows", "finite_clients", "init_state",
           "make_round_fn", "num_sampled", "round_inputs", "sample_cohort",
           "stateless"]


class ServerState(NamedTuple):
  """Everything the server carries from one round to the next.

  Attributes:
    params: the global model (broadcast to clients).
    aggregator_state: the aggregator's state.
    round: [] int32, rounds completed so far.
    key: PRNG key for the rounds to come.
    client_state: the local update's state (e.g. ADCT's per-client
      configurations, [N, ...]); ``()`` for stateless clients.
  """
  params: Params
  aggregator_state: Any
  round: jax.Array
  key: PRNGKey
  client_state: Any = ()


class RoundOutput(NamedTuple):
  """Per-round outputs of ``round_fn`` (all arrays).

  Attributes:
    client_ids: [K] cohort.
    mask: [K] 1 for real participants (before non-finite exclusion).
    loss_before: [K] global model's loss on each participant's data
      (zeros when the round computes no per-client losses).
    loss_after: [K] local model's loss after training (idem).
    steps_taken: [K] local steps performed.
    train_loss: [] mean over the aggregated clients of their minibatch
      losses.
    metrics: the aggregator's metrics and the local update's.
    finite: [K] bool, False for a client excluded as non-finite.
  """
  client_ids: jax.Array
  mask: jax.Array
  loss_before: jax.Array
  loss_after: jax.Array
  steps_taken: jax.Array
  train_loss: jax.Array
  metrics: Any
  finite: jax.Array


def stateless(train: Callable[..., engine.LocalResult]) -> LocalUpdate:
  """A ``LocalUpdate`` from a function with the engine's interface
  ``(global_params, data, client_ids, learning_rates, num_steps, key)``."""
  def update(client_state, global_params, data, client_ids, mask,
             learning_rates, num_steps, round_num, key):
    del mask, round_num
    return (train(global_params, data, client_ids, learning_rates,
                  num_steps, key), client_state, {})
  return LocalUpdate(init=lambda num_clients: (), update=update)


def as_local_update(inner, name: str = "local_update") -> LocalUpdate:
  """``inner`` if a ``LocalUpdate``; a function with the engine's interface
  made one (``stateless``); anything else a TypeError naming ``name``."""
  if isinstance(inner, LocalUpdate):
    return inner
  if not callable(inner):
    raise TypeError(f"{name} must be a LocalUpdate or a train function, "
                    f"got {type(inner).__name__}")
  return stateless(inner)


def num_sampled(num_clients: int, participation: float) -> int:
  """m = max(floor(C * N), 1) clients per round, for a participation C
  as ``RunOptions`` (and a description's "train") checks it."""
  # At least one client: a participation below 1/N still trains a round.
  return max(int(participation * num_clients), 1)


def sample_cohort(key: PRNGKey, num_clients: int, cohort_size: int,
                  method: str = "auto") -> jax.Array:
  """Draws ``cohort_size`` distinct client ids uniformly. -> [K] int32.

  ``method``: see ``fedjax_agg.sampling`` ("auto": a permutation of all N
  ids up to 65,536 clients, O(K log K) rejection sampling beyond).
  """
  return sampling.sample_without_replacement(key, num_clients, cohort_size,
                                             method)


def init_state(params: Params, aggregator: Aggregator, seed: int = 0,
               client_state: Any = ()) -> ServerState:
  """The server state before round 1."""
  return ServerState(params, aggregator.init(params),
                     jnp.zeros((), jnp.int32), jax.random.key(seed),
                     client_state)


def finite_clients(exclude: bool, mask, rows, local, uses_losses: bool
                   ) -> jax.Array:
  """[K] bool: False for a client whose ``rows`` (its trained model or
  update, stacked) hold a non-finite value, or whose losses do where the
  rule reads them (``uses_losses``); every client with ``exclude``
  False (the "propagate" policy)."""
  finite = jnp.ones(mask.shape, bool)
  if exclude:
    finite = engine.rows_finite(rows)
    # A NaN loss is checked only where the rule reads losses: for any other rule
    # a client with a finite model is still a valid update.
    if uses_losses:
      finite &= (jnp.isfinite(local.loss_before)
                 & jnp.isfinite(local.loss_after))
  return finite


def aggregation_info(exclude: bool, finite, info: ClientInfo, local
                     ) -> tuple[ClientInfo, jax.Array]:
  """The round's tail shared by every round form: (what the rule is told,
  the train loss). With ``exclude``, the aggregation mask drops the
  non-finite clients (``finite``) and their losses read 0, so no rule
  sees a non-finite value; the train loss is the mean over the
  aggregated clients of their minibatch losses."""
  agg_mask = jnp.where(finite, info.mask, 0.0) if exclude else info.mask
  # jnp.where, not a product with the mask: 0 * NaN is NaN, so a multiplied mask
  # would still carry an excluded client's NaN into the sums.
  safe = lambda losses: (jnp.where(agg_mask > 0, losses, 0.0) if exclude
                         else losses)
  # A round whose clients were all excluded reports 0, not 0/0.
  train_loss = jnp.sum(safe(local.train_loss) * agg_mask) / jnp.maximum(
      jnp.sum(agg_mask), 1.0)
  return info._replace(mask=agg_mask, loss_before=safe(local.loss_before),
                       loss_after=safe(local.loss_after),
                       num_steps=local.steps_taken), train_loss


def exclude_rows(finite, mask, client_params, global_params):
  """Rows that are padding or non-finite become the global model.

  ``finite`` and ``mask`` [K]; ``client_params`` stacked [K, ...].
  """
  # The global model, not zeros, fills a dropped row: a rule that reads
  # masked rows at all (through w - g) sees a zero update there, never a
  # jump to the origin.
  keep = finite & (mask > 0)

  def leaf(stacked, single):
    shape = (-1,) + (1,) * (stacked.ndim - 1)
    return jnp.where(keep.reshape(shape), stacked, single[None])
  return jax.tree.map(leaf, client_params, global_params)


def round_inputs(state: ServerState, data: FederatedData, cohort: jax.Array,
                 mask: jax.Array, training: config_lib.LocalTraining):
  """What every round derives from its state and cohort.

  Returns:
    (next state key, training key, the cohort's ``ClientInfo`` (losses
    zero, aggregation key), [K] local steps (0 for padding rows), [K]
    learning rates).
  """
  # Which key feeds which draw is part of every golden history: reordering
  # them changes every run.
  key, train_key, agg_key, steps_key = jax.random.split(state.key, 4)
  mask = mask.astype(jnp.float32)
  full = engine.full_steps(data, cohort, training.batch_size,
                           training.epochs)
  num_steps = (full if training.steps_fn is None
               else training.steps_fn(steps_key, full))
  # Padding rows do no work and carry weight 0.
  num_steps = jnp.where(mask > 0, num_steps, 0)
  lrs = jnp.broadcast_to(jnp.asarray(training.learning_rate, jnp.float32),
                         cohort.shape)
  info = ClientInfo(
      client_ids=cohort, num_examples=data.num_examples[cohort].astype(
          jnp.float32), mask=mask, loss_before=jnp.zeros_like(mask),
      loss_after=jnp.zeros_like(mask), round=state.round + 1, key=agg_key,
      num_steps=num_steps)
  return key, train_key, info, num_steps, lrs


def make_round_fn(
    model: Model,
    aggregator: Aggregator,
    training: config_lib.LocalTraining = config_lib.LocalTraining(),
    *,
    execution: config_lib.Execution = config_lib.Execution(),
    mesh: Optional[jax.sharding.Mesh] = None,
    local_update: Optional[LocalUpdate | Callable[..., Any]] = None,
    nonfinite: str = "exclude",
    donate_state: bool = False,
    jit: bool = True,
    uplink: Optional[Callable[[LocalUpdate], LocalUpdate]] = None,
) -> Callable[..., tuple[ServerState, RoundOutput]]:
  """Builds one FL round.

  Args:
    model: the network and its task loss.
    aggregator: the server rule (wrap it with a server optimizer first if
      one is wanted, see ``fedjax_agg.aggregators``).
    training: what the clients do (``config.LocalTraining``);
      ``compute_losses="auto"`` computes per-client losses only for rules
      that read them.
    execution: chunk width, chunk loop and streaming
      (``config.Execution``; its ``devices`` are resolved by the driver
      into ``mesh``).
    mesh: optional device mesh with a "clients" axis to shard the cohort.
    local_update: the client side (module docstring); None: the engine's
      trainer (streamed when the rule has a ``StreamingForm`` and
      ``execution.stream`` is not False).
    nonfinite: "exclude" / "raise" (excluded here; the driver raises) or
      "propagate" (``config.NonFinite.clients``).
    donate_state: donate the input state's buffers to the output (no copy
      of large states); the caller must not reuse the old state.
    jit: False gives the round un-jitted, to be composed under ``jax.vmap``
      with traced hyperparameters (``fedjax_agg.sweep``).
    uplink: wraps the client side (after the default trainer is built),
      e.g. sending its updates through a codec (``fedjax_agg.clock``);
      the rule then gets stacked models, never a stream.

  Returns:
    ``round_fn(state, data, cohort, mask) -> (new_state, RoundOutput)``
    where ``cohort`` is [K] client ids and ``mask`` [K] (1 = participates).
  """
  if not isinstance(aggregator, Aggregator):
    raise TypeError(f"aggregator must be an Aggregator, got "
                    f"{type(aggregator).__name__}")
  if not isinstance(training, config_lib.LocalTraining):
    raise TypeError(f"training must be a config.LocalTraining, got "
                    f"{type(training).__name__}")
  if not isinstance(execution, config_lib.Execution):
    raise TypeError(f"execution must be a config.Execution, got "
                    f"{type(execution).__name__}")
  if nonfinite not in config_lib.NONFINITE_CLIENTS:
    raise ValueError(f"nonfinite must be one of "
                     f"{config_lib.NONFINITE_CLIENTS}, got {nonfinite!r}")
  if training.compute_losses is False and aggregator.uses_losses:
    raise ValueError(
        "compute_losses=False: this aggregator reads info.loss_before / "
        "info.loss_after (aggregator.uses_losses), which would be zeros; "
        "use compute_losses=True or 'auto'")
  training = dataclasses.replace(
      training, compute_losses=training.losses_for(aggregator.uses_losses))
  stream = execution.stream
  if stream is None:
    # Streaming is the default only where the engine's own trainer feeds the
    # rule: a custom client side or a codec hands over stacked models.
    stream = (aggregator.stream is not None and local_update is None
              and uplink is None)
  elif stream and aggregator.stream is None:
    raise ValueError("stream=True needs an aggregator with a streaming form "
                     "(aggregator.stream is None)")
  elif stream and (local_update is not None or uplink is not None):
    raise ValueError("stream=True streams the engine's own training; a "
                     "custom local_update (or an uplink codec) returns "
                     "stacked client models")
  exclude = nonfinite != "propagate"
  placement = dict(clients_per_step=execution.clients_per_step, mesh=mesh,
                   chunk_loop=execution.chunk_loop)
  if stream:
    reducer = engine.make_local_reducer(
        model, aggregator.stream.client_stats, training,
        exclude_nonfinite=exclude,
        losses_must_be_finite=aggregator.uses_losses, **placement)
  elif local_update is None:
    local_update = stateless(engine.make_local_trainer(model, training,
                                                       **placement))
  else:
    local_update = as_local_update(local_update)
  if uplink is not None and not stream:
    local_update = uplink(local_update)

  def round_fn(state: ServerState, data: FederatedData, cohort: jax.Array,
               mask: jax.Array):
    key, train_key, info, num_steps, lrs = round_inputs(
        state, data, cohort, mask, training)
    mask, round_num = info.mask, info.round
    client_state, local_metrics = state.client_state, {}
    if stream:
      local = reducer(state.params, data, cohort, lrs, num_steps, train_key,
                      info)
      finite = local.finite
    else:
      local, client_state, local_metrics = local_update.update(
          state.client_state, state.params, data, cohort, mask, lrs,
          num_steps, round_num, train_key)
      if not training.compute_losses:
        # A client side's trainer computes losses under "auto" (it cannot
        # know the rule); the run reads none: zeros, as the engine's own
        # trainer gives, and XLA drops the loss passes that made them.
        local = local._replace(
            loss_before=jnp.zeros_like(local.loss_before),
            loss_after=jnp.zeros_like(local.loss_after))
      finite = finite_clients(exclude, mask, local.client_params, local,
                              aggregator.uses_losses)
    info, train_loss = aggregation_info(exclude, finite, info, local)
    if stream:
      new_params, agg_state, metrics = aggregator.stream.finalize(
          state.params, local.stats, info, state.aggregator_state)
    else:
      client_params = local.client_params
      if exclude:
        client_params = exclude_rows(finite, mask, client_params,
                                     state.params)
      new_params, agg_state, metrics = aggregator.aggregate(
          state.params, client_params, info, state.aggregator_state)
    new_state = ServerState(new_params, agg_state, round_num, key,
                            client_state)
    return new_state, RoundOutput(
        cohort, mask, local.loss_before, local.loss_after, local.steps_taken,
        train_loss, {**metrics, **local_metrics}, finite)

  if not jit:
    return round_fn
  # Only the state is donated: data and cohorts are reused every round.
  return jax.jit(round_fn, donate_argnums=(0,) if donate_state else ())
