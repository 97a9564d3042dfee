"""FedPer: base layers shared, personalization layers kept by each client.

Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with
Personalization Layers", arXiv 1912.00818, 2019 (Algorithm 1).

The model is base layers W_B followed by personalization layers W_P (the
head). Round t, client j of the cohort:

  Eq. (a) (client): (W_B,j, W_P,j) <- ``training.epochs`` epochs of SGD on
          the client's data, from (W_B^t, W_P,j), the global base with the
          client's own head;
  Eq. (b) (client): keeps W_P,j, sends W_B,j;
  Eq. (c) (server): W_B^{t+1} = sum_j (n_j / n) W_B,j (FedAvg of the
          bases, the rule's business).

(The letters label the steps of the paper's Algorithm 1; its equations
are not numbered.)

Interpretation choices:

* Which leaves are personal is a predicate on the leaf path; the default
  (``last_dense_layer``) takes the model's last Dense layer, found from
  the leaf paths (see there for the rule and when to pass ``is_local``).
* The whole model goes to the rule, which therefore also averages the
  heads. That average is used only to evaluate the global model and as
  the starting head of a client that has not trained yet (the paper's
  clients initialise their own heads; here every new client starts from
  the server's current copy, the initial model in round 1). A client's
  own head is never replaced by an average after its first round.
* An empty personal part (``is_local`` true for no leaf) is allowed: every
  client then trains the global model exactly as plain local training
  does, and with FedAvg the run is FedAvg.

Memory: the table holds every client's head (N x the head's size).
"""

from typing import Callable, NamedTuple, Optional

from fedjax_agg import engine
from fedjax_agg.clients import _common
from fedjax_agg.clients import _personal
from fedjax_agg.clients import _table
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import LocalUpdate, Model

__all__ = ["FedPerState", "fedper"]


class FedPerState(NamedTuple):
  """FedPer's client state: ``local``, a ``Table`` whose rows are the
  tuple of the personal leaves (``jax.tree.leaves`` order)."""
  local: _table.Table


def fedper(model: Model, training: LocalTraining = LocalTraining(), *,
           is_local: Optional[Callable[[str], bool]] = None,
           **options) -> LocalUpdate:
  """FedPer's client side as the round's ``LocalUpdate`` (pair it with
  ``aggregators.fedavg()``, the paper's rule, or any rule).

  Args:
    model: the network.
    training: the local training (any objective and optimizer).
    is_local: ``is_local(path) -> bool`` on '/'-joined leaf paths (e.g.
      "params/Dense_1/kernel"), True for the personalization layers;
      default: ``last_dense_layer`` of the model's variables. It may
      match no leaf (plain local training).
    **options: ``clients.ClientOptions`` (the local training's chunking
      and devices, where the per-client table lives).

  Returns:
    A ``LocalUpdate`` with a ``personalize`` (each client's model: the
    global base with its own head). Metrics: ``num_local_leaves``.

  Raises:
    TypeError: ``training`` is not a ``LocalTraining``, ``is_local`` not
      callable, or an unknown option.
    ValueError: no ``is_local`` and the model has no Dense layer.
  """
  options = _common.client_options("fedper", options)
  if not isinstance(training, LocalTraining):
    raise TypeError(f"training must be a config.LocalTraining, got "
                    f"{type(training).__name__}")
  shapes = _common.model_shapes(model)
  local = _personal.head_leaves(shapes, is_local, "fedper")
  train = engine.make_local_trainer(model, training, **options.trainer())
  return _personal.keep_leaves(train, local, options, FedPerState)
