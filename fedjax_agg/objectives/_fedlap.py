"""FedLap's layer-wise regularised local objective.

Charteros, Koutsopoulos, "Lay Importance on the Layer: Federated Learning for
Non-IID data with Layer-based Regularization", 2023.

For each layer l and each row j of its kernel (the weights leaving neuron j,
``kernel_rows``):

  s_{l,j} = cos(w^k_{l,j}, w^g_{l,j})                  # Eqs. (5)-(6)
  lambda_{l,j} = 1 - s_{l,j}  in [0, 2]                # Eq. (7)
  d_{l,j} = ||w^k_{l,j} - w^g_{l,j}||^2                # Eq. (8)
  h_k(W) = l_k(W) + 1/2 sum_l <lambda_l, d_l>          # Eq. (10)

Interpretation choices (the paper leaves them open):

* lambda is computed at the start of each local epoch and held constant in it
  (Algorithm 1 line 16; no gradient flows through lambda); d is
  differentiated, so the gradient for row j is ``c_j (w_j - g_j)``.
  ``recompute="step"`` recomputes lambda at every step instead (still
  without gradient). With per-epoch lambda the first epoch starts at the
  global model, where every lambda is 0: for E = 1 FedLap is exactly FedAvg.
* Rows of a dense kernel [in, out] are its ``in`` rows; rows of a convolution
  kernel are chosen by ``conv_rows`` (default one row per input channel).
  Biases and other vector leaves are one row each when ``regularize_bias``,
  else not regularised (the paper's Eqs. 5-8 define rows of weight matrices
  only). BatchNorm statistics are never regularised.
* Two rows that are equal (both zero included) have s = 1; otherwise a zero
  row has s = 0 (no direction, ``tree_math.cosine``). Cosines are
  scale-safe (``tree_math.cosines``).
* The importance parameter q in [0, 1] (Sec. V-A: q = 0 is FedAvg, q = 1 is
  FedProx) moves the row coefficient c_j piecewise linearly from FedAvg
  through Eq. (10) to FedProx:
    c_j = 2 q lambda_j                                  for q <= 1/2,
    c_j = (2 - 2q) lambda_j + (2q - 1) mu               for q >  1/2,
  and the penalty is 1/2 sum_j c_j d_j. q = 0 gives exactly 0 (FedAvg),
  q = 1/2 (the paper's setting, our default) is Eq. (10), q = 1 is FedProx's
  (mu / 2) ||W - W^g||^2 over the regularised rows.

The server side is plain averaging, 1/|S_t| sum_k W^k (Algorithm 1 line 10):
``aggregators.fedavg(weighting="uniform")``.
"""

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.objectives._base import cross_entropy
from fedjax_agg.objectives._fedprox import trainable
from fedjax_agg.types import LocalObjective

RECOMPUTE = ("epoch", "step")
KERNEL_ROWS = ("in_channel", "patch", "out_channel")


def kernel_rows(leaf: jax.Array, conv_rows: str = "in_channel") -> jax.Array:
  """Views a kernel as a matrix of rows, one row per neuron. -> [R, D].

  Kernels follow flax's layout: the input axis is second to last, the output
  axis last. A dense kernel [in, out] gives its ``in`` rows (row j holds the
  weights leaving input neuron j). A convolution kernel [kh, kw, in, out]
  (any number of spatial axes) gives, by ``conv_rows``:

  * "in_channel": one row per input channel, [in, kh*kw*out] (the weights
    leaving feature map j, all spatial offsets);
  * "patch": one row per (kh, kw, in) patch element, [kh*kw*in, out] (the
    kernel as the dense matrix it is on im2col patches);
  * "out_channel": one row per filter, [out, kh*kw*in] (the weights entering
    output channel j).

  A vector (bias, normalisation scale) or scalar is one row.
  """
  checks.check_choice("conv_rows", conv_rows, KERNEL_ROWS)
  if leaf.ndim <= 1:
    return leaf.reshape(1, -1)
  if leaf.ndim == 2 or conv_rows == "patch":
    return leaf.reshape(-1, leaf.shape[-1])
  axis = -2 if conv_rows == "in_channel" else -1
  moved = jnp.moveaxis(leaf, axis, 0)
  return moved.reshape(moved.shape[0], -1)


def _regularised(params, regularize_bias: bool):
  """The leaves FedLap regularises, in a fixed order."""
  return [leaf for leaf in jax.tree.leaves(trainable(params))
          if leaf.ndim >= 2 or regularize_bias]


def row_dissimilarities(params, global_params, *, conv_rows="in_channel",
                        regularize_bias=False) -> list[jax.Array]:
  """lambda_{l,j} = 1 - cos(w^k_{l,j}, w^g_{l,j}) per regularised leaf.

  Returns:
    One [R_leaf] array per regularised leaf (Eq. 7), values in [0, 2].
  """
  out = []
  for local, glob in zip(_regularised(params, regularize_bias),
                         _regularised(global_params, regularize_bias),
                         strict=True):
    local = kernel_rows(local, conv_rows)
    glob = kernel_rows(glob, conv_rows)
    # Equal rows get exactly 1, not a rounded cosine: at the global model
    # every lambda is then exactly 0, so FedLap with E = 1 is FedAvg.
    same = jnp.all(local == glob, axis=-1)
    cos = jnp.where(same, 1.0, tree_math.cosines(local, glob))
    out.append(1.0 - cos)
  return out


def row_distances(params, global_params, *, conv_rows="in_channel",
                  regularize_bias=False) -> list[jax.Array]:
  """d_{l,j} = ||w^k_{l,j} - w^g_{l,j}||^2 per regularised leaf (Eq. 8)."""
  return [
      jnp.sum(jnp.square(kernel_rows(local - glob, conv_rows)), -1)
      for local, glob in zip(_regularised(params, regularize_bias),
                             _regularised(global_params, regularize_bias),
                             strict=True)]


def fedlap(q: float = 0.5, *, mu: float = 1.0, conv_rows: str = "in_channel",
           regularize_bias: bool = False, recompute: str = "epoch"
           ) -> LocalObjective:
  """FedLap local objective.

  Args:
    q: importance parameter in [0, 1] (see the module docstring): 0 is
      FedAvg, 0.5 is Eq. (10), 1 is FedProx with coefficient ``mu``.
    mu: FedProx's coefficient reached at q = 1 (unused for q <= 0.5).
    conv_rows: rows of a convolution kernel, one of
      ``KERNEL_ROWS`` ("in_channel", "patch", "out_channel").
    regularize_bias: also regularise vector leaves (biases), one row each.
    recompute: "epoch" (Algorithm 1: lambda fixed within a local epoch) or
      "step" (lambda recomputed, without gradient, at every step).

  Returns:
    A ``LocalObjective`` whose context is the list of per-row lambdas.
  """
  checks.check_range("q", q, 0, 1)
  checks.check_range("mu", mu, 0)
  checks.check_choice("conv_rows", conv_rows, KERNEL_ROWS)
  checks.check_bool("regularize_bias", regularize_bias)
  checks.check_choice("recompute", recompute, RECOMPUTE)
  if not checks.is_traced(q) and q == 0.0:
    # Exactly FedAvg's local training: the same computation, not a zero
    # penalty added to it (which could round differently once compiled).
    return cross_entropy()
  rows = dict(conv_rows=conv_rows, regularize_bias=regularize_bias)
  # A traced q cannot drive Python's min and max; the concrete case keeps
  # plain floats, constants folded into the compiled step.
  if checks.is_traced(q) or checks.is_traced(mu):  # inside a sweep
    lap_weight = jnp.minimum(2.0 * q, 2.0 - 2.0 * q)
    prox_weight = jnp.maximum(2.0 * q - 1.0, 0.0) * mu
  else:
    lap_weight = min(2.0 * q, 2.0 - 2.0 * q)
    prox_weight = max(2.0 * q - 1.0, 0.0) * mu

  def prepare(params, global_params):
    if recompute == "step":
      return ()
    return row_dissimilarities(params, global_params, **rows)

  def penalty(params, global_params, context):
    # lambda enters as a fixed weight (Algorithm 1): the gradient flows
    # through d only, as in the per-epoch case.
    if recompute == "step":
      context = jax.lax.stop_gradient(
          row_dissimilarities(params, global_params, **rows))
    distances = row_distances(params, global_params, **rows)
    total = jnp.zeros(())
    for lam, dist in zip(context, distances, strict=True):
      coefficient = lap_weight * lam + prox_weight  # c_j
      total = total + jnp.sum(coefficient * dist)
    return 0.5 * total  # Eq. (10)

  # No proximal_mu: the penalty is not FedProx's (except at q = 1), so a
  # rule that needs the solver's normaliser (FedNova) refuses it.
  return LocalObjective(prepare, penalty)
