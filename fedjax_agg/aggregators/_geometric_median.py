"""RFA: the geometric median of the client models (smoothed Weiszfeld).

Pillutla, Kakade and Harchaoui, "Robust Aggregation for Federated
Learning", IEEE Transactions on Signal Processing, 2022.

Over the m real participants (mask 1) with weights alpha_k = n_k / n:

  Eq. (4)   z* = argmin_z sum_k alpha_k |z - w_k|
  Alg. 3    beta_k = alpha_k / max(nu, |z - w_k|)          (nu: smoothing)
            z <- sum_k beta_k w_k / sum_k beta_k

starting from the weighted mean z = sum_k alpha_k w_k and stopping after
``max_iterations`` steps or once the objective g(z) = sum_k alpha_k
|z - w_k| changes by at most ``tolerance`` g(z) in a step.

Interpretations:
* Norms are whole-model (all leaves together). The iteration runs on the
  updates w_k - w_t (the median commutes with a common shift), whose
  magnitudes are small next to the weights, and the result is added to w_t.
* A cohort with no real participant leaves the model unchanged.

Breakdown point: 1/2 of the total weight alpha (the geometric median
stays bounded while the corrupted clients hold less than half of it).

Memory: the rule needs all K updates at once (stacked [K, ...] models, no
streaming form) and a temporary of the same size per iteration.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.types import Aggregator, Params, StackedParams

__all__ = ["GeometricMedianState", "geometric_median", "weiszfeld"]


class GeometricMedianState(NamedTuple):
  """The geometric median keeps no state."""


class _Iterate(NamedTuple):
  median: Params
  distances: jax.Array  # [K] |z - w_k|
  objective: jax.Array  # [] g(z)
  previous: jax.Array  # [] g of the previous iterate (+inf at the start)
  iterations: jax.Array  # [] int32


def weiszfeld(points: StackedParams, weights: jax.Array, *,
              max_iterations, tolerance, smoothing) -> tuple[Params,
                                                             jax.Array,
                                                             jax.Array]:
  """Smoothed Weiszfeld iterations for the weighted geometric median.

  Args:
    points: [K, ...] finite rows (padding rows may hold anything finite).
    weights: [K] alpha_k, summing to 1, 0 for padding rows.
    max_iterations, tolerance, smoothing: as in ``geometric_median``.

  Returns:
    (median, iterations used [] int32, final objective []).
  """
  live = weights > 0

  def evaluate(median):
    distances = tree_math.client_norms(tree_math.tree_sub(points, median))
    objective = jnp.sum(jnp.where(live, weights * distances, 0.0))
    return distances, objective

  def step(it):
    # Alg. 3: beta_k = alpha_k / max(nu, |z - w_k|).
    beta = jnp.where(live, weights / jnp.maximum(smoothing, it.distances),
                     0.0)
    median = tree_math.weighted_sum(
        points, tree_math.normalize_weights(beta, live.astype(beta.dtype)))
    distances, objective = evaluate(median)
    return _Iterate(median, distances, objective, it.objective,
                    it.iterations + 1)

  def going_on(it):
    settled = jnp.abs(it.previous - it.objective) <= tolerance * it.objective
    return (it.iterations < max_iterations) & ~settled

  start = tree_math.weighted_sum(points, weights)
  distances, objective = evaluate(start)
  last = jax.lax.while_loop(going_on, step, _Iterate(
      start, distances, objective, jnp.asarray(jnp.inf, objective.dtype),
      jnp.zeros((), jnp.int32)))
  return last.median, last.iterations, last.objective


def geometric_median(max_iterations: int = 10, tolerance: float = 1e-6,
                     smoothing: float = 1e-6) -> Aggregator:
  """RFA aggregator: the example-weighted geometric median.

  Args:
    max_iterations: most Weiszfeld steps (>= 1).
    tolerance: relative change of the objective that stops early (>= 0).
    smoothing: nu > 0, the smallest distance divided by (keeps a client
      at the current iterate from taking all the weight).

  Returns:
    An ``Aggregator``; metrics hold "gm_iterations" [] int32 and
    "gm_objective" [] (the weighted mean distance of the updates to the
    result).
  """
  checks.check_int("max_iterations", max_iterations, 1)
  checks.check_range("tolerance", tolerance, 0)
  checks.check_range("smoothing", smoothing, 0, low_open=True)

  def init(global_params):
    del global_params
    return GeometricMedianState()

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info)
    updates = tree_math.client_updates(client_params, global_params,
                                       info.mask)
    weights = tree_math.normalize_weights(
        info.num_examples.astype(jnp.float32), info.mask)
    median, iterations, objective = weiszfeld(
        updates, weights, max_iterations=max_iterations,
        tolerance=tolerance, smoothing=smoothing)
    new_global = tree_math.keep_if_no_clients(
        info.mask, tree_math.add_update(global_params, median),
        global_params)
    return new_global, state, {"gm_iterations": iterations,
                               "gm_objective": objective}

  return Aggregator(init, aggregate)
