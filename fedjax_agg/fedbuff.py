"""FedBuff's server step: buffered, staleness-weighted aggregation.

Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba, "Federated Learning
with Buffered Asynchronous Aggregation", AISTATS 2022 (FedAsync, Xie,
Koyejo, Gupta, 2019, is the buffer of one).

The host decides who arrives when (``systems.AsyncSchedule``); this module
is the jitted step for one full buffer of K updates. Client k downloaded
the global model x_{v_k} (its start version) and trained from it; when the
buffer fills the server is at version t >= v_k, the staleness is
s_k = t - v_k and, with the staleness weight w(s) of ``systems.STALENESS``:

  Delta_k = x_k - x_{v_k}                        (the client's update)
  Eq. (Alg. 1, l. 11): Delta_bar = sum_k p_k w(s_k) Delta_k
  x_{t+1} = x_t + eta_g Delta_bar                (or any server optimizer)

Here the buffered update is handed to the run's rule as K virtual client
models x_t + w(s_k) C(Delta_k) (C: the uplink codec, or none), so
``aggregate(x_t, ...)`` of FedAvg computes the sum above (p_k = n_k / n, or
1 / K with ``weighting="uniform"``, the paper's plain mean) and every
server optimizer (``with_server_optimizer``) steps on it, as the paper's
FedBuff-with-server-momentum does. Rules that need the clients' individual
models (median, Krum, ...) see the virtual models, which is the natural
asynchronous generalisation but no paper's rule.

The versions a client may start from are kept in a ring of the last V
global models (``buffered``: version v at slot v mod V); the schedule is
built with ``max_staleness = V - 1``, so every start is in the ring.

Degenerate case: when every s_k = 0 (concurrency C = K, equal task
times) each x_{v_k} = x_t and w(0) = 1, and the virtual models are the
trained models themselves (bit for bit, where x_t + (x_k - x_t) would
round away from x_k the trained value is used), so the step is the
synchronous round of the same cohort.
"""

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import compression
from fedjax_agg import config as config_lib
from fedjax_agg import engine
from fedjax_agg import rounds
from fedjax_agg.federated import FederatedData
from fedjax_agg.types import Aggregator, Model, Params

__all__ = ["BufferedState", "buffered", "buffered_models",
           "make_async_round_fn"]


class BufferedState(NamedTuple):
  """A buffered rule's state.

  Attributes:
    inner: the wrapped rule's state.
    versions: the last V global models, [V, ...] per leaf; version v at
      slot v mod V (all V slots hold the initial model before step 1).
  """
  inner: Any
  versions: Params

  @property
  def eval_params(self):
    """The wrapped rule's evaluated model, if it keeps one (else None)."""
    return getattr(self.inner, "eval_params", None)


def buffered(aggregator: Aggregator, num_versions: int) -> Aggregator:
  """``aggregator`` that also keeps the last ``num_versions`` global models.

  Args:
    aggregator: the server rule (any ``Aggregator``).
    num_versions: V >= 1, the ring's length (max staleness + 1).

  Returns:
    An ``Aggregator`` with ``BufferedState``, no streaming form (the step
    needs the K virtual models); ``uses_losses`` is the wrapped rule's.
    After the step producing version t (``info.round``) the new global
    model is written to slot t mod V.
  """
  if not isinstance(aggregator, Aggregator):
    raise TypeError(f"aggregator must be an Aggregator, got "
                    f"{type(aggregator).__name__}")
  checks.check_int("num_versions", num_versions, 1)

  def init(global_params):
    # Every slot holds the initial model so that the ring has its fixed
    # [V, ...] shape from the start; before step 1 only version 0 is read.
    return BufferedState(aggregator.init(global_params), jax.tree.map(
        lambda a: jnp.broadcast_to(a, (num_versions,) + a.shape),
        global_params))

  def aggregate(global_params, client_params, info, state):
    new_global, inner, metrics = aggregator.aggregate(
        global_params, client_params, info, state.inner)
    # Version t overwrites version t - V, which no client can still start
    # from: the schedule caps the staleness at V - 1.
    slot = jnp.mod(info.round, num_versions)
    versions = jax.tree.map(lambda ring, new: ring.at[slot].set(new),
                            state.versions, new_global)
    return new_global, BufferedState(inner, versions), metrics

  return Aggregator(init, aggregate, None, uses_losses=aggregator.uses_losses)


def buffered_models(global_params: Params, trained, starts, decoded,
                    weights: jax.Array):
  """The virtual client models x_t + w_k C(Delta_k) the rule aggregates.

  Args:
    global_params: x_t.
    trained: [K, ...] the clients' trained models x_k.
    starts: [K, ...] the versions they started from, x_{v_k}.
    decoded: [K, ...] float32, C(x_k - x_{v_k}) as the server decodes it
      (x_k - x_{v_k} itself without a codec).
    weights: [K] the staleness weights w(s_k).

  Returns:
    [K, ...] in the dtypes of ``trained``; row k is x_k itself (bit for
    bit) where w_k = 1, x_{v_k} = x_t and C(Delta_k) = Delta_k.
  """
  def leaf(g, w, start, x, u):
    shape = (-1,) + (1,) * (w.ndim - 1)
    weight = weights.reshape(shape)
    # Summed in float32 and rounded once to the params' dtype, so a bfloat16
    # model does not lose the weighted update to an intermediate rounding.
    virtual = (g.astype(jnp.float32)[None] + weight * x).astype(w.dtype)
    # x == u: the codec returned the update unchanged. Only when all three
    # hold is x_k itself the virtual model, which keeps the s_k = 0 step
    # identical to the synchronous round.
    exact = (weight == 1.0) & (start == g[None]) & (x == u)
    return jnp.where(exact, w, virtual)
  updates = jax.tree.map(
      lambda w, s: w.astype(jnp.float32) - s.astype(jnp.float32), trained,
      starts)
  return jax.tree.map(leaf, global_params, trained, starts, decoded, updates)


def make_async_round_fn(
    model: Model,
    aggregator: Aggregator,
    training: config_lib.LocalTraining,
    staleness_weight: Callable[[jax.Array], jax.Array],
    *,
    execution: config_lib.Execution = config_lib.Execution(),
    mesh: Optional[jax.sharding.Mesh] = None,
    codec: Optional[compression.Codec] = None,
    nonfinite: str = "exclude",
    donate_state: bool = False,
) -> Callable[..., tuple[rounds.ServerState, rounds.RoundOutput]]:
  """Builds FedBuff's jitted server step (module docstring).

  Args:
    model: the network and its task loss.
    aggregator: the rule wrapped by ``buffered`` (its state holds the ring
      of versions).
    training: what the clients do; its objective reads the client's start
      model as the global one (FedProx's anchor is the version it
      downloaded).
    staleness_weight: w(s), jit-able (``systems.STALENESS``).
    execution, mesh: chunking and sharding of the K clients' training, as
      in ``rounds.make_round_fn`` (``execution.stream`` is not used).
    codec: the uplink codec applied to each Delta_k (None: float32).
    nonfinite: as ``rounds.make_round_fn``.
    donate_state: donate the input state's buffers.

  Returns:
    ``round_fn(state, data, cohort, mask, start_versions, staleness) ->
    (new_state, RoundOutput)``: ``cohort`` [K] client ids, ``mask`` [K],
    ``start_versions`` and ``staleness`` [K] int32 from the schedule.
  """
  if nonfinite not in config_lib.NONFINITE_CLIENTS:
    raise ValueError(f"nonfinite must be one of "
                     f"{config_lib.NONFINITE_CLIENTS}, got {nonfinite!r}")
  if not callable(staleness_weight):
    raise TypeError("staleness_weight must be a function of the staleness")
  training = dataclasses.replace(
      training, compute_losses=training.losses_for(aggregator.uses_losses))
  train = engine.make_local_trainer(
      model, training, clients_per_step=execution.clients_per_step,
      mesh=mesh, chunk_loop=execution.chunk_loop)
  exclude = nonfinite != "propagate"

  def round_fn(state: rounds.ServerState, data: FederatedData, cohort, mask,
               start_versions, staleness):
    if not isinstance(state.aggregator_state, BufferedState):
      raise TypeError("the asynchronous step needs the rule wrapped by "
                      "fedbuff.buffered (its state keeps the versions)")
    key, train_key, info, num_steps, lrs = rounds.round_inputs(
        state, data, cohort, mask, training)
    mask = info.mask
    ring = state.aggregator_state.versions
    size = jax.tree.leaves(ring)[0].shape[0]
    # The slot still holds version v_k (not a newer one) because the schedule
    # was built with max_staleness = V - 1.
    starts = jax.tree.map(lambda a: a[jnp.mod(start_versions, size)], ring)
    # Each client trains from, and is anchored to, the version it downloaded,
    # not x_t: it never saw the later models.
    local = train(state.params, data, cohort, lrs, num_steps, train_key,
                  start=starts, reference=starts)
    trained = local.client_params
    decoded = jax.tree.map(
        lambda w, s: w.astype(jnp.float32) - s.astype(jnp.float32), trained,
        starts)
    metrics = {"start_version": start_versions, "staleness": staleness}
    # The codec compresses Delta_k against the client's own start version,
    # the only model the client holds.
    if codec is not None:
      decoded = compression.compress_updates(codec, decoded, cohort,
                                             train_key)
    finite = rounds.finite_clients(exclude, mask, decoded, local,
                                   aggregator.uses_losses)
    weights = staleness_weight(staleness).astype(jnp.float32)
    client_params = buffered_models(state.params, trained, starts, decoded,
                                    weights)
    # Rows left out (padding, non-finite) become x_t itself: a zero update
    # whatever their staleness weight.
    if exclude:
      client_params = rounds.exclude_rows(finite, mask, client_params,
                                          state.params)
    info, train_loss = rounds.aggregation_info(exclude, finite, info, local)
    new_params, agg_state, agg_metrics = aggregator.aggregate(
        state.params, client_params, info, state.aggregator_state)
    metrics.update(agg_metrics)
    new_state = rounds.ServerState(new_params, agg_state, info.round, key,
                                   state.client_state)
    return new_state, rounds.RoundOutput(
        cohort, mask, local.loss_before, local.loss_after, local.steps_taken,
        train_loss, metrics, finite)

  # Donating the state lets XLA update the [V, ...] ring in place instead
  # of copying V models every step.
  return jax.jit(round_fn, donate_argnums=(0,) if donate_state else ())
