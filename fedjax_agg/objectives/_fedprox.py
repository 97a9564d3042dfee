"""FedProx's proximal local objective.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020.

h_k(w) = F_k(w) + (mu / 2) * ||w - w_global||^2   (Eq. 2 of the paper)

The proximal term covers every trainable array of the params tree; the
non-trainable ``batch_stats`` collection (BatchNorm statistics) is excluded.
"""

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg.types import LocalObjective


def trainable(params):
  """The part of a flax variables dict that is trained by gradient."""
  # Only a flax variables dict has collections; any other tree is taken
  # as trainable as a whole.
  if isinstance(params, dict) and "batch_stats" in params:
    return {k: v for k, v in params.items() if k != "batch_stats"}
  return params


def fedprox(mu: float = 0.01) -> LocalObjective:
  """FedProx objective with proximal coefficient ``mu`` (>= 0)."""
  checks.check_range("mu", mu, 0)

  def prepare(params, global_params):
    del params, global_params
    return ()

  def penalty(params, global_params, context):
    del context
    sq = jax.tree.map(lambda w, g: jnp.sum(jnp.square(w - g)),
                      trainable(params), trainable(global_params))
    return 0.5 * mu * sum(jax.tree.leaves(sq))

  # The declared mu is what FedNova's normaliser reads for the proximal
  # term.
  return LocalObjective(prepare, penalty, proximal_mu=mu)
