"""FedDyn: local training under a dynamic regulariser.

Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning
Based on Dynamic Regularization", ICLR 2021 (Algorithm 1).

Client k of the round's participants P_t, from the global model
theta^{t-1} and its gradient state grad_k (0 before its first round):

  Eq. (a): theta_k^t = argmin_theta L_k(theta) - <grad_k, theta>
           + (alpha / 2) ||theta - theta^{t-1}||^2, by local training
           from theta^{t-1};
  Eq. (b): grad_k <- grad_k - alpha (theta_k^t - theta^{t-1}).

(Eqs. (c) and (d), h and the server model, are the server rule's,
``aggregators.feddyn``.)

Interpretation choices:

* The argmin of Eq. (a) is the round's local training (the engine's
  epochs, batches and optimizer; plain SGD in the paper) on the data loss
  plus the penalty ``dynamic_objective``, whose gradient is
  -grad_k + alpha (theta - theta^{t-1}).
* The penalty is written as in Eq. (a), with theta^{t-1} and grad_k
  handed to it together as the trainer's per-client reference (a pair of
  [K, ...] trees). The equivalent form (alpha/2) ||theta - (theta^{t-1} +
  grad_k / alpha)||^2 (equal up to a constant) needs one tree instead of
  two, but it adds ||grad_k||^2 / (2 alpha) to the reported training
  loss, which dominates it for a small alpha, and it divides grad_k by
  alpha and multiplies it back in float32; the pair keeps the paper's loss
  value and gradient for the price of one more [K, ...] copy of the
  global model per round.
* Gradient states cover the trainable leaves only: BatchNorm statistics
  (``batch_stats``) have no gradient, no penalty and no state (their rows
  stay 0).
* A client excluded from the round (padding, no local step, or a
  non-finite model or gradient state) keeps its grad_k.
* ``alpha`` must equal the server rule's: the paper has one alpha.

Memory: the table holds one model-sized gradient state per client
(N x the model).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg import tree_math
from fedjax_agg.clients import _common
from fedjax_agg.clients import _table
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import LocalObjective, LocalUpdate, Model

__all__ = ["FedDynClientState", "dynamic_objective", "feddyn"]


class FedDynClientState(NamedTuple):
  """FedDyn's client state: ``gradients``, the ``Table`` of the clients'
  gradient states grad_k ([N, ...], 0 on BatchNorm statistics)."""
  gradients: _table.Table


def dynamic_objective(alpha: float, trainable) -> LocalObjective:
  """The penalty of Eq. (a), -<grad_k, theta> + (alpha/2) ||theta -
  theta^{t-1}||^2 on the ``trainable`` leaves (a tree of bools).

  Its reference (the objective's second argument) is the pair
  (theta^{t-1}, grad_k), both shaped like the model.
  """

  def prepare(params, reference):
    del params, reference
    return ()

  def penalty(params, reference, context):
    del context
    global_params, gradients = reference

    def term(theta, start, gradient, t):
      if not t:
        return jnp.zeros(())
      # theta^{t-1} and grad_k are constants of the round; only theta is
      # differentiated.
      start = jax.lax.stop_gradient(start).astype(theta.dtype)
      gradient = jax.lax.stop_gradient(gradient).astype(theta.dtype)
      return (0.5 * alpha * jnp.sum(jnp.square(theta - start))
              - jnp.vdot(gradient, theta, precision=tree_math.FULL))

    terms = jax.tree.map(term, params, global_params, gradients, trainable)
    return sum(jax.tree.leaves(terms), jnp.zeros(()))

  return LocalObjective(prepare, penalty)


def feddyn(model: Model, training: LocalTraining = LocalTraining(), *,
           alpha: float = 0.01, **options) -> LocalUpdate:
  """FedDyn's client side as the round's ``LocalUpdate``.

  Args:
    model: the network.
    training: the local training (its ``objective`` must be None: FedDyn
      sets its own); the paper uses plain SGD.
    alpha: alpha > 0, the dynamic regularisation's weight (the server
      rule's ``alpha``).
    **options: ``clients.ClientOptions`` (the local training's chunking
      and devices, where the per-client table lives).

  Returns:
    A ``LocalUpdate`` whose state is a ``FedDynClientState``; pair it with
    ``aggregators.feddyn(alpha, num_clients=N)``. Metrics per client:
    ``gradient_state_norm`` (||grad_k|| after the round).
  """
  options = _common.client_options("feddyn", options)
  checks.check_range("alpha", alpha, 0, low_open=True)
  shapes = _common.model_shapes(model)
  trainable = _common.trainable_leaves(shapes)
  train = engine.make_local_trainer(
      model, _common.with_own_objective(
          "training", training, dynamic_objective(alpha, trainable),
          "feddyn"),
      **options.trainer())

  def init(num_clients: int) -> FedDynClientState:
    return FedDynClientState(options.init_table(num_clients, shapes))

  def update(client_state: FedDynClientState, global_params, data,
             client_ids, mask, learning_rates, num_steps, round_num, key):
    del round_num
    gradients = _table.gather(client_state.gradients, client_ids)
    # The trainer's reference is per client ([K, ...]), so theta^{t-1} is
    # stacked K times to travel with grad_k.
    starts = tree_math.broadcast_to_clients(global_params,
                                            client_ids.shape[0])
    local = train(global_params, data, client_ids, learning_rates,
                  num_steps, key, None, (starts, gradients))

    def new_gradient(g, w, theta, t):
      if not t:
        return jnp.zeros_like(g)
      # Eq. (b)
      return g - alpha * (theta - w[None]).astype(g.dtype)

    new_gradients = jax.tree.map(new_gradient, gradients, global_params,
                                 local.client_params, trainable)
    write = ((mask > 0) & (local.steps_taken > 0)
             & engine.rows_finite(local.client_params)
             & engine.rows_finite(new_gradients))
    table = _table.scatter(client_state.gradients, client_ids,
                           new_gradients, write)
    # A client not written reports its unchanged grad_k.
    norms = jnp.where(write, tree_math.client_norms(new_gradients),
                      tree_math.client_norms(gradients))
    return local, FedDynClientState(table), {"gradient_state_norm": norms}

  # Published to the run: aggregators.feddyn takes its alpha from here, so
  # client and server cannot run with two different alphas.
  return LocalUpdate(init=init, update=update,
                     shared={"feddyn_alpha": alpha})
