"""Local objectives: the data loss plus an optional per-client regulariser.

Each objective is a ``LocalObjective(prepare, penalty)`` written for one
client (see ``fedjax_agg.types``); ``local_loss(model, objective)`` gives the
whole loss ``(params, batch, global_params, context) -> (loss, new_params)``,
where the data loss is the model's task loss (``Model.loss``).
"""

from fedjax_agg.objectives._base import cross_entropy
from fedjax_agg.objectives._base import local_loss
from fedjax_agg.objectives._base import masked_cross_entropy
from fedjax_agg.objectives._fedlap import fedlap
from fedjax_agg.objectives._fedlap import row_dissimilarities
from fedjax_agg.objectives._fedlap import row_distances
from fedjax_agg.objectives._fedprox import fedprox
from fedjax_agg.objectives._fedprox import trainable
from fedjax_agg.registry import Registry

__all__ = [
    "REGISTRY", "cross_entropy", "fedlap", "fedprox", "get", "local_loss",
    "masked_cross_entropy", "row_dissimilarities", "row_distances",
    "trainable",
]

REGISTRY = Registry("objective", {
    "cross_entropy": cross_entropy,
    "fedlap": fedlap,
    "fedprox": fedprox,
})
"""The local objectives by name (used by the CLI and the configs): name ->
factory of a ``LocalObjective``."""


def get(name: str, **kwargs):
  """Builds the registered local objective ``name`` with ``kwargs``."""
  return REGISTRY.build(name, **kwargs)
