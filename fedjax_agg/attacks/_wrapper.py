"""Malicious clients as a wrapper around any local update.

``with_attack(attack, adversaries, local_update)`` is a ``LocalUpdate``
that, inside the jitted round: picks the malicious rows of the cohort
(``adversaries``, real rows only), hands the inner update the data as
``attack.data`` poisoned it, trains every client with the inner update
(its client state passed through), then replaces the malicious rows' models
by ``attack.update``'s. Honest rows train on the same data with the same
key as without the wrapper, so their models are exactly the unattacked
ones.

Keys. The attack draws from fold_in(round's training key, 2^31 − 1), a
stream the engine's per-client keys (fold_in(key, client id), ids < N <=
2^31 − 1) never use, so the shuffles of the clients are those of the
unattacked round.

Metrics. ``malicious`` ([K] float 0/1, per client row of the history) and
``num_malicious`` (scalar) are added to the inner update's metrics.

Checks against the run. ``init(num_clients)`` (called by the run with its
number of clients) refuses a ``fixed`` set drawn for another population.
When the model is known (``local_update``, or ``with_attack(...,
model=...)``), an attack written for C classes (``Attack.num_classes``)
is refused when the round is traced unless the model's outputs are C wide
(their last dimension, a static shape).
"""

from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp

from fedjax_agg import config as config_lib
from fedjax_agg import engine
from fedjax_agg import rounds
from fedjax_agg.attacks._adversaries import Adversaries
from fedjax_agg.attacks._attack import Attack
from fedjax_agg.attacks._attack import Cohort
from fedjax_agg.attacks._attack import select_rows
from fedjax_agg.types import LocalUpdate, Model

__all__ = ["ATTACK_STREAM", "local_update", "with_attack"]

ATTACK_STREAM = 2**31 - 1  # fold_in data of the attack's key (docstring)


def _num_outputs(model: Model, global_params, x: jax.Array) -> int:
  """The width of ``model``'s outputs on one example shaped like ``x``'s
  (its number of classes), from shapes only."""
  # Abstract shapes only: the check runs while tracing and costs no
  # forward pass.
  example = jax.ShapeDtypeStruct((1,) + tuple(x.shape[1:]), x.dtype)
  params = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)),
      global_params)
  outputs = jax.eval_shape(lambda p, xb: model.apply(p, xb, False)[0],
                           params, example)
  return int(outputs.shape[-1])


def with_attack(attack: Attack, adversaries: Adversaries,
                local_update: LocalUpdate | Callable[..., Any], *,
                model: Optional[Model] = None) -> LocalUpdate:
  """``local_update`` with ``adversaries``' rows running ``attack``.

  Args:
    attack: what the malicious clients do (``attacks.sign_flip()``, ...,
      ``attacks.compose(...)``).
    adversaries: which rows are malicious (``attacks.fixed``,
      ``attacks.per_round``).
    local_update: the clients' training: a ``LocalUpdate`` (stateful ones
      keep their state) or a function with the engine's interface
      ``(global_params, data, client_ids, learning_rates, num_steps, key)
      -> LocalResult`` (``engine.make_local_trainer``).
    model: the network ``local_update`` trains. Given, an attack written
      for ``attack.num_classes`` classes is checked against the width of
      its outputs when the round is traced; None: not checked.

  Returns:
    A ``LocalUpdate`` for ``simulation.run(..., local_update=...)`` or
    ``rounds.make_round_fn``. Its ``init(num_clients)`` refuses a
    ``fixed`` set of adversaries drawn for another ``num_clients``.

  Raises:
    TypeError: an argument of the wrong kind.
    ValueError: (from ``init``) ``adversaries`` drawn for another
      population; (when the round is traced) ``attack`` written for
      another number of classes than ``model`` has.
  """
  if not isinstance(attack, Attack):
    raise TypeError(f"attack must be an Attack, got "
                    f"{type(attack).__name__}")
  if not isinstance(adversaries, Adversaries):
    raise TypeError(f"adversaries must be an Adversaries "
                    f"(attacks.fixed / attacks.per_round), got "
                    f"{type(adversaries).__name__}")
  if model is not None and not isinstance(model, Model):
    raise TypeError(f"model must be a Model or None, got "
                    f"{type(model).__name__}")
  inner = rounds.as_local_update(local_update)

  def init(num_clients):
    table = adversaries.table
    # Refused before the inner update is initialised: a table for another N
    # would mark the wrong clients, or none, without any error later.
    if table is not None and table.shape[0] != num_clients:
      raise ValueError(
          f"num_clients: the fixed adversaries were drawn for "
          f"num_clients={table.shape[0]} but the run has num_clients="
          f"{num_clients}; build them with attacks.fixed({num_clients}, "
          "...)")
    return inner.init(num_clients)

  def check_classes(global_params, data):
    if model is None or (attack.num_classes is None
                         and attack.max_label is None):
      return
    width = _num_outputs(model, global_params, data.x)
    if attack.max_label is not None and attack.max_label >= width:
      raise ValueError(
          f"target: the attack writes label {attack.max_label}, but the "
          f"model has C={width} classes (outputs of width {width}); use a "
          f"label in [0, {width})")
    if attack.num_classes is not None and width != attack.num_classes:
      raise ValueError(
          f"permutation: the attack's label map (label_flip's permutation "
          f"or num_classes) is written for {attack.num_classes} classes, "
          f"but the model has C={width} (outputs of width {width}); give a "
          f"permutation of range({width})")

  def update(client_state, global_params, data, client_ids, mask,
             learning_rates, num_steps, round_num, key):
    chex.assert_rank([client_ids, mask], 1)
    chex.assert_equal_shape([client_ids, mask, learning_rates, num_steps])
    check_classes(global_params, data)
    attack_key = jax.random.fold_in(key, ATTACK_STREAM)
    select_key, data_key, update_key = jax.random.split(attack_key, 3)
    # Padding rows are never malicious, whatever the rule returns for them.
    malicious = adversaries.select(client_ids, mask, select_key) & (mask > 0)
    cohort = Cohort(client_ids, mask, malicious, round_num, data_key)
    if attack.data is not None:
      data = attack.data(data, cohort)
    # The inner update gets the round's own key, not the attack's: honest
    # rows then train exactly as in the unattacked round.
    result, client_state, metrics = inner.update(
        client_state, global_params, data, client_ids, mask, learning_rates,
        num_steps, round_num, key)
    if attack.update is not None:
      trained = result.client_params
      chex.assert_tree_shape_prefix(trained, client_ids.shape)
      attacked = attack.update(global_params, trained,
                               cohort._replace(key=update_key))
      # Only malicious rows take the attacked models; an update side that
      # touched honest rows changes nothing they send.
      result = result._replace(
          client_params=select_rows(malicious, attacked, trained))
    metrics = {**metrics, "malicious": malicious.astype(jnp.float32),
               "num_malicious": jnp.sum(malicious).astype(jnp.float32)}
    return result, client_state, metrics

  return LocalUpdate(init=init, update=update)


def local_update(model: Model, training: config_lib.LocalTraining,
                 attack: Attack, adversaries: Adversaries, *,
                 execution: config_lib.Execution = config_lib.Execution(),
                 mesh: Optional[jax.sharding.Mesh] = None) -> LocalUpdate:
  """The engine's plain local training with ``attack`` on ``adversaries``.

  Args:
    model: the network and its task loss.
    training: what the clients do (``config.LocalTraining``); with
      ``compute_losses="auto"`` the per-client losses are computed (a
      custom local update does not know the rule: pass False to skip them
      when the rule does not read them).
    attack: see ``with_attack``.
    adversaries: see ``with_attack``.
    execution: ``clients_per_step`` and ``chunk_loop`` of the trainer (its
      ``devices`` are not read: pass ``mesh``).
    mesh: the device mesh with a "clients" axis the cohort is sharded over
      (``distributed.client_mesh(devices)``), as the run's; None: one
      device.

  Returns:
    A ``LocalUpdate``.
  """
  if not isinstance(execution, config_lib.Execution):
    raise TypeError(f"execution must be a config.Execution, got "
                    f"{type(execution).__name__}")
  train = engine.make_local_trainer(
      model, training, clients_per_step=execution.clients_per_step,
      mesh=mesh, chunk_loop=execution.chunk_loop)
  return with_attack(attack, adversaries, train, model=model)
