"""APFL: each client mixes a personal model with the global one.

Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv
2003.13461, 2020 (Algorithm 1).

Client i keeps a personal model v_i and a mixing weight alpha_i; its
personalised model is v_bar_i = alpha_i v_i + (1 - alpha_i) w_i. Every
local step, on one minibatch xi, from the current (w_i, v_i, alpha_i):

  Eq. (a): w_i <- w_i - eta grad f_i(w_i; xi) (the client's copy of the
           global model, as in FedAvg);
  Eq. (b): v_i <- v_i - eta grad_v f_i(v_bar_i; xi)
                = v_i - eta alpha_i grad f_i(v_bar_i; xi);
  Eq. (c): alpha_i <- clip(alpha_i - eta_alpha grad_alpha f_i(v_bar_i; xi),
           0, 1), grad_alpha f_i(v_bar_i) = <v_i - w_i, grad f(v_bar_i)>;
  Eq. (d) (server, after the round's local steps): w = the average of the
           cohort's w_i (the rule's business: ``aggregators.fedavg()``).

(The letters label the steps of the paper's Algorithm 1 and its adaptive
alpha.)

Interpretation choices:

* The three gradients are those of ONE scalar function of (w, v, alpha),
  f(w) + f(sg(w) + alpha (v - sg(w))) with sg the stop-gradient, so the
  engine's local training runs APFL unchanged (same data order, masking,
  step budgets, chunking and devices as every other algorithm): each of
  its steps is Eqs. (a)-(c) on one minibatch, all three from the values
  before the step. Its reported loss is f(w) alone.
* w and v use the training's optimizer at the round's learning rate (SGD
  in the paper), alpha plain SGD at ``alpha_learning_rate`` (default: the
  round's learning rate, the paper's single eta_t), then the clip of
  Eq. (c). ``alpha_learning_rate=0`` keeps every alpha_i at ``alpha``
  (the paper's fixed-alpha variant).
* v_i starts at the global model and alpha_i at ``alpha`` the first time a
  client trains; the personalised model of a client is alpha_i v_i +
  (1 - alpha_i) w with w the current global model (the global model
  itself for a client that never trained).
* Models with BatchNorm statistics are refused: the paper defines no
  running statistics for the mixture v_bar.

Memory: the table holds one personal model and one alpha per client
(N x the model).
"""

import dataclasses
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg import objectives
from fedjax_agg import tree_math
from fedjax_agg.clients import _common
from fedjax_agg.clients import _table
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import LocalObjective, LocalUpdate, Model, Params

__all__ = ["APFLState", "apfl", "mix"]


class APFLState(NamedTuple):
  """APFL's client state: ``personal``, a ``Table`` whose rows are
  ``{"v": personal model, "alpha": [] mixing weight}``."""
  personal: _table.Table


def mix(global_params: Params, personal: Params, alpha: jax.Array):
  """alpha v + (1 - alpha) w, written w + alpha (v - w) (w exactly where
  v = w); ``alpha`` [] or [K] for stacked [K, ...] ``personal``."""
  def leaf(w, v):
    a = jnp.reshape(alpha, jnp.shape(alpha) + (1,) * (v.ndim - jnp.ndim(
        alpha))).astype(v.dtype)
    return w + a * (v - w)
  return jax.tree.map(leaf, global_params, personal)


def _paired(model: Model, alpha: float) -> Model:
  """The model of (w, v, alpha): outputs of w and of the mixture, whose
  loss has the value of f(w) and the gradients of Eqs. (a)-(c)."""

  def init(key):
    params = model.init(key)
    return {"w": params, "v": params,
            "alpha": jnp.asarray(alpha, jnp.float32)}

  def apply(params, x, train):
    outputs, new_w = model.apply(params["w"], x, train)
    # Through the mixture only v and alpha receive gradients (Eqs. (b), (c));
    # w's gradient comes from f(w) alone (Eq. (a)), hence the stop-gradient.
    mixed = mix(jax.lax.stop_gradient(params["w"]), params["v"],
                params["alpha"])
    # The mixture's new variables are discarded: only w's forward pass
    # updates state (models with BatchNorm statistics are refused anyway).
    mixed_outputs, _ = model.apply(mixed, x, train)
    return (outputs, mixed_outputs), {**params, "w": new_w}

  def loss(outputs, labels):
    own, mixed = model.loss(outputs[0], labels), model.loss(outputs[1],
                                                            labels)
    # f(w) + f(v_bar) - sg(f(v_bar)): the value of f(w), both gradients.
    return own + (mixed - jax.lax.stop_gradient(mixed))

  return Model(init, apply, loss)


def _clip_alpha() -> LocalObjective:
  """No penalty (``objectives.cross_entropy``'s); after every step alpha is
  clipped to [0, 1] (Eq. (c))."""

  def proximal(params, reference, learning_rate):
    del reference, learning_rate
    return {**params, "alpha": jnp.clip(params["alpha"], 0.0, 1.0)}

  return objectives.cross_entropy()._replace(proximal=proximal)


def apfl(model: Model, training: LocalTraining = LocalTraining(), *,
         alpha: float = 0.5, alpha_learning_rate: Optional[float] = None,
         **options) -> LocalUpdate:
  """APFL's client side as the round's ``LocalUpdate``.

  Args:
    model: the network (without BatchNorm statistics).
    training: the local training of w and v (its ``objective`` must be
      None: APFL sets its own loss).
    alpha: every client's initial mixing weight, in [0, 1].
    alpha_learning_rate: eta_alpha >= 0; None: the round's learning rate.
    **options: ``clients.ClientOptions`` (the local training's chunking
      and devices, where the per-client table lives).

  Returns:
    A ``LocalUpdate`` handing the rule the clients' w; its
    ``personalize`` gives alpha_i v_i + (1 - alpha_i) w. Metrics per
    client: ``alpha`` (after the round).

  Raises:
    TypeError: bad types (``training``, ``alpha``, an unknown option).
    ValueError: ``alpha`` outside [0, 1], a negative
      ``alpha_learning_rate``, a training objective, BatchNorm statistics.
  """
  options = _common.client_options("apfl", options)
  checks.check_range("alpha", alpha, 0.0, 1.0)
  if alpha_learning_rate is not None:
    checks.check_range("alpha_learning_rate", alpha_learning_rate, 0.0)
  config = _common.with_own_objective("training", training, _clip_alpha(),
                                      "apfl")
  shapes = _common.model_shapes(model)
  if any(map(tree_math.is_statistic, tree_math.leaf_paths(shapes))):
    raise ValueError("apfl: the model has BatchNorm statistics "
                     "(batch_stats), which a mixture of two models does "
                     "not define")
  model_optimizer = training.optimizer

  def optimizer(learning_rate):
    alpha_rate = (learning_rate if alpha_learning_rate is None
                  else alpha_learning_rate)
    labels = lambda params: {
        "w": jax.tree.map(lambda _: "model", params["w"]),
        "v": jax.tree.map(lambda _: "model", params["v"]),
        "alpha": "alpha"}
    # Eq. (c) is a plain gradient step on alpha whatever optimizer trains w
    # and v; the clip to [0, 1] follows as the objective's proximal step.
    return optax.multi_transform(
        {"model": model_optimizer(learning_rate=learning_rate),
         "alpha": optax.sgd(alpha_rate)}, labels)

  train = engine.make_local_trainer(
      _paired(model, alpha), dataclasses.replace(config, optimizer=optimizer),
      **options.trainer())
  row_shapes = {"v": shapes, "alpha": jax.ShapeDtypeStruct((), jnp.float32)}
  initial_alpha = jnp.asarray(alpha, jnp.float32)

  def init(num_clients: int) -> APFLState:
    return APFLState(options.init_table(num_clients, row_shapes))

  def own(table, global_params, client_ids):
    return _table.gather(table, client_ids, default={
        "v": global_params, "alpha": initial_alpha})

  def update(client_state: APFLState, global_params, data, client_ids,
             mask, learning_rates, num_steps, round_num, key):
    del round_num
    rows = own(client_state.personal, global_params, client_ids)
    count = client_ids.shape[0]
    # w restarts from the global model every round (Eq. (a) is FedAvg's local
    # step); v and alpha continue from the client's row.
    start = {"w": jax.tree.map(
        lambda a: jnp.broadcast_to(a, (count,) + a.shape), global_params),
             **rows}
    # What the engine calls the global model: only the objective reads it
    # (and ignores it), every client starts from ``start``.
    paired_global = {"w": global_params, "v": global_params,
                     "alpha": initial_alpha}
    local = train(paired_global, data, client_ids, learning_rates, num_steps,
                  key, start, None)
    trained = local.client_params
    # A client that took no step is not written: its row would pin v to this
    # round's global model, while an unseen client reads the current one.
    write = ((mask > 0) & (local.steps_taken > 0)
             & engine.rows_finite(trained))
    table = _table.scatter(client_state.personal, client_ids,
                           {"v": trained["v"], "alpha": trained["alpha"]},
                           write)
    # Only w goes to the rule (Eq. (d)); v and alpha stay with the client.
    return (local._replace(client_params=trained["w"]), APFLState(table),
            {"alpha": trained["alpha"]})

  def personalize(client_state: APFLState, global_params, client_ids):
    rows = own(client_state.personal, global_params, client_ids)
    count = client_ids.shape[0]
    stacked = jax.tree.map(
        lambda a: jnp.broadcast_to(a, (count,) + a.shape), global_params)
    return mix(stacked, rows["v"], rows["alpha"])

  return LocalUpdate(init=init, update=update, personalize=personalize)
