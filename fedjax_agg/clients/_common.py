"""Pieces the stateful client algorithms share."""

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import engine
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import Model, Params

__all__ = ["batch_norm_leaf", "leaf_paths", "make_trainer", "model_shapes",
           "select_leaves", "trainable_leaves", "where_rows",
           "with_own_objective"]


def make_trainer(model: Model, training: LocalTraining, *,
                 clients_per_step: Optional[int], mesh, chunk_loop: str):
  """The engine's cohort trainer (see ``engine.make_local_trainer``)."""
  if not isinstance(training, LocalTraining):
    raise TypeError(f"training must be a config.LocalTraining, got "
                    f"{type(training).__name__}")
  return engine.make_local_trainer(model, training,
                                   clients_per_step=clients_per_step,
                                   mesh=mesh, chunk_loop=chunk_loop)


def with_own_objective(name: str, training: Any, objective,
                       algorithm: str) -> LocalTraining:
  """``training`` with ``objective`` in place of its own, which must be
  None (the algorithm's local loss is fixed)."""
  if not isinstance(training, LocalTraining):
    raise TypeError(f"{name} must be a config.LocalTraining, got "
                    f"{type(training).__name__}")
  if training.objective is not None:
    raise ValueError(f"{algorithm}: {name}.objective must be None (it sets "
                     "its own local objective)")
  return dataclasses.replace(training, objective=objective)


def trainable_leaves(shapes: Any) -> Any:
  """True for every leaf outside the ``batch_stats`` collection."""
  return select_leaves(shapes, lambda path: not path.startswith(
      "batch_stats"))


def model_shapes(model: Model) -> Any:
  """The shapes and dtypes of ``model.init``'s variables (nothing runs)."""
  return jax.eval_shape(model.init, jax.random.key(0))


def leaf_paths(tree: Any) -> list[str]:
  """'/'-joined key path of every leaf, in ``jax.tree.leaves`` order."""
  paths = []
  for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
    keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
            for k in path]
    paths.append("/".join(keys))
  return paths


def batch_norm_leaf(path: str) -> bool:
  """FedBN's default choice of local leaves: BatchNorm statistics (the
  ``batch_stats`` collection) and the scale and bias of BatchNorm layers
  (modules named ``bn...`` or ``BatchNorm_...``)."""
  keys = path.split("/")
  return keys[0] == "batch_stats" or any(
      k.startswith("bn") or k.startswith("BatchNorm") for k in keys[1:])


def select_leaves(tree: Any, predicate: Callable[[str], bool]) -> Any:
  """A tree of bools shaped like ``tree``'s leaves: ``predicate(path)``."""
  flags = [bool(predicate(p)) for p in leaf_paths(tree)]
  return jax.tree.unflatten(jax.tree.structure(tree), flags)


def where_rows(keep: jax.Array, stacked: Params, other: Params) -> Params:
  """Row k of ``stacked`` where ``keep[k]``, else row k of ``other``
  ([K, ...] or broadcast from one row)."""
  def leaf(a, b):
    shape = (-1,) + (1,) * (a.ndim - 1)
    return jnp.where(keep.reshape(shape), a, b)
  return jax.tree.map(leaf, stacked, other)
