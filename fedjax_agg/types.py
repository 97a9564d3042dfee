"""Type aliases and the contracts every component of fedjax_agg speaks.

Shapes in docstrings: ``K`` is the number of clients in a cohort (the leading
axis of stacked pytrees), ``N`` the number of clients in the federation.
"""

import math
from typing import Any, Callable, Mapping, NamedTuple, Optional, Protocol

import jax
import jax.numpy as jnp
import optax

__all__ = ["AggregateFn", "Aggregator", "AggregatorState", "Batch",
    "Callback", "ClientInfo", "INFO_AXES", "LocalObjective", "LocalUpdate",
    "Metrics", "Model", "RunContext",
    "PRNGKey", "Params", "StackedParams", "StreamingForm", "empty_init",
    "softmax_cross_entropy", "PAD_TARGET", "target_counts",
    "sequence_cross_entropy", "as_callback"]

Params = Any
"""A model's parameters: a pytree of arrays (a flax variables dict, possibly
with batch statistics)."""
StackedParams = Any
"""The same tree as ``Params`` with a leading client axis: every leaf
``[K, ...]``."""
PRNGKey = jax.Array
"""A JAX PRNG key (``jax.random.key`` or a legacy ``uint32[2]`` key)."""
Metrics = Mapping[str, jax.Array]
"""Named metrics of a step or a round: name to an array (mostly scalars)."""
Batch = Mapping[str, jax.Array]
"""One batch of examples: ``{'x': [B, ...], 'y': [B], 'mask': [B]}``, mask 1
for a real example and 0 for padding."""
AggregatorState = Any
"""An aggregator's state: a NamedTuple (or pytree) of arrays of fixed shape,
carried from round to round."""


class ClientInfo(NamedTuple):
  """What the server knows about the K clients of a round.

  Attributes:
    client_ids: [K] int32, ids in [0, N) (padding rows repeat a valid id).
    num_examples: [K] float32, training examples held by each client.
    mask: [K] float32, 1 for a real participant, 0 for a padding row.
    loss_before: [K] float32, loss of the incoming global model on the
      client's training data (before local training).
    loss_after: [K] float32, loss of the client's model on its training data
      after local training.
    round: [] int32, 1-based round number.
    key: PRNG key for randomised aggregation rules.
    num_steps: [K] int32, the local optimisation steps each client took
      (0 for padding rows; fewer for stragglers and ADCT budgets); the
      rounds fill it in. None where the caller did not (a rule that reads
      it, such as FedNova, then refuses).
  """
  client_ids: jax.Array
  num_examples: jax.Array
  mask: jax.Array
  loss_before: jax.Array
  loss_after: jax.Array
  round: jax.Array
  key: PRNGKey
  num_steps: Optional[jax.Array] = None

  def row(self, k) -> "ClientInfo":
    """Client k's info: the per-client fields' k-th entries (scalars),
    ``round`` and ``key`` the cohort's (what a ``StreamingForm``'s
    ``client_stats`` is given)."""
    # ``num_steps`` may be None (a caller that did not fill it in); it stays
    # None in the row.
    take = lambda a: None if a is None else a[k]
    return self._replace(
        client_ids=take(self.client_ids),
        num_examples=take(self.num_examples), mask=take(self.mask),
        loss_before=take(self.loss_before),
        loss_after=take(self.loss_after), num_steps=take(self.num_steps))


# Field order: client_ids, num_examples, mask, loss_before, loss_after, round,
# key, num_steps.
INFO_AXES = ClientInfo(0, 0, 0, 0, 0, None, None, 0)
"""The ``jax.vmap`` axes of a ``ClientInfo`` over its clients: the per-client
fields mapped over axis 0, the round's ``round`` and ``key`` shared."""


class AggregateFn(Protocol):
  """The signature of ``Aggregator.aggregate``.

  ``aggregate(global_params, client_params, info, state)`` takes the global
  model (``Params``), the K clients' models (``StackedParams``, ``[K, ...]``),
  their ``ClientInfo`` and the rule's state, and returns ``(new_global,
  new_state, metrics)``.
  """

  def __call__(
      self, global_params: Params, client_params: StackedParams,
      info: ClientInfo, state: AggregatorState
  ) -> tuple[Params, AggregatorState, Metrics]:
    ...


class StreamingForm(NamedTuple):
  """A rule that is a sum over clients, in a form that never stacks them.

  The engine trains the cohort a chunk at a time and keeps only the running
  sum of ``client_stats`` over the clients trained so far, so memory is
  bounded by the chunk, not by K. For every cohort,
  ``finalize(g, sum_k client_stats(g, w_k, info_k), info, state)`` equals
  the rule's ``aggregate(g, w, info, state)`` (to float rounding).

  Attributes:
    client_stats: ``client_stats(global_params, client_params, info_k) ->
      stats``, written for ONE client: ``client_params`` is one model and
      ``info_k`` a ``ClientInfo`` whose per-client fields are scalars (the
      k-th row; ``round`` and ``key`` are the cohort's). ``stats`` is a
      pytree of arrays of fixed shape; rows with mask 0 must give zeros
      (the engine adds such rows when it pads a chunk).
    finalize: ``finalize(global_params, summed_stats, info, state) ->
      (new_global_params, new_state, metrics)``; ``summed_stats`` is the
      sum of ``client_stats`` over the K rows, ``info`` the cohort's
      ``ClientInfo`` ([K] fields, losses included).
  """
  client_stats: Callable[[Params, Params, ClientInfo], Any]
  finalize: Callable[..., tuple[Params, AggregatorState, Metrics]]


class Aggregator(NamedTuple):
  """A server-side aggregation rule as a pair of pure functions.

  Attributes:
    init: ``init(global_params) -> state``.
    aggregate: ``aggregate(global_params, client_params, info, state) ->
      (new_global_params, new_state, metrics)`` where ``client_params`` has a
      leading client axis [K, ...] and ``metrics`` is a dict of arrays.
    stream: the rule's ``StreamingForm`` when it is a sum over clients
      (FedAvg, the server optimizers over it, FedNNNN), else None (rules
      that need all K client models at once: median, trimmed mean, FedAdp,
      FedLayerWise, FedDRL).
    uses_losses: True when ``aggregate`` reads ``info.loss_before`` /
      ``info.loss_after`` (FedDRL's state). Rounds then refuse
      ``compute_losses=False``, which would hand the rule zeros. The losses
      cost two forward passes over every participant's data (about 40 % of
      a round of a small CNN on CPU), so rules that ignore them leave this
      False and a user who does not need them in the history can skip them.
    noise_multiplier: z when every round adds Gaussian noise calibrated
      for differential privacy (standard deviation z times the clip norm
      on the sum of the clipped updates, DP-FedAvg), else None. A run's
      privacy accounting (``config.Privacy``) reads it from here, so the
      recorded epsilon is always that of the noise the rule adds; wrappers
      around a rule (server optimizers) pass it on.
    expected_clients: for such a rule, the fixed denominator of its mean
      (the expected cohort size qN of McMahan et al. 2018) when it divides
      by one, else None (it divides by the round's real participants).
      Poisson sampling needs the fixed denominator for the accounting to
      hold (the realised cohort size depends on who was drawn).
    from_run: for a rule built from what a run fixes (the client learning
      rate, the federation's size, the local solver's momentum, ...),
      ``from_run(context: RunContext) -> Aggregator``: the rule with the
      run's values for the arguments its caller left out, refusing (a
      ``ValueError`` naming the argument) one the caller gave that the run
      contradicts. Every run calls it before the first round
      (``fedjax_agg.run_context.bind``); None: the rule needs nothing of
      the run.
  """
  init: Callable[[Params], AggregatorState]
  aggregate: AggregateFn
  stream: Optional[StreamingForm] = None
  uses_losses: bool = False
  noise_multiplier: Optional[Any] = None
  expected_clients: Optional[Any] = None
  from_run: Optional[Callable[["RunContext"], "Aggregator"]] = None


class RunContext(NamedTuple):
  """What a run fixes that a rule may be built from (``Aggregator.from_run``).

  Attributes:
    num_clients: N, the federation's size.
    cohort_size: K, the clients drawn per round.
    expected_clients: q N under Poisson sampling of a private run (the
      fixed denominator of DP-FedAvg's mean), else None.
    learning_rate: the client learning rate (a traced scalar in a sweep).
    momentum: the local solver's SGD momentum (0 for plain SGD); None when
      the local optimizer is not SGD or is not known.
    proximal_mu: the local objective's FedProx coefficient (0 without a
      term); None for a term that is not FedProx's.
    client_side: what the run's client side (``LocalUpdate.shared``)
      shares with its server rule, e.g. ``{"feddyn_alpha": 0.01}``.
    batch_size: B, the clients' local batch size (None: not known).
    max_examples: the examples of the federation's largest client (None:
      not known).
  """
  num_clients: int
  cohort_size: int
  expected_clients: Optional[float]
  learning_rate: Any
  momentum: Optional[float]
  proximal_mu: Optional[float]
  client_side: Mapping[str, Any]
  batch_size: Optional[int] = None
  max_examples: Optional[int] = None


def empty_init(state_type: Callable[[], AggregatorState]
               ) -> Callable[[Params], AggregatorState]:
  """The ``init`` of a rule that keeps no state (as ``optax``'s
  ``init_empty_state``): ``init(global_params) -> state_type()``.

  Args:
    state_type: the rule's empty state type (a ``NamedTuple`` without
      fields, such as ``FedAvgState``).

  Returns:
    The rule's ``init``, ignoring ``global_params``.
  """

  def init(global_params):
    del global_params
    return state_type()

  return init


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array
                          ) -> jax.Array:
  """The default task loss: [B, C] logits, [B] int labels -> [B] losses."""
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


PAD_TARGET = -1
"""The target of a padded position of a sequence task (never scored)."""


def target_counts(targets: jax.Array) -> jax.Array:
  """Scored targets of each example. -> [B] float32.

  1 per example for class labels [B]; for per-token targets [B, T, ...]
  the positions that are not ``PAD_TARGET``. Losses, accuracies and
  per-client means weight each example by this count, so a sequence task's
  metrics are means over its real tokens.
  """
  if targets.ndim == 1:
    return jnp.ones(targets.shape, jnp.float32)
  # Any trailing target axes are flattened: each example's count is the sum over
  # all of its positions.
  scored = (targets != PAD_TARGET).reshape(targets.shape[0], -1)
  return jnp.sum(scored, axis=1).astype(jnp.float32)


def sequence_cross_entropy(logits: jax.Array, targets: jax.Array
                           ) -> jax.Array:
  """Task loss of a sequence model: mean over each example's real tokens.

  Args:
    logits: [B, T, V].
    targets: [B, T] int token ids, ``PAD_TARGET`` where padded.

  Returns:
    [B] the mean cross-entropy over the positions that are not padding
    (0 for an example with none), so that ``loss * target_counts`` is the
    example's summed token loss.
  """
  scored = targets != PAD_TARGET
  # PAD_TARGET is not a class index: padded positions get class 0 for the lookup
  # and are zeroed below. A mask, not boolean indexing, keeps the shapes fixed
  # under jit.
  losses = optax.softmax_cross_entropy_with_integer_labels(
      logits, jnp.where(scored, targets, 0))
  total = jnp.sum(jnp.where(scored, losses, 0.0), axis=-1)
  # An example with no scored token gives 0, not 0/0 = NaN.
  return total / jnp.maximum(jnp.sum(scored, axis=-1), 1).astype(
      total.dtype)


class Model(NamedTuple):
  """A network and its task loss, as pure functions written for one client.

  Attributes:
    init: ``init(key) -> params`` (the whole variables tree, e.g.
      ``{'params': ...}`` or ``{'params': ..., 'batch_stats': ...}``).
    apply: ``apply(params, x, train) -> (outputs, new_params)``; ``x`` is
      [B, ...]. ``new_params`` equals ``params`` except for non-trainable
      collections (BatchNorm statistics) that a training pass updates.
    loss: ``loss(outputs, y) -> [B]`` per-example task loss, used by local
      training, the per-client losses and evaluation alike (default:
      softmax cross-entropy with integer labels). Accuracy and macro-F1
      read ``argmax(outputs, -1)`` as the prediction.
  """
  init: Callable[[PRNGKey], Params]
  apply: Callable[..., tuple[jax.Array, Params]]
  loss: Callable[[jax.Array, jax.Array], jax.Array] = softmax_cross_entropy

  def num_params(self) -> int:
    """The number of scalars ``init`` returns (every collection), from
    shapes only: nothing is computed."""
    # eval_shape traces ``init`` without running it: no parameters are
    # allocated, whatever the model's size.
    shapes = jax.eval_shape(self.init, jax.random.key(0))
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))


class LocalObjective(NamedTuple):
  """A client's regulariser added to its data loss, written for one client.

  The local loss the engine minimises is
  ``data_loss(params, batch) + penalty(params, global_params, context)``
  (see ``fedjax_agg.objectives.local_loss`` for that whole function).

  Attributes:
    prepare: ``prepare(params, global_params) -> context``, called by the
      engine at the start of every local epoch; the context is held constant
      (no gradient flows through it) during that epoch. Objectives that need
      nothing return ``()``.
    penalty: ``penalty(params, global_params, context) -> []``, the term
      added to the data loss (0 for plain cross-entropy).
    proximal: optional ``proximal(params, global_params, learning_rate) ->
      params``, applied after every optimizer step: the exact proximal
      step of a term handled implicitly rather than through its gradient
      (Ditto's ``lambda/2 ||v - w||^2``, stable for any lambda). None:
      no such step.
    proximal_mu: mu when the term is exactly FedProx's ``mu/2 ||w -
      w_g||^2`` (0 for no term), None for any other term; rules that
      normalise by the local solver (FedNova) read it from the run.

  ``global_params`` is what the engine hands the objective: the round's
  global model, or a per-client reference when the trainer is given one
  (``engine.make_local_trainer``'s ``reference``).
  """
  prepare: Callable[[Params, Params], Any]
  penalty: Callable[[Params, Params, Any], jax.Array]
  proximal: Optional[Callable[[Params, Params, jax.Array], Params]] = None
  proximal_mu: Optional[Any] = None


class LocalUpdate(NamedTuple):
  """A client-side algorithm: the local training of a round's cohort.

  The round (``fedjax_agg.rounds``) calls it in place of the engine's
  plain local training; it is how client-side tuning (ADCT) and stateful
  clients plug in.

  Attributes:
    init: ``init(num_clients) -> client_state``, a pytree with a leading
      [N] axis indexed by client id (or ``()``), carried in the server
      state from round to round.
    update: ``update(client_state, global_params, data, client_ids, mask,
      learning_rates, num_steps, round, key) -> (local_result,
      new_client_state, metrics)``: ``client_ids``, ``mask``,
      ``learning_rates`` and ``num_steps`` are [K]; ``local_result`` an
      ``engine.LocalResult`` (stacked [K, ...] client models, losses,
      steps); ``metrics`` a dict of [] or [K] arrays for the history.
      Rows with mask 0 must not change ``client_state``.
    personalize: optional ``personalize(client_state, global_params,
      client_ids) -> [R, ...]`` each listed client's own model (Ditto's
      personal model, FedBN's global model with the client's BatchNorm
      leaves), evaluated on the clients' held-out split as the
      personalised accuracy. None: the clients have no model of their own.
    shared: the hyperparameters this client side shares with the server
      rule it must run with, by name (FedDyn: ``{"feddyn_alpha": alpha}``);
      the run hands them to the rule (``RunContext.client_side``) and
      refuses a rule that reads none of them.
  """
  init: Callable[[int], Any]
  update: Callable[..., tuple[Any, Any, Metrics]]
  personalize: Optional[Callable[..., Params]] = None
  shared: Mapping[str, Any] = {}


class Callback:
  """What a run hands each history row to: the one callback interface.

  ``callback(row, client_row)`` after every round (and for round 0): the
  round's history row (a dict of scalars, which a callback may extend,
  e.g. with ``epsilon``) and its per-client arrays (None for round 0).
  ``after_round(round_num, state, stopping)`` once per round after every
  member's rows, with the run's whole state (``stopping``: the run ends
  at this round because callbacks asked). ``close()`` when the run ends,
  also on an error. A true ``stop_requested`` after a round asks the run
  to end there (a run of several members ends when every member asks).

  Subclass it and override what you need; a plain function
  ``f(row, client_row)`` is a callback too (``as_callback``).
  """

  stop_requested: bool = False

  def __call__(self, row: dict, client_row: Optional[dict]) -> None:
    """Takes a history row and its client row (None for round 0)."""
    del row, client_row

  def after_round(self, round_num: int, state: Any, stopping: bool) -> None:
    """Runs once after round ``round_num``'s rows, with the run's state."""
    del round_num, state, stopping

  def close(self) -> None:
    """Runs once when the run ends, also on an error."""


class _FunctionCallback(Callback):
  """A plain function ``f(row, client_row)`` as a ``Callback``."""

  def __init__(self, function: Callable[[dict, Optional[dict]], None]):
    self.function = function

  def __call__(self, row: dict, client_row: Optional[dict]) -> None:
    self.function(row, client_row)


def as_callback(callback: Any, where: str = "callbacks") -> Callback:
  """``callback`` as a ``Callback``: itself if it is one, a plain function
  wrapped. An object with ``after_round``, ``close`` or ``stop_requested``
  that does not subclass ``Callback`` is refused (a TypeError naming
  ``where``) rather than run with those parts ignored."""
  if isinstance(callback, Callback):
    return callback
  if not callable(callback):
    raise TypeError(f"{where}: a callback is a types.Callback or a function "
                    f"(row, client_row), got {type(callback).__name__}")
  parts = [name for name in ("after_round", "close", "stop_requested")
           if hasattr(callback, name)]
  # A duck-typed object with these parts would run with them silently ignored
  # (only ``__call__`` is wrapped); refusing it says so.
  if parts:
    raise TypeError(
        f"{where}: {type(callback).__name__} has {', '.join(parts)} but is "
        "not a types.Callback; subclass fedjax_agg.types.Callback so that "
        "the run calls them")
  return _FunctionCallback(callback)
