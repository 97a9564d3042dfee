"""Centered clipping: updates clipped around the previous aggregate.

Karimireddy, He and Jaggi, "Learning from History for Byzantine Robust
Optimization", ICML 2021.

With the m real participants' updates dw_k = w_k - w_t (mask 1):

  Eq. (CC)  v <- v + (1/m) sum_k (dw_k - v) min(1, tau / |dw_k - v|)

iterated L = ``num_iterations`` times from v = the previous round's
aggregated update (zeros before the first round), then w_{t+1} = w_t + v.

Interpretations:
* The paper clips worker momenta and starts from the previous aggregate of
  those momenta; here the clients send models, so the rule clips their
  updates and starts from the previous round's aggregated update, kept in
  the state. Worker momentum (the paper's full method) is out of scope.
* Norms are whole-model (all leaves together). The mean is unweighted
  (number of examples unused), as in the paper.
* A cohort with no real participant leaves model and state unchanged.

Breakdown point: the paper's analysis covers a Byzantine fraction delta of
up to about 0.1 (with worker momentum); each attacker moves v by at most
tau / m per iteration, whatever it sends.

Memory: the rule needs all K updates at once (stacked [K, ...] models, no
streaming form), plus one model in the state.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.types import Aggregator, Params, StackedParams

__all__ = ["CenteredClippingState", "centered_clip", "centered_clipping"]


class CenteredClippingState(NamedTuple):
  """The previous round's aggregated update v (a tree like the params)."""
  previous_update: Params


def centered_clip(updates: StackedParams, mask: jax.Array, center: Params,
                  radius, num_iterations) -> tuple[Params, jax.Array]:
  """Iterates Eq. (CC) from ``center``; returns (v, fraction clipped in the
  last iteration). Padding rows (mask 0) of ``updates`` must be finite."""
  real = mask > 0
  weights = jnp.where(real, 1.0, 0.0) / jnp.maximum(jnp.sum(real), 1)

  def step(_, carry):
    center, _ = carry
    offsets = tree_math.tree_sub(updates, center)  # dw_k - v, [K, ...]
    distances = tree_math.client_norms(offsets)
    scale = tree_math.clip_scale(distances, radius)
    moved = tree_math.weighted_sum(offsets, weights * scale)
    # The weights are 1/m, so their sum over the clipped rows is the
    # fraction; only the last iteration's survives the loop.
    clipped = jnp.sum(jnp.where(real & (scale < 1.0), weights, 0.0))
    return tree_math.add_update(center, moved), clipped

  return jax.lax.fori_loop(0, num_iterations, step,
                           (center, jnp.zeros((), jnp.float32)))


def centered_clipping(radius: float = 10.0,
                      num_iterations: int = 1) -> Aggregator:
  """Centered-clipping aggregator.

  Args:
    radius: tau > 0, the clipping radius around the current centre.
    num_iterations: L >= 1, clipping steps per round.

  Returns:
    An ``Aggregator``; metrics hold "fraction_clipped" [], the share of
    real clients clipped in the last iteration.
  """
  checks.check_range("radius", radius, 0, low_open=True)
  checks.check_int("num_iterations", num_iterations, 1)

  def init(global_params):
    return CenteredClippingState(jax.tree.map(jnp.zeros_like, global_params))

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=False)
    updates = tree_math.client_updates(client_params, global_params,
                                       info.mask)
    update, clipped = centered_clip(updates, info.mask,
                                    state.previous_update, radius,
                                    num_iterations)
    # With no client the iteration leaves v at the last round's update, and
    # w_t + v would repeat that step; an empty round keeps both instead.
    new_global, new_state = tree_math.keep_if_no_clients(
        info.mask,
        (tree_math.add_update(global_params, update),
         CenteredClippingState(update)),
        (global_params, state))
    return new_global, new_state, {"fraction_clipped": clipped}

  return Aggregator(init, aggregate)
