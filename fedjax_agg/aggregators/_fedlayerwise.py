"""FedLayerWise: FedAdp's adaptive weighting applied layer by layer.

Lanjewar, Tran and Tran, "Layer-Wise Adaptive Weighting for Faster
Convergence in Federated Learning" (Eqs. (1)-(7)).

For every layer l and real participant k (mask 1), p_k = n_k / sum_j n_j:

  Eq. (3)  g_{k,l} = (w_l(t-1) - w_{k,l}(t)) / eta
  Eq. (2)  g_l = sum_k p_k g_{k,l}
  Eq. (1)  theta_{k,l} = arccos(<g_l, g_{k,l}> / (|g_l| |g_{k,l}|))
  Eq. (4)  theta~_{k,l}(t) = (t-1)/t theta~_{k,l}(t-1) + theta_{k,l}(t)/t
  Eq. (5)  f_{k,l} = alpha (1 - exp(-exp(-alpha (theta~_{k,l} - 1))))
  Eq. (6)  psi_{k,l} = n_k e^{f_{k,l}} / sum_j n_j e^{f_{j,l}}
  Eq. (7)  w_l(t) = sum_k psi_{k,l} w_{k,l}(t)

Layers. ``granularity="layer"`` groups the leaves under one parent node
(a flax module's kernel and bias form one layer, as the paper's "layer of
neurons"); ``"leaf"`` treats every array as its own layer
(``tree_math.layer_structure``).

Interpretations are FedAdp's (``fedadp`` module docstring): what t counts
(``smoothing``), pi/2 for a zero-norm layer update, eta cancelling, an empty
cohort leaving model and state unchanged. The smoothed angles are kept per
client and per layer, [N, L].
"""

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg import tree_math
from fedjax_agg.aggregators._fedadp import angle_weighting
from fedjax_agg.aggregators._fedadp import check_hyperparameters
from fedjax_agg.aggregators._fedadp import FedAdpState
from fedjax_agg.types import Aggregator, Params, StackedParams

GRANULARITIES = ("layer", "leaf")


def layer_weighted_sum(stacked: StackedParams, weights: jax.Array,
                       structure: tree_math.LayerStructure) -> Params:
  """Eq. (7): a leaf of layer l is sum_k weights[k, l] stacked[k].

  Args:
    stacked: tree with leaves [K, ...].
    weights: [K, L] client weights per layer (rows of weight 0 skipped,
      ``tree_math.weighted_leaf_sum``).
    structure: the layer grouping of the tree.
  """
  leaves, treedef = jax.tree.flatten(stacked)
  return jax.tree.unflatten(treedef, [
      tree_math.weighted_leaf_sum(leaf, weights[:, layer])
      for leaf, layer in zip(leaves, structure.leaf_to_layer, strict=True)])


@run_context.derived_from_run(num_clients="num_clients",
                              learning_rate="learning_rate")
def fedlayerwise(alpha: float = 5.0, *, num_clients: int,
                 granularity: str = "layer", learning_rate: float = 1.0,
                 smoothing: str = "participation",
                 weighting: str = "num_examples") -> Aggregator:
  """FedLayerWise aggregator.

  Args:
    alpha: Gompertz constant of Eq. (5) (the paper uses 5).
    num_clients: N, the federation size; client ids are in [0, N).
    granularity: "layer" (kernel and bias of a module together) or "leaf".
    learning_rate: eta of Eq. (3); cancels in the angles.
    smoothing: what t counts in Eq. (4): "participation" (default) or
      "round".
    weighting: "num_examples" (n_k, the paper) or "uniform".

  Returns:
    An ``Aggregator`` whose state is a ``FedAdpState`` (fedadp module) with
    ``smoothed_angle`` [N, L]; metrics: "layer_weights" [K, L] (psi; each
    column sums to 1 over the real clients), "angles" [K, L] and
    "smoothed_angles" [K, L] in radians. Layer l is
    ``tree_math.layer_structure(params, granularity).names[l]``.
  """
  checks.check_choice("granularity", granularity, GRANULARITIES)
  check_hyperparameters(alpha, learning_rate, num_clients, smoothing,
                        weighting)

  def init(global_params):
    structure = tree_math.layer_structure(global_params, granularity)
    return FedAdpState(
        jnp.zeros((num_clients, structure.num_layers), jnp.float32),
        jnp.zeros((num_clients,), jnp.int32))

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        num_clients=num_clients,
                        uses_num_examples=weighting == "num_examples")
    structure = tree_math.layer_structure(global_params, granularity)
    if state.smoothed_angle.shape != (num_clients, structure.num_layers):
      raise ValueError(
          "state.smoothed_angle must have shape [num_clients, num_layers] = "
          f"{(num_clients, structure.num_layers)}, got "
          f"{state.smoothed_angle.shape}")
    weights, angles, smoothed, new_state = angle_weighting(
        global_params, client_params, info, state, structure, alpha=alpha,
        learning_rate=learning_rate, smoothing=smoothing,
        weighting=weighting)  # Eqs. (1)-(6)
    new_global = layer_weighted_sum(client_params, weights,
                                    structure)  # Eq. (7)
    new_global = tree_math.keep_if_no_clients(info.mask, new_global,
                                              global_params)
    metrics = {"layer_weights": weights, "angles": angles,
               "smoothed_angles": smoothed}
    return new_global, new_state, metrics

  return Aggregator(init, aggregate)
