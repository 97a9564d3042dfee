"""RFA: the geometric median of the client models (smoothed Weiszfeld).

Pillutla, Kakade and Harchaoui, "Robust Aggregation for Federated
Learning", IEEE Transactions on Signal Processing, 2022.

Over the m real participants (mask 1) with weights alpha_k = n_k / n:

  Eq. (4)   z* = argmin_z sum_k alpha_k |z - w_k|
  Alg. 3    beta_k = alpha_k / max(nu, |z - w_k|)          (nu: smoothing)
            z <- sum_k beta_k w_k / sum_k beta_k

starting from the weighted mean z_0 = sum_k alpha_k w_k and stopping after
``max_iterations`` steps or after the first step t with

  (a)       |z_t - z_{t-1}| <= tolerance |z_t|, or
  (b)       t a multiple of W = 10 and |z_t - z_{t-W}| <= R_t,
            R_t = 2 m eps sum_k b_k |w_k|,  b_k = beta_k / sum_j beta_j

(whole-model norms; m real participants, eps the float's machine epsilon),
whichever comes first. R_t bounds the rounding of one step: each
coordinate of z_t is a sum of m products, rounded by at most
gamma_m sum_k b_k |w_k[i]| (gamma_m ~ m eps) in any summation order, and
normalising the weights rounds about as much. In float32 the iterates do
not always settle on a fixed point: with another summation order (a GPU)
they can jitter by an ulp forever, so (a) with ``tolerance=0`` alone
(stop when a step leaves z exactly where it was) ran all 5,000 steps of a
test there. (b) stops once the net movement over W steps is within the
rounding of one: jitter does not accumulate over a window, while a slow
drift does (by sum_{j<W} rho^j >= 6.5 times its last step for a
contraction rho >= 0.9), so a slowly converging iterate runs on. With
``tolerance=0`` the loop therefore stops once z has converged to the
float's resolution, on every backend. The rule watches the iterate, not
the objective g(z) = sum_k alpha_k |z - w_k|: near the median g is flat
(its change is second order in the step), so in float32 it stops changing
while z is still far from converged.

Interpretations:
* Norms are whole-model (all leaves together). The iteration runs on the
  updates w_k - w_t (the median commutes with a common shift), whose
  magnitudes are small next to the weights, and the result is added to w_t.
* A cohort with no real participant leaves the model unchanged.

Breakdown point: 1/2 of the total weight alpha (the geometric median
stays bounded while the corrupted clients hold less than half of it).

Memory: the rule needs all K updates at once (stacked [K, ...] models, no
streaming form), a temporary of the same size per iteration, and two
models (the iterate and the window's anchor).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.types import Aggregator, empty_init, Params, StackedParams

__all__ = ["GeometricMedianState", "geometric_median", "weiszfeld"]


class GeometricMedianState(NamedTuple):
  """The geometric median keeps no state."""


# W: the window of the rounding stop (b) (module docstring).
SETTLE_WINDOW = 10


class _Iterate(NamedTuple):
  median: Params
  distances: jax.Array  # [K] |z - w_k|
  objective: jax.Array  # [] g(z)
  anchor: Params  # z at the start of the current window of W steps
  settled: jax.Array  # [] bool, stop (a) or (b) held after the last step
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
  num_real = jnp.sum(live).astype(jnp.float32)
  # The coarsest dtype among the leaves sets the rounding bound of (b); a
  # static Python float, known while tracing.
  eps = max(jnp.finfo(leaf.dtype).eps for leaf in jax.tree.leaves(points))
  point_norms = jnp.where(live, tree_math.client_norms(points), 0.0)

  def evaluate(median):
    distances = tree_math.client_norms(tree_math.tree_sub(points, median))
    objective = jnp.sum(jnp.where(live, weights * distances, 0.0))
    return distances, objective

  def step(it):
    # Alg. 3: beta_k = alpha_k / max(nu, |z - w_k|).
    beta = jnp.where(live, weights / jnp.maximum(smoothing, it.distances),
                     0.0)
    # If every beta underflows to 0 (all distances huge), normalize_weights
    # falls back to equal weights rather than dividing by 0.
    normalized = tree_math.normalize_weights(beta, live.astype(beta.dtype))
    median = tree_math.weighted_sum(points, normalized)
    distances, objective = evaluate(median)
    iterations = it.iterations + 1
    # (a) the caller's tolerance on the last step.
    movement = tree_math.tree_norm(tree_math.tree_sub(median, it.median))
    settled = movement <= tolerance * tree_math.tree_norm(median)
    # (b) no net movement beyond one step's rounding over the window.
    rounding = 2.0 * num_real * eps * jnp.sum(normalized * point_norms)
    window_end = iterations % SETTLE_WINDOW == 0
    drift = tree_math.tree_norm(tree_math.tree_sub(median, it.anchor))
    settled = settled | (window_end & (drift <= rounding))
    anchor = optax.tree.where(window_end, median, it.anchor)
    return _Iterate(median, distances, objective, anchor, settled,
                    iterations)

  def going_on(it):
    return (it.iterations < max_iterations) & ~it.settled

  start = tree_math.weighted_sum(points, weights)
  distances, objective = evaluate(start)
  last = jax.lax.while_loop(going_on, step, _Iterate(
      start, distances, objective, start, jnp.zeros((), bool),
      jnp.zeros((), jnp.int32)))
  return last.median, last.iterations, last.objective


def geometric_median(max_iterations: int = 10, tolerance: float = 1e-6,
                     smoothing: float = 1e-6) -> Aggregator:
  """RFA aggregator: the example-weighted geometric median.

  Args:
    max_iterations: most Weiszfeld steps (>= 1).
    tolerance: stop after a step that moves the iterate z by at most
      ``tolerance`` |z| (>= 0; 0: stop once z has converged to the
      float's resolution, see the module docstring).
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

  init = empty_init(GeometricMedianState)

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
