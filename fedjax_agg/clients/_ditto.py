"""Ditto: a personal model per client, kept near the global one.

Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021 (Algorithm 1).

Round t, client k of the cohort, from the global model w^t:

  global side: w_k = the client's ordinary local update of w^t (handed to
    the server rule, FedAvg in the paper);
  personal side (Eq. 2): v_k <- argmin h_k(v; w^t) = F_k(v) +
    (lambda / 2) ||v - w^t||^2, by the same number of local steps, from the
    v_k the client kept (w^t the first time it trains).

Interpretation choices:

* The proximal term is applied as its exact proximal step after each
  optimizer step on F_k (v <- v + (w - v) eta lambda / (1 + eta lambda)),
  equal to the paper's gradient step on h_k to first order in eta lambda and
  stable for every lambda: lambda = 0 is purely local training, lambda ->
  inf (``math.inf`` allowed) pins v_k to w^t.
* The personal side uses ``personal_training`` (default: the round's
  training, with the round's learning rates) and its own data order (the
  round's key folded with 1).
* BatchNorm statistics (``batch_stats``) of v follow its own training, not
  the proximal step.

Memory: the table holds one personal model per client (N x the model).
"""

import dataclasses
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg import objectives
from fedjax_agg.clients import _common
from fedjax_agg.clients import _table
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import LocalObjective, LocalUpdate, Model

__all__ = ["DittoState", "ditto", "proximal_objective"]


class DittoState(NamedTuple):
  """Ditto's client state: ``personal``, the ``Table`` of the clients'
  personal models v_k."""
  personal: _table.Table


def proximal_objective(lam: float, trainable) -> LocalObjective:
  """F_k alone, with (lambda/2)||v - w||^2 applied as a proximal step on
  the ``trainable`` leaves (a tree of bools)."""

  plain = objectives.cross_entropy()  # F_k: no penalty

  def proximal(params, reference, learning_rate):
    # t = eta lambda / (1 + eta lambda), written to be exact at 0 and inf.
    pull = 1.0 / (1.0 + 1.0 / (learning_rate * lam))
    return jax.tree.map(
        lambda v, w, t: v + (w - v) * pull.astype(v.dtype) if t else v,
        params, reference, trainable)

  return LocalObjective(plain.prepare, plain.penalty, proximal)


def ditto(model: Model, training: LocalTraining = LocalTraining(), *,
          lam: float = 0.1,
          personal_training: Optional[LocalTraining] = None,
          **options) -> LocalUpdate:
  """Ditto's client side as the round's ``LocalUpdate``.

  Args:
    model: the network.
    training: the global side's local training.
    lam: lambda >= 0 (``math.inf`` allowed).
    personal_training: the personal side's training (its ``objective``
      must be None); default ``training`` without its objective, at the
      round's learning rates.
    **options: ``clients.ClientOptions`` (the local training's chunking
      and devices, where the per-client table lives).

  Returns:
    A ``LocalUpdate`` with a ``personalize`` (the personal models).
    Metrics per client: ``personal_train_loss``.
  """
  options = _common.client_options("ditto", options)
  checks.check_range("lam", lam, low=0.0, high=math.inf)
  shapes = _common.model_shapes(model)
  objective = proximal_objective(float(lam), _common.trainable_leaves(shapes))
  if personal_training is None:
    personal_config = dataclasses.replace(training, objective=objective)
  else:
    personal_config = _common.with_own_objective(
        "personal_training", personal_training, objective, "ditto")
  train = engine.make_local_trainer(model, training, **options.trainer())
  train_personal = engine.make_local_trainer(model, personal_config,
                                             **options.trainer())

  def init(num_clients: int) -> DittoState:
    return DittoState(options.init_table(num_clients, shapes))

  def update(client_state: DittoState, global_params, data, client_ids,
             mask, learning_rates, num_steps, round_num, key):
    del round_num
    local = train(global_params, data, client_ids, learning_rates,
                  num_steps, key)
    personal = _table.gather(client_state.personal, client_ids,
                             default=global_params)
    if personal_training is None:
      personal_lrs, personal_steps = learning_rates, num_steps
    else:
      # A training of its own runs its full epochs at its own learning rate:
      # the round's straggler budget cuts only the global side.
      personal_lrs = jnp.full(client_ids.shape,
                              personal_training.learning_rate, jnp.float32)
      personal_steps = jnp.where(mask > 0, engine.full_steps(
          data, client_ids, personal_training.batch_size,
          personal_training.epochs), 0)
    # ``key`` drives the global side's data order; the personal side folds
    # in 1 for an order of its own.
    trained = train_personal(global_params, data, client_ids, personal_lrs,
                             personal_steps, jax.random.fold_in(key, 1),
                             personal, None)
    write = (mask > 0) & engine.rows_finite(trained.client_params)
    table = _table.scatter(client_state.personal, client_ids,
                           trained.client_params, write)
    return local, DittoState(table), {
        "personal_train_loss": trained.train_loss}

  def personalize(client_state: DittoState, global_params, client_ids):
    return _table.gather(client_state.personal, client_ids,
                         default=global_params)

  return LocalUpdate(init=init, update=update, personalize=personalize)
