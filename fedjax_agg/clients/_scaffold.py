"""SCAFFOLD: local training corrected by control variates.

Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic
Controlled Averaging for Federated Learning", ICML 2020 (Algorithm 1).

Client i of the sampled set S, from the server model x and control c:

  Eq. (a) (line 10): y <- y - eta_l (g_i(y) - c_i + c), for K_i local steps
          from y = x;
  Eq. (b) (line 12, option II): c_i+ = c_i - c + (x - y_i) / (K_i eta_l);
  Eq. (c) (lines 16-17): x <- x + eta_g (1/|S|) sum_{i in S} (y_i - x),
          c <- c + (1/N) sum_{i in S} (c_i+ - c_i).

Interpretation choices:

* The correction of Eq. (a) is the gradient of the linear term
  <y, c - c_i> added to the client's loss, so the client's optimizer applies
  it (exactly Eq. (a) with plain SGD, the paper's setting; with momentum or
  Adam it is corrected like the data gradient).
* K_i is the number of steps the client took (stragglers and padding rows
  take fewer or none) and eta_l its learning rate of the round.
* The server control c (Eq. (c), second line) is client state: the local
  update computes it from the cohort's c_i+ - c_i, which only it sees; the
  aggregator (``scaffold_aggregator``) is Eq. (c)'s first line, the uniform
  mean of the models with the server learning rate eta_g.
* Control variates are zero at the start (the paper's choice) and cover the
  trainable leaves only; BatchNorm statistics (``batch_stats``) have no
  gradient and no control variate.
* A client excluded from the round (padding, or a non-finite model or
  control variate) keeps its c_i and adds nothing to c.

Memory: the table holds one model-sized control variate per client
(N x the model).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import aggregators
from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg import tree_math
from fedjax_agg.clients import _common
from fedjax_agg.clients import _table
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import (Aggregator, LocalObjective, LocalUpdate, Model,
                              Params)

__all__ = ["ScaffoldState", "correction_objective", "scaffold",
           "scaffold_aggregator"]


class ScaffoldState(NamedTuple):
  """SCAFFOLD's client state.

  Attributes:
    controls: the clients' control variates c_i (``Table`` of [N, ...]).
    server_control: c, shaped like the model.
  """
  controls: _table.Table
  server_control: Params


def correction_objective() -> LocalObjective:
  """The local loss plus <params, correction>: its gradient adds the
  per-client ``correction`` (c - c_i, handed over as the objective's
  reference) to the data gradient, Eq. (a)."""

  def prepare(params, reference):
    del params, reference
    return ()

  def penalty(params, reference, context):
    del context
    # The correction is a constant of the round: stop_gradient keeps the
    # gradient of <p, c> with respect to p alone, which is c itself.
    terms = jax.tree.map(
        lambda p, c: jnp.vdot(p, jax.lax.stop_gradient(c).astype(p.dtype),
                              precision=tree_math.FULL),
        params, reference)
    return sum(jax.tree.leaves(terms), jnp.zeros(()))

  return LocalObjective(prepare, penalty)


def scaffold(model: Model, training: LocalTraining = LocalTraining(),
             **options) -> LocalUpdate:
  """SCAFFOLD's client side as the round's ``LocalUpdate``.

  Args:
    model: the network.
    training: the local training (its ``objective`` must be None: SCAFFOLD
      sets its own); the paper uses plain SGD.
    **options: ``clients.ClientOptions`` (the local training's chunking
      and devices, where the per-client table lives).

  Returns:
    A ``LocalUpdate`` whose state is a ``ScaffoldState``; pair it with
    ``scaffold_aggregator``. Metrics: ``server_control_norm`` and, per
    client, ``control_norm`` (||c_i+||).
  """
  options = _common.client_options("scaffold", options)
  train = engine.make_local_trainer(
      model, _common.with_own_objective(
          "training", training, correction_objective(), "scaffold"),
      **options.trainer())
  shapes = _common.model_shapes(model)
  trainable = _common.trainable_leaves(shapes)

  def init(num_clients: int) -> ScaffoldState:
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    return ScaffoldState(options.init_table(num_clients, shapes), zeros)

  def update(client_state: ScaffoldState, global_params, data, client_ids,
             mask, learning_rates, num_steps, round_num, key):
    del round_num
    controls = _table.gather(client_state.controls, client_ids)
    server_control = client_state.server_control
    # c[None] broadcasts the server control over the cohort's K rows.
    # Statistics (non-trainable leaves) get no correction: they have no
    # gradient to correct.
    correction = jax.tree.map(
        lambda c, ci, t: (c[None] - ci) if t else jnp.zeros_like(ci),
        server_control, controls, trainable)
    local = train(global_params, data, client_ids, learning_rates,
                  num_steps, key, None, correction)
    # Eq. (b), option II.
    # K_i eta_l is 0 for padding rows and zero-step stragglers; the floor
    # keeps the division finite, and such rows are not written below.
    scale = 1.0 / jnp.maximum(local.steps_taken.astype(jnp.float32)
                              * learning_rates, 1e-30)

    def new_control(c, ci, x, y, t):
      # ``t`` is a Python bool per leaf (a static tree of flags), so this
      # branch is taken at trace time.
      if not t:
        return jnp.zeros_like(ci)
      shape = (-1,) + (1,) * (ci.ndim - 1)
      return ci - c[None] + (x[None] - y) * scale.reshape(shape).astype(
          ci.dtype)
    new_controls = jax.tree.map(new_control, server_control, controls,
                                global_params, local.client_params, trainable)
    write = ((mask > 0) & (local.steps_taken > 0)
             & engine.rows_finite(local.client_params)
             & engine.rows_finite(new_controls))
    # Eq. (c), second line: c += (1/N) sum over the written clients.
    num_clients = client_state.controls.seen.shape[0]

    def server_step(c, ci, ci_new):
      shape = (-1,) + (1,) * (ci.ndim - 1)
      # The same ``write`` as the table's scatter: with zero initial controls
      # this keeps c equal to the mean of the N stored c_i.
      delta = jnp.where(write.reshape(shape), ci_new - ci, 0.0)
      return c + jnp.sum(delta, axis=0) / num_clients
    new_server = jax.tree.map(server_step, server_control, controls,
                              new_controls)
    table = _table.scatter(client_state.controls, client_ids, new_controls,
                           write)
    metrics = {"server_control_norm": optax.tree.norm(new_server),
               "control_norm": jax.vmap(optax.tree.norm)(new_controls)}
    return local, ScaffoldState(table, new_server), metrics

  return LocalUpdate(init=init, update=update)


def scaffold_aggregator(server_learning_rate: float = 1.0) -> Aggregator:
  """Eq. (c), first line: x + eta_g * (uniform mean of y_i - x) over the
  real participants (FedAvg with uniform weights and a server SGD step)."""
  checks.check_range("server_learning_rate", server_learning_rate, low=0.0,
                     low_open=True)
  return aggregators.with_server_optimizer(
      aggregators.fedavg(weighting="uniform"),
      optax.sgd(server_learning_rate))
