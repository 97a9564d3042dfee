"""FedRep: a shared representation, a head per client, trained in turn.

Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations
for Personalized Federated Learning", ICML 2021 (Algorithm 1).

The model is a representation phi (the body) followed by a head h. Round
t, client i of the cohort, from the global body phi^t and its own head h_i:

  Eq. (a) (head update): tau_h gradient steps on h_i with the body fixed
          at phi^t, from h_i (the head it kept);
  Eq. (b) (body update): tau gradient steps on phi_i with the head fixed
          at the new h_i, from phi^t;
  Eq. (c) (server): phi^{t+1} = the average of the cohort's phi_i (the
          rule's business; the paper averages uniformly:
          ``aggregators.fedavg("uniform")``).

(The letters label the steps of the paper's Algorithm 1.)

Interpretation choices:

* tau_h is ``head_epochs`` epochs and tau is ``training.epochs`` epochs
  over the client's data (default 10 head epochs per round, our choice:
  the paper runs many more head steps than body steps), both at the
  round's learning rate with the training's optimizer, each with a fresh
  optimizer state. A per-round step budget (``training.steps_fn``,
  stragglers) limits the body phase; the head phase always runs its epochs.
* A leaf is fixed by giving it no update (``optax.multi_transform`` with
  ``optax.set_to_zero()``): the optimizer, its momentum and weight decay
  never touch it, and it is restored bit for bit after the phase (also
  against a local objective's proximal step). BatchNorm statistics are not
  parameters: they follow the forward passes of both phases.
* The head is chosen by a predicate on the leaf path, by default the last
  Dense layer (``last_dense_layer``); it must be non-empty and leave a
  non-empty body.
* The whole model goes to the rule; only its body matters for the next
  round, since every client replaces the head by its own. The averaged head
  is used to evaluate the global model and as the starting head of a
  client that has not trained yet (the paper's clients initialise their
  own heads; here they start from the server's current copy).
* A local objective (``training.objective``) reads, in place of the global
  model, the model the client started the round from (global body, own
  head), so a proximal term pulls the head towards the client's own.

Memory: the table holds every client's head (N x the head's size).
"""

import dataclasses
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg import tree_math
from fedjax_agg.clients import _common
from fedjax_agg.clients import _personal
from fedjax_agg.clients import _table
from fedjax_agg.config import LocalTraining, OptimizerFactory
from fedjax_agg.types import LocalUpdate, Model, Params

__all__ = ["FedRepState", "fedrep", "train_only"]


class FedRepState(NamedTuple):
  """FedRep's client state: ``local``, a ``Table`` whose rows are the
  tuple of the head's leaves (``jax.tree.leaves`` order)."""
  local: _table.Table


def train_only(optimizer: OptimizerFactory, trains: Sequence[bool]
                ) -> OptimizerFactory:
  """An optimizer factory that applies ``optimizer`` to the leaves flagged
  in ``trains`` (``jax.tree.leaves`` order) and gives the others a zero
  update (no state, no momentum, no weight decay)."""
  trains = tuple(bool(flag) for flag in trains)

  def labels(params):
    return jax.tree.unflatten(jax.tree.structure(params), [
        "train" if flag else "fixed" for flag in trains])

  def make(learning_rate):
    return optax.multi_transform(
        {"train": optimizer(learning_rate=learning_rate),
         "fixed": optax.set_to_zero()}, labels)
  return make


def _restore(trained: Params, start: Params, fixed: Sequence[bool]):
  """``trained`` with the leaves flagged in ``fixed`` taken from ``start``
  (exactly, whatever the optimizer or a proximal step did to them)."""
  leaves, treedef = jax.tree.flatten(trained)
  return jax.tree.unflatten(treedef, [
      old if flag else new
      for new, old, flag in zip(leaves, jax.tree.leaves(start), fixed,
                                strict=True)])


def fedrep(model: Model, training: LocalTraining = LocalTraining(), *,
           head_epochs: int = 10,
           is_local: Optional[Callable[[str], bool]] = None,
           **options) -> LocalUpdate:
  """FedRep's client side as the round's ``LocalUpdate``.

  Args:
    model: the network.
    training: the body phase's training (tau = ``training.epochs``); the
      head phase uses it too, with ``head_epochs`` epochs.
    head_epochs: tau_h in epochs, >= 0 (0: the head is never trained).
    is_local: ``is_local(path) -> bool`` on '/'-joined leaf paths, True for
      the head; default: ``last_dense_layer`` of the model's variables.
    **options: ``clients.ClientOptions`` (the local training's chunking
      and devices, where the per-client table lives).

  Returns:
    A ``LocalUpdate`` with a ``personalize`` (each client's model: the
    global body with its own head). Its ``LocalResult`` counts the steps
    of both phases (``train_loss`` their mean minibatch loss;
    ``loss_before`` is that of the model the client received). Metrics
    per client: ``head_train_loss`` (0 with ``head_epochs=0``).

  Raises:
    TypeError: ``training`` is not a ``LocalTraining``, ``head_epochs`` not
      an int, ``is_local`` not callable, or an unknown option.
    ValueError: negative ``head_epochs``; a head (or a body) without a
      trainable leaf; no ``is_local`` and no Dense layer.
  """
  options = _common.client_options("fedrep", options)
  if not isinstance(training, LocalTraining):
    raise TypeError(f"training must be a config.LocalTraining, got "
                    f"{type(training).__name__}")
  checks.check_int("head_epochs", head_epochs, 0)
  shapes = _common.model_shapes(model)
  local = _personal.head_leaves(shapes, is_local, "fedrep")
  trainable = jax.tree.leaves(_common.trainable_leaves(shapes))
  # ``local.positions`` index ``jax.tree.leaves(shapes)``; the tree of
  # flags from ``trainable_leaves`` has the same structure, so its leaves
  # line up with them position by position.
  in_head = [i in local.positions for i in range(len(trainable))]
  # BatchNorm statistics are in neither part: no phase's optimizer updates
  # them, and they follow the forward passes of both.
  head = [t and h for t, h in zip(trainable, in_head, strict=True)]
  body = [t and not h for t, h in zip(trainable, in_head, strict=True)]
  if not any(head):
    raise ValueError(
        "fedrep: is_local matched no trainable leaf (the head is empty); "
        f"leaf paths: {tree_math.leaf_paths(shapes)[:8]}")
  if not any(body):
    raise ValueError("fedrep: is_local matched every trainable leaf (the "
                     "shared body is empty)")
  trainer = lambda config: engine.make_local_trainer(model, config,
                                                     **options.trainer())
  train_body = trainer(dataclasses.replace(
      training, optimizer=train_only(training.optimizer, body)))
  train_head = None
  if head_epochs:
    train_head = trainer(dataclasses.replace(
        training, epochs=head_epochs,
        optimizer=train_only(training.optimizer, head)))

  def init(num_clients: int) -> FedRepState:
    return FedRepState(local.init(options, num_clients))

  def update(client_state: FedRepState, global_params, data, client_ids,
             mask, learning_rates, num_steps, round_num, key):
    del round_num
    start = local.merged(client_state.local, global_params, client_ids)
    after_head, head_result = start, None
    if train_head is not None:
      # Eq. (a): the head's epochs, every real client in full.
      # The round's step budget (stragglers) limits the body phase only: the
      # head always runs its full epochs, padding rows none. A key of its own
      # gives the head phase a data order different from the body phase's.
      head_steps = jnp.where(mask > 0, engine.full_steps(
          data, client_ids, training.batch_size, head_epochs), 0)
      head_result = train_head(global_params, data, client_ids,
                               learning_rates, head_steps,
                               jax.random.fold_in(key, 1), start, start)
      # The body is put back bit for bit: a local objective's proximal step may
      # have moved it although its optimizer update is zero.
      after_head = _restore(head_result.client_params, start, body)
    # Eq. (b): the body's epochs with the new head fixed.
    # The objective's reference is the round's start (global body, own head),
    # so a proximal term pulls the head towards the client's own.
    body_result = train_body(global_params, data, client_ids, learning_rates,
                             num_steps, key, after_head, start)
    trained = _restore(body_result.client_params, after_head, head)
    table = local.write(client_state.local, client_ids, trained, mask)
    # No head phase ran (head_epochs 0): a zero-step stand-in lets the sums
    # below serve both cases.
    if head_result is None:
      zeros = jnp.zeros_like(body_result.train_loss)
      head_result = body_result._replace(
          steps_taken=jnp.zeros_like(body_result.steps_taken),
          train_loss=zeros)
    # train_loss is the step-weighted mean of both phases; the max(., 1)
    # guards padding rows, which took no step in either.
    steps = head_result.steps_taken + body_result.steps_taken
    loss_sum = (head_result.train_loss * head_result.steps_taken
                + body_result.train_loss * body_result.steps_taken)
    result = engine.LocalResult(
        client_params=trained, loss_before=head_result.loss_before,
        loss_after=body_result.loss_after, steps_taken=steps,
        train_loss=loss_sum / jnp.maximum(steps, 1))
    return result, FedRepState(table), {
        "head_train_loss": head_result.train_loss}

  def personalize(client_state: FedRepState, global_params, client_ids):
    return local.merged(client_state.local, global_params, client_ids)

  return LocalUpdate(init=init, update=update, personalize=personalize)
