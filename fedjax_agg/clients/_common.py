"""Pieces the stateful client algorithms share."""

import dataclasses
from typing import Any, NamedTuple, Optional

import jax

from fedjax_agg import tree_math
from fedjax_agg.clients import _table
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import Model

__all__ = ["ClientOptions", "batch_norm_leaf", "client_options",
           "model_shapes", "trainable_leaves", "with_own_objective"]


class ClientOptions(NamedTuple):
  """How a stateful client side runs and where it keeps its table.

  Attributes:
    clients_per_step, mesh, chunk_loop: how the local training runs, as in
      ``engine.make_local_trainer``.
    placement, path: where the per-client table lives (``init_table``):
      "device" (in the server state) or "host" (host memory, or a file at
      ``path``; for populations whose table does not fit on the device).
  """
  clients_per_step: Optional[int] = None
  mesh: Optional[jax.sharding.Mesh] = None
  chunk_loop: str = "map"
  placement: str = "device"
  path: Optional[str] = None

  def trainer(self) -> dict:
    """The ``engine.make_local_trainer`` keywords."""
    return {"clients_per_step": self.clients_per_step, "mesh": self.mesh,
            "chunk_loop": self.chunk_loop}

  def init_table(self, num_clients: int, shapes: Any) -> _table.Table:
    """A per-client table of ``num_clients`` zero rows shaped like
    ``shapes`` (one row per client id, none seen yet), kept where
    ``placement`` and ``path`` say: in the server state or in host
    memory."""
    return _table.init_table(num_clients, shapes, self.placement, self.path)


def client_options(algorithm: str, options: dict) -> ClientOptions:
  """A factory's ``**options`` as ``ClientOptions``; an unknown name is
  refused naming the factory and the names it takes."""
  # Refused here, before a trainer is built, so a misspelt option names the
  # factory and its options rather than failing inside ClientOptions.
  unknown = sorted(set(options) - set(ClientOptions._fields))
  if unknown:
    raise TypeError(f"{algorithm}() got unexpected keyword arguments "
                    f"{unknown}; its options are {list(ClientOptions._fields)}"
                    " and its own arguments")
  result = ClientOptions(**options)
  _table.check_placement(result.placement, result.path)
  return result


def with_own_objective(name: str, training: Any, objective,
                       algorithm: str) -> LocalTraining:
  """``training`` with ``objective`` in place of its own, which must be
  None (the algorithm's local loss is fixed)."""
  if not isinstance(training, LocalTraining):
    raise TypeError(f"{name} must be a config.LocalTraining, got "
                    f"{type(training).__name__}")
  # The replace below would silently drop a caller's objective; refusing it
  # keeps the local loss the one the algorithm defines.
  if training.objective is not None:
    raise ValueError(f"{algorithm}: {name}.objective must be None (it sets "
                     "its own local objective)")
  return dataclasses.replace(training, objective=objective)


def trainable_leaves(shapes: Any) -> Any:
  """True for every leaf outside the ``batch_stats`` collection."""
  return tree_math.select_leaves(
      shapes, lambda path: not tree_math.is_statistic(path))


def model_shapes(model: Model) -> Any:
  """The shapes and dtypes of ``model.init``'s variables (nothing runs)."""
  return jax.eval_shape(model.init, jax.random.key(0))


def batch_norm_leaf(path: str) -> bool:
  """FedBN's default choice of local leaves: BatchNorm statistics (the
  ``batch_stats`` collection) and the scale and bias of BatchNorm layers
  (modules named ``bn...`` or ``BatchNorm_...``)."""
  # keys[0] is the collection ("params" or "batch_stats"); module names
  # start at keys[1].
  keys = path.split("/")
  return keys[0] == "batch_stats" or any(
      k.startswith("bn") or k.startswith("BatchNorm") for k in keys[1:])
