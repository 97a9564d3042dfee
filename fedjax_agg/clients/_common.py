"""Pieces the stateful client algorithms share."""

import dataclasses
from typing import Any

import jax

from fedjax_agg import tree_math
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import Model

__all__ = ["batch_norm_leaf", "model_shapes",
           "trainable_leaves", "with_own_objective"]


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
  return tree_math.select_leaves(
      shapes, lambda path: not tree_math.is_statistic(path))


def model_shapes(model: Model) -> Any:
  """The shapes and dtypes of ``model.init``'s variables (nothing runs)."""
  return jax.eval_shape(model.init, jax.random.key(0))


def batch_norm_leaf(path: str) -> bool:
  """FedBN's default choice of local leaves: BatchNorm statistics (the
  ``batch_stats`` collection) and the scale and bias of BatchNorm layers
  (modules named ``bn...`` or ``BatchNorm_...``)."""
  keys = path.split("/")
  return keys[0] == "batch_stats" or any(
      k.startswith("bn") or k.startswith("BatchNorm") for k in keys[1:])
