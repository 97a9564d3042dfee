"""FedNNNN: norm-normalized aggregation with server momentum.

Nagura, Bian and Sato, "FedNNNN: Norm-Normalized Neural Network Aggregation
for Fast and Accurate Federated Learning", 2021.

Round t+1 over the real participants k (mask 1), p_k = n_k / n:

  Eq. (2)  dw_k = w^k_{t+1} - w_t
  Eq. (4)  N = |sum_k p_k dw_k|
  Eq. (5)  E = sum_k p_k |dw_k|                 (N <= E, Proposition 1)
  Eq. (12) d_{t+1} = gamma d_t + beta (E / N) sum_k p_k dw_k,  d_0 = 0
  Eq. (13) w_{t+1} = w_t + d_{t+1}

Variants of Table 2: ``norm_norm`` is Eq. (8) (gamma = 0, so
|w_{t+1} - w_t| = beta E, Eq. (9)); ``momentum`` is Eqs. (10)-(11) (no
normalization: d_{t+1} = gamma d_t + sum_k p_k dw_k).

Protocol (Sec. 4.1). The normalized model w_{t+1} is what the server
broadcasts; the paper evaluates a separate average-aggregated model
w_t + sum_k p_k dw_k (FedAvg, Eq. (3)). The state keeps the evaluated model
in ``eval_params`` (``evaluate="average"``, the paper, or ``"broadcast"``);
read it with ``fedjax_agg.aggregators.eval_params(state, new_global)``.

Interpretations:
* When N <= ``min_norm`` (0 or close to 0) the update is not normalized and
  w_t is returned as is (Sec. 4.2); the momentum d is kept unchanged too, so
  the round is a no-op for the broadcast model.
* Weights p_k: n_k / n in the equations (``weighting="num_examples"``); the
  experiments set p_k = 1/m (``weighting="uniform"``).
* A cohort with no real participant leaves model and state unchanged.
* Norms are scale-safe (``tree_math.SumOfSquares``): updates of magnitude
  1e20 do not overflow their squares; rows with mask 0 are never read.
* BatchNorm running statistics (the ``batch_stats`` collection) are model
  state, not parameters: no gradient produced them, so with
  ``statistics="average"`` (the default) they are left out of N and E and
  of the momentum, and the server takes their plain average,
  w_t + sum_k p_k dw_k (Eq. (3)); ``statistics="normalize"`` treats them
  like any parameter (scaled by beta E / N and carried by the momentum).
  Models without BatchNorm are unaffected.

Streaming form: N and E are sums over clients, so a round can stream the
running sums of n_k dw_k, n_k |dw_k|_l per layer and n_k |dw_k| (plus the
counts, ``tree_math.MaskedSums``) instead of holding K client models.

NWDA metrics (Sec. 3.1, appendix Eqs. (24)-(25)): N and E of Eqs. (4)-(5)
and the server update norm |w_{t+1} - w_t| of Eq. (24), for the whole model
and per layer (``tree_math.layer_structure(params, granularity).names``).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg import update_stats
from fedjax_agg.aggregators._fedavg import client_weights
from fedjax_agg.aggregators._fedavg import raw_client_weight
from fedjax_agg.aggregators._fedavg import WEIGHTINGS
from fedjax_agg.types import Aggregator, Params, StreamingForm

EVALUATES = ("average", "broadcast")
STATISTICS = ("average", "normalize")
GRANULARITIES = ("layer", "leaf")


class FedNNNNState(NamedTuple):
  """FedNNNN's server state.

  Attributes:
    momentum: d_t, same tree as the params (zeros at init).
    eval_params: the model to evaluate after the round (the average-
      aggregated model by default; the init params before any round).
  """
  momentum: Params
  eval_params: Params


# N at or below this counts as "close to 0" (Sec. 4.2) by default.
MIN_NORM = 1e-12


def fednnnn(beta: float = 0.7, gamma: float = 0.8, *,
            weighting: str = "num_examples", normalize: bool = True,
            evaluate: str = "average", granularity: str = "layer",
            min_norm: float = MIN_NORM,
            statistics: str = "average") -> Aggregator:
  """FedNNNN aggregator (Eqs. (12)-(13)).

  Args:
    beta: norm scale of Eq. (12) (Table 5 uses 0.6-0.8).
    gamma: server momentum of Eq. (12) (Table 5 uses 0.6-0.8).
    weighting: "num_examples" (p_k = n_k / n) or "uniform" (p_k = 1/m).
    normalize: scale the average update by beta E / N (False gives the
      ``momentum`` variant, Eqs. (10)-(11), where beta is unused).
    evaluate: which model ``eval_params`` holds: "average" (FedAvg of the
      clients, the paper's evaluated model) or "broadcast" (w_{t+1}).
    granularity: layer grouping of the per-layer metrics.
    min_norm: N at or below this is "close to 0" (no update).
    statistics: BatchNorm statistics: "average" (plain FedAvg, outside N,
      E and the momentum) or "normalize" (like parameters); see the
      module docstring.

  Returns:
    An ``Aggregator`` with ``FedNNNNState``; metrics: "N", "E",
    "server_update_norm" (Eq. (24)), "layer_N", "layer_E",
    "layer_server_update_norm" ([L] each), "norm_scale" (beta E / N, 1
    without normalization, 0 for a skipped round) and "client_weights" [K].
  """
  for name, value in (("beta", beta), ("gamma", gamma),
                      ("min_norm", min_norm)):
    checks.check_range(name, value, 0)
  checks.check_choice("weighting", weighting, WEIGHTINGS)
  checks.check_bool("normalize", normalize)
  checks.check_choice("evaluate", evaluate, EVALUATES)
  checks.check_choice("granularity", granularity, GRANULARITIES)
  checks.check_choice("statistics", statistics, STATISTICS)

  def stat_flags(tree) -> list[bool]:
    """Per leaf: a statistic averaged apart (none with "normalize")."""
    flags = jax.tree.leaves(tree_math.select_leaves(
        tree, tree_math.is_statistic))
    return flags if statistics == "average" else [False] * len(flags)

  def split(tree, reference):
    """(``tree`` with its statistics replaced by ``reference``'s, so that
    their updates are zero; the statistics' leaves of ``tree``)."""
    flags = stat_flags(reference)
    if not any(flags):
      return tree, []
    leaves, treedef = jax.tree.flatten(tree)
    # A statistic takes the reference's value (broadcast over a stacked
    # client axis), so its update is exactly 0 and adds nothing to N or E.
    kept = [jnp.broadcast_to(ref, leaf.shape) if flag else leaf
            for leaf, ref, flag in zip(leaves, jax.tree.leaves(reference),
                                       flags, strict=True)]
    stats = [leaf for leaf, flag in zip(leaves, flags, strict=True) if flag]
    return jax.tree.unflatten(treedef, kept), stats

  def with_statistics(tree, stats):
    """``tree`` with its statistics' leaves replaced by ``stats``."""
    leaves, treedef = jax.tree.flatten(tree)
    replacements = iter(stats)
    return jax.tree.unflatten(treedef, [
        next(replacements) if flag else leaf
        for leaf, flag in zip(leaves, stat_flags(tree), strict=True)])

  def init(global_params):
    return FedNNNNState(jax.tree.map(jnp.zeros_like, global_params),
                        global_params)

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=weighting == "num_examples")
    structure = tree_math.layer_structure(global_params, granularity)
    weights = client_weights(info, weighting)
    # Eq. (2): dw_k = w^k_{t+1} - w_t, summed with p_k and squared (the
    # statistics' dw_k are zero here and averaged apart).
    trainable, client_stats_leaves = split(client_params, global_params)
    moments = update_stats.update_moments(trainable, global_params, weights,
                                          info.mask)
    client_layer_norms = tree_math.layer_sums_of_squares(
        moments.squares, structure).norm()
    layer_e = jnp.matmul(weights, client_layer_norms,  # Eq. (5)
                         precision=tree_math.FULL)
    # Each |dw_k| is the norm of its layer norms: the squares are read once,
    # in update_moments, for both Eq. (5) per layer and the whole model.
    e = jnp.matmul(weights, tree_math.vector_norm(client_layer_norms, axis=1),
                   precision=tree_math.FULL)
    _, global_stats = split(global_params, global_params)
    stat_means = [tree_math.weighted_leaf_sum(leaf - g[None], weights)
                  for leaf, g in zip(client_stats_leaves, global_stats,
                                     strict=True)]
    return server_update(global_params, state, info, weights,
                         (moments.weighted_sum, layer_e, e, stat_means))

  def client_stats(global_params, client_params, info_k):
    # One client's dw_k (Eq. (2)) and its norms, summed with raw weights.
    # Here the tree is already an update, so the reference for the
    # statistics is zeros: their dw_k leave N and E and travel apart.
    delta, stat_delta = split(tree_math.tree_sub(client_params,
                                                 global_params),
                              jax.tree.map(jnp.zeros_like, global_params))
    layer_norms = tree_math.layer_norms(
        delta, tree_math.layer_structure(global_params, granularity))
    norm = tree_math.vector_norm(layer_norms)
    return tree_math.client_sums((delta, layer_norms, norm, stat_delta),
                                 info_k.mask,
                                 raw_client_weight(info_k, weighting))

  def finalize(global_params, summed_stats, info, state):
    # sum_k p_k dw_k, and Eq. (5) per layer and for the whole model.
    moments = tree_math.mean_from_sums(summed_stats)
    return server_update(global_params, state, info,
                         client_weights(info, weighting), moments)

  def server_update(global_params, state, info, weights, moments):
    mean_delta, layer_e, e, stat_means = moments
    structure = tree_math.layer_structure(global_params, granularity)
    layer_n = tree_math.layer_norms(mean_delta, structure)  # Eq. (4)
    n = tree_math.vector_norm(layer_n)
    # The inner where keeps the discarded branch from dividing by N = 0
    # (jnp.where computes both sides); a skipped round reports scale 0.
    if normalize:
      skip = n <= min_norm
      scale = jnp.where(skip, 0.0, beta * e / jnp.where(skip, 1.0, n))
    else:
      skip = jnp.zeros((), bool)
      scale = jnp.ones(())
    momentum = jax.tree.map(
        lambda d, u: (gamma * d + scale * u).astype(d.dtype),
        state.momentum, mean_delta)  # Eq. (12)
    momentum = optax.tree.where(skip, state.momentum, momentum)
    new_global = tree_math.add_update(global_params, momentum)  # Eq. (13)
    new_global = optax.tree.where(skip, global_params, new_global)
    average = tree_math.add_update(global_params, mean_delta)  # Eq. (3)
    if stat_means:  # the statistics: their plain average, every round
      _, stats = split(global_params, global_params)
      averaged = [(g + d).astype(g.dtype)
                  for g, d in zip(stats, stat_means, strict=True)]
      new_global = with_statistics(new_global, averaged)
      average = with_statistics(average, averaged)
    new_state = FedNNNNState(
        momentum, average if evaluate == "average" else new_global)
    # The metrics below are taken from the kept model, so an empty round
    # reports a server update of norm 0.
    new_global, new_state = tree_math.keep_if_no_clients(
        info.mask, (new_global, new_state), (global_params, state))
    server_update = tree_math.tree_sub(new_global, global_params)
    layer_update = tree_math.layer_norms(server_update, structure)
    metrics = {
        "N": n, "E": e,
        "server_update_norm": tree_math.vector_norm(layer_update),
        "layer_N": layer_n, "layer_E": layer_e,
        "layer_server_update_norm": layer_update,
        "norm_scale": scale, "client_weights": weights,
    }
    return new_global, new_state, metrics

  return Aggregator(init, aggregate, StreamingForm(client_stats, finalize))


def norm_norm(beta: float = 1.0, **kwargs) -> Aggregator:
  """Norm-Norm of Table 2: Eq. (8), FedNNNN with gamma = 0.

  Args:
    beta: norm scale (Table 5 uses 0.6-1.1).
    **kwargs: the other keyword arguments of ``fednnnn``.
  """
  return fednnnn(beta, 0.0, **kwargs)


def momentum(gamma: float = 0.9, **kwargs) -> Aggregator:
  """Momentum of Table 2: Eqs. (10)-(11), server momentum, no normalization.

  Args:
    gamma: server momentum (Table 5 uses 0.7-0.9).
    **kwargs: the other keyword arguments of ``fednnnn``.
  """
  return fednnnn(1.0, gamma, normalize=False, **kwargs)
