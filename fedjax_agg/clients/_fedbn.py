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

from fedjax_agg import engine
from fedjax_agg import tree_math
from fedjax_agg.clients import _common
from fedjax_agg.clients import _personal
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
  _personal.check_is_local(is_local)
  train = engine.make_local_trainer(model, training, **options.trainer())
  shapes = _common.model_shapes(model)
  local = _personal.local_leaves(shapes, is_local)
  if not local.positions:
    raise ValueError(
        "fedbn: the model has no local leaves (no BatchNorm layer matched "
        f"is_local); leaf paths: {tree_math.leaf_paths(shapes)[:8]}")
  return _personal.keep_leaves(train, local, options, FedBNState)
