"""Krum and Multi-Krum: the updates closest to their nearest neighbours.

Blanchard, El Mhamdi, Guerraoui and Stainer, "Machine Learning with
Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017.

Over the m real participants (mask 1), with f = ``num_byzantine``:

  Sec. 4   s(k) = sum_{j in N_k} |w_k - w_j|^2, N_k the n nearest other
           real participants of k, n = m - f - 2
  Sec. 4   Krum: the model of lowest score; Multi-Krum: the mean of the
           ``num_selected`` models of lowest scores

Interpretations:
* The paper assumes 2f + 2 < m. For small cohorts n is clamped to
  [1, m - 1] (a single real participant gets the score 0 and is selected),
  and ``num_selected`` to m.
* Distances are taken between whole models (every leaf together) on the
  updates w_k - w_t (equal differences, smaller magnitudes), centred on
  their coordinate-wise median over the real participants and divided by a
  common power of two near the largest centred entry. Distances do not
  change under a common shift, but their Gram matrix form cancels
  catastrophically in float32 when every update shares a component much
  larger than their spread (at a ratio of 1e4 the squared norms are 1e8
  times the distances they must resolve); centring removes it. The median
  rather than the mean: one far Byzantine update would drag a mean away
  from the honest ones and bring the cancellation back. The power of two
  keeps huge updates from overflowing and tiny ones from rounding away.
* The selected models are averaged without weights (number of examples
  unused); equal scores are broken by cohort position (stable order).
* ``flower_compatible=True`` reproduces Flower's Multi-Krum
  (``aggregate_krum`` in ``flwr/server/strategy/aggregate.py``, called by
  ``Krum.aggregate_fit`` in ``flwr/server/strategy/krum.py``; the same
  weighting in ``MultiKrum.aggregate_train``,
  ``flwr/serverapp/strategy/multikrum.py``): the selected models are
  averaged weighted by ``num_examples``, sum_{k in S} n_k w_k /
  sum_{k in S} n_k, instead of uniformly. Scores and selection are
  unchanged: Flower's are the same (the m - f - 2 nearest, at least 1, on
  squared distances between whole models), except that its unstable sort
  may break equal scores otherwise. Krum (``num_selected=1``, Flower's
  ``num_clients_to_keep`` 0 or 1) is the same either way. Where
  ``num_selected`` exceeds m this rule keeps all m models; Flower's slice
  then keeps the num_selected - m best when that is below m (not
  reproduced).
* A cohort with no real participant leaves the model unchanged.

Breakdown point: Krum tolerates f Byzantine clients when 2f + 2 < m, i.e.
a fraction just under 1/2.

Memory: the rule needs all K updates at once (stacked [K, ...] models, no
streaming form); the pairwise distances come from a [K, K] Gram matrix
accumulated leaf by leaf, never a [K, K, params] temporary. The median
centre sorts each leaf over the client axis (a temporary of the leaf's
[K, ...] size).
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.aggregators._fedmedian import masked_median
from fedjax_agg.types import Aggregator, empty_init, StackedParams

__all__ = ["KrumState", "krum", "krum_scores", "pairwise_squared_distances"]


class KrumState(NamedTuple):
  """Krum keeps no state."""


def pairwise_squared_distances(stacked: StackedParams,
                               mask: Optional[jax.Array] = None
                               ) -> jax.Array:
  """|x_i - x_j|^2 between the K rows of ``stacked`` (all leaves), [K, K].

  From the Gram matrix, |a|^2 + |b|^2 - 2 <a, b>, summed leaf by leaf
  (never a [K, K, params] temporary). The rows are first centred on their
  coordinate-wise median over the real rows (the distances do not change,
  but the Gram form no longer cancels away a large component common to
  every row), then divided by a common power of two near their largest
  centred entry (exactly), so the result is the distance divided by that
  scale squared: only comparisons between the entries are meaningful.
  Clamped at 0 (rounding may leave a tiny negative value for close rows).

  Args:
    stacked: [K, ...] rows; the real ones must be finite.
    mask: [K], 1 for a real row; rows with mask 0 (which may hold
      anything) are left out of the centre and replaced by zeros, so their
      entries are meaningless and the real rows' are unaffected by them.
      None: every row is real.

  Returns:
    [K, K] squared distances (divided by the common scale squared).
  """
  leaves = jax.tree.leaves(stacked)
  num = leaves[0].shape[0]
  if mask is None:
    mask = jnp.ones((num,), jnp.float32)
  real = mask > 0
  centre = jax.tree.leaves(masked_median(stacked, mask))

  def centred(leaf, middle):
    rows = leaf.reshape(num, -1)
    middle = jnp.where(jnp.any(real), middle.reshape(1, -1), 0.0)
    return jnp.where(real[:, None], rows - middle.astype(rows.dtype),
                     jnp.zeros_like(rows))

  # Centring leaf by leaf twice (for the scale, then for the Gram matrix)
  # keeps one leaf's centred rows alive at a time.
  largest = jnp.max(jnp.stack([
      jnp.max(jnp.abs(centred(leaf, middle)))
      for leaf, middle in zip(leaves, centre, strict=True)]))
  scale = tree_math.power_of_two_scale(largest)
  gram = 0.0
  for leaf, middle in zip(leaves, centre, strict=True):
    rows = tree_math.divide_by_scale(centred(leaf, middle), scale)
    gram = gram + jnp.matmul(rows, rows.T,
                             precision=tree_math.FULL)
  squares = jnp.diagonal(gram)
  return jnp.maximum(squares[:, None] + squares[None, :] - 2.0 * gram, 0.0)


def krum_scores(distances: jax.Array, mask: jax.Array,
                num_neighbours: jax.Array) -> jax.Array:
  """s(k): sum of the ``num_neighbours`` smallest distances to other real
  rows; +inf for padding rows. [K, K] -> [K]."""
  num = mask.shape[0]
  real = mask > 0
  others = real[None, :] & ~jnp.eye(num, dtype=bool)
  nearest = jnp.sort(jnp.where(others, distances, jnp.inf), axis=1)
  taken = jnp.arange(num)[None, :] < num_neighbours
  scores = jnp.sum(jnp.where(taken, nearest, 0.0), axis=1)
  return jnp.where(real, scores, jnp.inf)


def krum(num_byzantine: int = 0, num_selected: int = 1,
         flower_compatible: bool = False) -> Aggregator:
  """Multi-Krum aggregator (Krum for ``num_selected=1``).

  Args:
    num_byzantine: f, the number of Byzantine clients assumed (>= 0).
    num_selected: how many lowest-score models are averaged (>= 1).
    flower_compatible: average the selected models weighted by
      ``num_examples``, as Flower's ``aggregate_krum``
      (``flwr/server/strategy/aggregate.py``) does, instead of uniformly
      as Blanchard et al. do (module docstring).

  Returns:
    An ``Aggregator``; metrics hold "krum_selected" [K] (1.0 for a chosen
    client) and "num_selected" [].
  """
  checks.check_int("num_byzantine", num_byzantine, 0)
  checks.check_int("num_selected", num_selected, 1)
  checks.check_bool("flower_compatible", flower_compatible)

  init = empty_init(KrumState)

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=flower_compatible)
    real = info.mask > 0
    num_real = jnp.sum(real).astype(jnp.int32)
    updates = tree_math.client_updates(client_params, global_params,
                                       info.mask)
    # n = m - f - 2, clamped to [1, m - 1] (0 for a single participant).
    num_neighbours = jnp.minimum(
        jnp.maximum(num_real - num_byzantine - 2, 1), num_real - 1)
    scores = krum_scores(pairwise_squared_distances(updates, info.mask),
                         info.mask, num_neighbours)
    order = jnp.argsort(scores, stable=True)
    rank = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0]))
    count = jnp.minimum(num_selected, num_real)
    selected = jnp.where(real & (rank < count), 1.0, 0.0)
    if flower_compatible:
      # Flower's aggregate(): the kept models weighted by num_examples.
      raw = jnp.where(selected > 0, info.num_examples, 0.0)
      total = jnp.sum(raw)
      weights = raw / jnp.where(total > 0, total, 1.0)
    else:
      weights = selected / jnp.maximum(count, 1).astype(jnp.float32)
    new_global = tree_math.add_update(
        global_params, tree_math.weighted_sum(updates, weights))
    new_global = tree_math.keep_if_no_clients(info.mask, new_global,
                                              global_params)
    return new_global, state, {"krum_selected": selected,
                               "num_selected": count}

  return Aggregator(init, aggregate)
