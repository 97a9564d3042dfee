"""FedBN: BatchNorm layers stay with their client.

Li, Jiang, Zhang, Kamp, Dou, "FedBN: Federated Learning on Non-IID Features
via Local Batch Normalization", ICLR 2021 (Algorithm 1).

Every client keeps its own BatchNorm parameters (scale, bias) and running
statistics; the server averages the other leaves. Round t, client k:
starts from the global model with its own BatchNorm leaves in place, trains
``training.epochs`` epochs, keeps its new BatchNorm leaves, and hands the
whole model to the rule, which averages it (FedAvg in the paper).

Interpretation choices:

* Which leaves are local is a predicate on the leaf's path; the default
  (``batch_norm_leaf``) takes the ``batch_stats`` collection and the
  parameters of modules named ``bn...`` / ``BatchNorm_...``.
* The server still aggregates the BatchNorm leaves like any others; that
  copy is used only to evaluate the global model on the test set and as the
  starting BatchNorm of a client that has not trained yet (the paper does
  not say where an unseen client's BatchNorm starts; here it starts from
  the server's current copy). A client's own BatchNorm leaves are never
  replaced by an average after its first round.

Memory: the table holds the local leaves of every client (N x a few
hundred floats for the bundled BatchNorm networks).
"""

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import engine
from fedjax_agg import tree_math
from fedjax_agg.clients import _common
from fedjax_agg.clients import _table
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import LocalUpdate, Model

__all__ = ["FedBNState", "fedbn"]


class FedBNState(NamedTuple):
  """FedBN's client state: ``local``, a ``Table`` whose rows are the
  tuple of the local leaves (``jax.tree.leaves`` order)."""
  local: _table.Table


def fedbn(model: Model, training: LocalTraining = LocalTraining(), *,
          is_local: Optional[Callable[[str], bool]] = None,
          **options) -> LocalUpdate:
  """FedBN's client side as the round's ``LocalUpdate`` (pair it with
  ``aggregators.fedavg()``, or any rule).

  Args:
    model: the network; it must have at least one local leaf.
    training: the local training.
    is_local: ``is_local(path) -> bool`` on '/'-joined leaf paths (e.g.
      "params/bn1/scale"); default ``batch_norm_leaf``.
    **options: ``clients.ClientOptions`` (the local training's chunking
      and devices, where the per-client table lives).

  Returns:
    A ``LocalUpdate`` with a ``personalize`` (each client's model: the
    global model with its own local leaves). Metrics: ``num_local_leaves``.
  """
  options = _common.client_options("fedbn", options)
  is_local = _common.batch_norm_leaf if is_local is None else is_local
  if not callable(is_local):
    raise TypeError(f"is_local must be a function of a leaf path, got "
                    f"{type(is_local).__name__}")
  train = engine.make_local_trainer(model, training, **options.trainer())
  shapes = _common.model_shapes(model)
  flags = jax.tree.leaves(tree_math.select_leaves(shapes, is_local))
  if not any(flags):
    raise ValueError(
        "fedbn: the model has no local leaves (no BatchNorm layer matched "
        f"is_local); leaf paths: {tree_math.leaf_paths(shapes)[:8]}")
  positions = [i for i, flag in enumerate(flags) if flag]
  shape_leaves = jax.tree.leaves(shapes)

  def init(num_clients: int) -> FedBNState:
    return FedBNState(options.init_table(
        num_clients, tuple(shape_leaves[i] for i in positions)))

  def merged(table, global_params, client_ids):
    """[K] models: the global leaves with each client's local ones."""
    leaves, treedef = jax.tree.flatten(global_params)
    own = _table.gather(table, client_ids,
                        default=tuple(leaves[i] for i in positions))
    count = client_ids.shape[0]
    stacked = [jnp.broadcast_to(leaf, (count,) + leaf.shape)
               for leaf in leaves]
    for j, i in enumerate(positions):
      stacked[i] = own[j]
    return jax.tree.unflatten(treedef, stacked)

  def update(client_state: FedBNState, global_params, data, client_ids,
             mask, learning_rates, num_steps, round_num, key):
    del round_num
    start = merged(client_state.local, global_params, client_ids)
    local = train(global_params, data, client_ids, learning_rates,
                  num_steps, key, start, None)
    trained = jax.tree.leaves(local.client_params)
    rows = tuple(trained[i] for i in positions)
    write = (mask > 0) & engine.rows_finite(local.client_params)
    table = _table.scatter(client_state.local, client_ids, rows, write)
    return local, FedBNState(table), {
        "num_local_leaves": jnp.asarray(len(positions), jnp.float32)}

  def personalize(client_state: FedBNState, global_params, client_ids):
    return merged(client_state.local, global_params, client_ids)

  return LocalUpdate(init=init, update=update, personalize=personalize)
