"""FedAdp: client weights from the angle between local and global gradients.

Wu and Wang, "Fast-Convergent Federated Learning with Adaptive Weighting",
IEEE Transactions on Cognitive Communications and Networking 7(4), 2021.
Equation numbers below follow the restatement in Lanjewar, Tran and Tran,
"Layer-Wise Adaptive Weighting for Faster Convergence in Federated Learning"
(FedLayerWise), Eqs. (1)-(7), with the whole model taken as a single layer.

Per round t, over the real participants k (mask 1) with weights p_k = n_k /
sum_j n_j:

  Eq. (3)  g_k = (w(t-1) - w_k(t)) / eta       client "gradient"
  Eq. (2)  g = sum_k p_k g_k                   global gradient
  Eq. (1)  theta_k = arccos(<g, g_k> / (|g| |g_k|))
  Eq. (4)  smoothed theta~_k(t) = (t-1)/t theta~_k(t-1) + theta_k(t)/t
  Eq. (5)  f_k = alpha (1 - exp(-exp(-alpha (theta~_k - 1))))   (Gompertz)
  Eq. (6)  psi_k = n_k e^{f_k} / sum_j n_j e^{f_j}
  Eq. (7)  w(t) = sum_k psi_k w_k(t)

Interpretations:
* ``t`` in Eq. (4). The paper writes the round index; under partial
  participation a client's previous smoothed angle is from the last round it
  took part in. ``smoothing="participation"`` (default) takes t = the number
  of rounds this client has taken part in, this one included, so theta~ is
  the running mean of the client's own angles. ``smoothing="round"`` takes
  t = the global round (``info.round``). Both use theta~ = theta on a
  client's first participation (Eq. (4) at t = 1), and coincide when every
  client takes part in every round (the setting of both papers).
* eta only rescales every g_k and g, so it cancels in Eq. (1); it is kept as
  ``learning_rate`` for fidelity.
* A zero update (g_k = 0) or a zero global gradient has no direction; its
  angle is pi/2 by convention (``tree_math.cosine``), never NaN. Angles are
  scale-safe: updates of any finite magnitude (1e-30 or 1e38) give the
  angles of the same updates at magnitude 1 (``update_stats``).
* Rows with mask 0 are never read (NaN there changes nothing); a real row
  whose client id is outside [0, N) raises when the cohort is concrete
  (outside jit) and, under jit, counts as a first participation and
  updates no client's state (``tree_math.scatter_clients``).
* Angles are taken over every leaf of the params tree given to the rule.
* A cohort with no real participant leaves the model and the state
  unchanged.

The angle/weight machinery is shared with FedLayerWise, which runs it per
layer.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg import tree_math
from fedjax_agg import update_stats
from fedjax_agg.aggregators._fedavg import client_weights
from fedjax_agg.aggregators._fedavg import WEIGHTINGS
from fedjax_agg.types import Aggregator, ClientInfo, Params, StackedParams

SMOOTHINGS = ("participation", "round")


class FedAdpState(NamedTuple):
  """Per-client smoothed angles, indexed by client id.

  Attributes:
    smoothed_angle: [N] (FedAdp) or [N, L] (FedLayerWise) radians.
    times_seen: [N] int32, rounds each client has taken part in.
  """
  smoothed_angle: jax.Array
  times_seen: jax.Array


def gompertz(smoothed_angle: jax.Array, alpha: float) -> jax.Array:
  """Eq. (5): alpha (1 - exp(-exp(-alpha (theta - 1)))), decreasing."""
  return alpha * (1.0 - jnp.exp(-jnp.exp(-alpha * (smoothed_angle - 1.0))))


def smooth_angles(previous: jax.Array, angle: jax.Array, count: jax.Array,
                  first: jax.Array) -> jax.Array:
  """Eq. (4) on [K, L] angles; ``count`` ([K]) is t, ``first`` [K] bool."""
  # The floor at 1 only keeps the discarded branch finite: a first
  # participation takes the angle itself (Eq. (4) at t = 1).
  t = jnp.maximum(count, 1).astype(angle.dtype)[:, None]
  running = (t - 1.0) / t * previous + angle / t
  return jnp.where(first[:, None], angle, running)


def adaptive_weights(contribution: jax.Array, prior: jax.Array,
                     mask: jax.Array) -> jax.Array:
  """Eq. (6) per column: psi[k, l] ~ prior[k] exp(f[k, l]), masked.

  Args:
    contribution: [K, L] Gompertz values f.
    prior: [K] data weights (n_k, or p_k; only ratios matter).
    mask: [K].

  Returns:
    [K, L]; every column sums to 1 over the real clients.
  """
  # f >= 0, so subtracting the largest real f per column keeps exp <= 1.
  largest = jnp.max(jnp.where(mask[:, None] > 0, contribution, 0.0), axis=0)
  raw = prior[:, None] * jnp.exp(contribution - largest[None, :])
  return jax.vmap(tree_math.normalize_weights, in_axes=(1, None),
                  out_axes=1)(raw, mask)


def angle_weighting(global_params: Params, client_params: StackedParams,
                    info: ClientInfo, state: FedAdpState,
                    structure: tree_math.LayerStructure, *, alpha: float,
                    learning_rate: float, smoothing: str, weighting: str):
  """Eqs. (1)-(6) per layer of ``structure``.

  Args:
    global_params: w(t-1).
    client_params: [K, ...] w_k(t).
    info: the cohort.
    state: ``FedAdpState`` with ``smoothed_angle`` [N, L].
    structure: the layer grouping (one layer for FedAdp).
    alpha: Gompertz constant.
    learning_rate: eta of Eq. (3).
    smoothing: "participation" or "round" (module docstring).
    weighting: "num_examples" or "uniform" data weights p_k.

  Returns:
    ``(weights, angles, smoothed, new_state)``: [K, L] psi of Eq. (6),
    instantaneous and smoothed angles, and the updated state.
  """
  # With u_k = w_k(t) - w(t-1), Eq. (3) is g_k = -u_k / eta and Eq. (2)
  # g = -sum_k p_k u_k / eta; eta > 0 cancels in the cosine of Eq. (1).
  del learning_rate
  prior = client_weights(info, weighting)
  moments = update_stats.update_moments(client_params, global_params, prior,
                                        info.mask)
  angles = jnp.arccos(update_stats.update_cosines(
      client_params, global_params, moments.weighted_sum, moments.squares,
      structure, info.mask))  # Eq. (1)
  seen = tree_math.gather_clients(state.times_seen, info.client_ids, 0)
  count = seen + 1 if smoothing == "participation" else jnp.broadcast_to(
      info.round, seen.shape)
  previous = tree_math.gather_clients(state.smoothed_angle, info.client_ids,
                                      0.0)
  # An id outside [0, N) reads times_seen 0 (gather_clients' fill), so it
  # counts as a first participation, as the module docstring states.
  smoothed = smooth_angles(previous, angles, count, seen == 0)  # Eq. (4)
  weights = adaptive_weights(gompertz(smoothed, alpha), prior,
                             info.mask)  # Eqs. (5), (6)
  new_state = FedAdpState(
      tree_math.scatter_clients(state.smoothed_angle, info.client_ids,
                                info.mask, smoothed),
      tree_math.scatter_clients(state.times_seen, info.client_ids,
                                info.mask, seen + 1))
  return weights, angles, smoothed, new_state


def check_hyperparameters(alpha, learning_rate, num_clients, smoothing,
                          weighting) -> None:
  """Raises ValueError/TypeError naming the first bad argument.

  Traced ``alpha`` and ``learning_rate`` (a sweep) pass unchecked.
  """
  checks.check_range("alpha", alpha, 0, low_open=True)
  checks.check_range("learning_rate", learning_rate, 0, low_open=True)
  checks.check_int("num_clients", num_clients, 1)
  checks.check_choice("smoothing", smoothing, SMOOTHINGS)
  checks.check_choice("weighting", weighting, WEIGHTINGS)


@run_context.derived_from_run(num_clients="num_clients",
                              learning_rate="learning_rate")
def fedadp(alpha: float = 5.0, *, num_clients: int,
           learning_rate: float = 1.0, smoothing: str = "participation",
           weighting: str = "num_examples") -> Aggregator:
  """FedAdp aggregator.

  Args:
    alpha: Gompertz constant of Eq. (5) (the paper uses 5).
    num_clients: N, the federation size; client ids are in [0, N).
    learning_rate: eta of Eq. (3); cancels in the angle.
    smoothing: what t counts in Eq. (4): "participation" (default) or
      "round" (see the module docstring).
    weighting: "num_examples" (n_k, the paper) or "uniform".

  Returns:
    An ``Aggregator`` whose state is a ``FedAdpState`` with
    ``smoothed_angle`` [N]; metrics: "client_weights" [K] (psi),
    "angles" [K] and "smoothed_angles" [K] in radians.
  """
  check_hyperparameters(alpha, learning_rate, num_clients, smoothing,
                        weighting)

  def init(global_params):
    del global_params
    return FedAdpState(jnp.zeros((num_clients,), jnp.float32),
                       jnp.zeros((num_clients,), jnp.int32))

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        num_clients=num_clients,
                        uses_num_examples=weighting == "num_examples")
    structure = tree_math.single_layer_structure(global_params)
    # FedAdp is the one-layer case of the shared per-layer code: its [N]
    # state is viewed as [N, 1] and squeezed back afterwards.
    layer_state = FedAdpState(state.smoothed_angle[:, None],
                              state.times_seen)
    weights, angles, smoothed, layer_state = angle_weighting(
        global_params, client_params, info, layer_state, structure,
        alpha=alpha, learning_rate=learning_rate, smoothing=smoothing,
        weighting=weighting)
    new_global = tree_math.weighted_sum(client_params,
                                        weights[:, 0])  # Eq. (7)
    new_state = FedAdpState(layer_state.smoothed_angle[:, 0],
                            layer_state.times_seen)
    # The state needs no such guard: scatter_clients writes real rows only,
    # so an empty cohort changes no client's entry.
    new_global = tree_math.keep_if_no_clients(info.mask, new_global,
                                              global_params)
    metrics = {"client_weights": weights[:, 0], "angles": angles[:, 0],
               "smoothed_angles": smoothed[:, 0]}
    return new_global, new_state, metrics

  return Aggregator(init, aggregate)
