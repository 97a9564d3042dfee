"""Random variables of a model's shapes, for the model tests."""

import jax
import numpy as np


def _random_variables(model, seed):
  """Variables of ``model``'s shapes filled from numpy (no init compile)."""
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  rng = np.random.default_rng(seed)
  variables = jax.tree.map(
      lambda s: (0.2 * rng.standard_normal(s.shape)).astype(np.float32),
      shapes)
  if "batch_stats" in variables:
    variables["batch_stats"] = jax.tree.map(
        lambda a: np.abs(a) + 0.5, variables["batch_stats"])
  return variables
