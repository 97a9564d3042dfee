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
  updates w_k - w_t (equal differences, smaller magnitudes), divided by a
  common power of two near their largest entry (exactly: huge updates do
  not overflow, tiny ones do not round away). Each pair's distance is the
  sum of its squared differences, computed alike for every pair, never
  through the Gram form |a|^2 + |b|^2 - 2 <a, b>: that form cancels
  catastrophically in float32 when the updates share a component much
  larger than their spread, and its rounding depends on how the backend
  tiles the matrix product. A difference is exact to rounding, so the
  distances of close updates keep their relative accuracy, two identical
  updates are exactly 0 apart and get bitwise equal rows of distances, and
  the matrix is exactly symmetric (its upper triangle mirrored).
* The selected models are averaged without weights (number of examples
  unused).
* Ties (one rule for every selecting rule, ``_fedmedian.client_order``):
  the lower score first, then the lower cohort position (row index); an
  explicit key, so the choice depends neither on the sort's stability nor
  on the backend. Exact ties happen with duplicated updates and, with one
  neighbour (n = 1), for the two members of the closest pair.
* ``flower_compatible=True`` reproduces Flower's Multi-Krum
  (``aggregate_krum`` in ``flwr/server/strategy/aggregate.py``, called by
  ``Krum.aggregate_fit`` in ``flwr/server/strategy/krum.py``; the same
  weighting in ``MultiKrum.aggregate_train``,
  ``flwr/serverapp/strategy/multikrum.py``): the selected models are
  averaged weighted by ``num_examples``, sum_{k in S} n_k w_k /
  sum_{k in S} n_k, instead of uniformly. Scores and selection are
  unchanged: Flower's are the same (the m - f - 2 nearest, at least 1, on
  squared distances between whole models), except that its sort
  (``np.argsort``, not stable) may break equal scores otherwise; its Krum
  (``np.argmin``) takes the first in list order, as here when the cohort
  rows are in Flower's order. Krum (``num_selected=1``, Flower's
  ``num_clients_to_keep`` 0 or 1) is the same either way. Where
  ``num_selected`` exceeds m this rule keeps all m models; Flower's slice
  then keeps the num_selected - m best when that is below m (not
  reproduced).
* A cohort with no real participant leaves the model unchanged.

Breakdown point: Krum tolerates f Byzantine clients when 2f + 2 < m, i.e.
a fraction just under 1/2.

Memory: the rule needs all K updates at once (stacked [K, ...] models, no
streaming form); the [K, K] distances are computed one row at a time (a
loop over the K clients, each step a temporary of the leaves' [K, ...]
size, never a [K, K, params] one).
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.aggregators._fedmedian import client_ranks
from fedjax_agg.types import Aggregator, empty_init, StackedParams

__all__ = ["KrumState", "krum", "krum_scores", "pairwise_squared_distances",
           "sorted_distances"]


class KrumState(NamedTuple):
  """Krum keeps no state."""


def pairwise_squared_distances(stacked: StackedParams,
                               mask: Optional[jax.Array] = None
                               ) -> jax.Array:
  """|x_i - x_j|^2 between the K rows of ``stacked`` (all leaves), [K, K].

  Each entry is sum_p (x_j[p] - x_i[p])^2, leaf by leaf in a fixed order,
  for one row i at a time (never a [K, K, params] temporary). The rows are
  first divided by a common power of two near their largest entry
  (exactly), so the result is the distance divided by that scale squared:
  only comparisons between the entries are meaningful. Every pair is
  computed the same way, so identical rows are exactly 0 apart and have
  bitwise equal distances to every other row; the upper triangle is
  mirrored, so the matrix is exactly symmetric whatever the backend.

  Args:
    stacked: [K, ...] rows; the real ones must be finite.
    mask: [K], 1 for a real row; rows with mask 0 (which may hold
      anything) are replaced by zeros, so their entries are meaningless
      and the real rows' are unaffected by them. None: every row is real.

  Returns:
    [K, K] squared distances (divided by the common scale squared).
  """
  leaves = jax.tree.leaves(stacked)
  num = leaves[0].shape[0]
  if mask is None:
    mask = jnp.ones((num,), jnp.float32)
  real = (mask > 0)[:, None]
  # Padding is zeroed first so that its NaN or inf can neither reach a
  # real row's distances nor the common scale.
  rows = [jnp.where(real, leaf.reshape(num, -1), 0.0) for leaf in leaves]
  largest = jnp.max(jnp.stack([jnp.max(jnp.abs(row)) for row in rows]))
  scale = tree_math.power_of_two_scale(largest)
  rows = [tree_math.divide_by_scale(row, scale) for row in rows]

  def distances_from(row):
    total = 0.0
    # A Python loop over the leaves fixes the order of the per-leaf sums,
    # the same for every pair.
    for leaf_rows, leaf_row in zip(rows, row, strict=True):
      total = total + jnp.sum(jnp.square(leaf_rows - leaf_row[None]), axis=1)
    return total
  # lax.map, not vmap: one row per step keeps the temporary at the
  # leaves' [K, ...] size.
  distances = jax.lax.map(distances_from, rows)
  below = jnp.arange(num)[:, None] > jnp.arange(num)[None, :]
  return jnp.where(below, distances.T, distances)


def sorted_distances(distances: jax.Array, mask: jax.Array) -> jax.Array:
  """Each row's distances to the other real rows, ascending, then +inf.

  Sorted, so that a sum over them is the same for any order of the rows
  (duplicated rows get bitwise equal sums). [K, K] -> [K, K].
  """
  num = mask.shape[0]
  others = (mask > 0)[None, :] & ~jnp.eye(num, dtype=bool)
  return jnp.sort(jnp.where(others, distances, jnp.inf), axis=1)


def krum_scores(nearest: jax.Array, mask: jax.Array,
                num_neighbours: jax.Array) -> jax.Array:
  """s(k): sum of the ``num_neighbours`` smallest distances to other real
  rows, from their sorted rows (``sorted_distances``); +inf for padding
  rows. [K, K] -> [K]."""
  taken = jnp.arange(mask.shape[0])[None, :] < num_neighbours
  scores = jnp.sum(jnp.where(taken, nearest, 0.0), axis=1)
  return jnp.where(mask > 0, scores, jnp.inf)


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
    distances = pairwise_squared_distances(updates, info.mask)
    scores = krum_scores(sorted_distances(distances, info.mask), info.mask,
                         num_neighbours)
    # Ties: the lower score, then the lower row (module docstring).
    rank = client_ranks(scores, info.mask)
    count = jnp.minimum(num_selected, num_real)
    selected = jnp.where(real & (rank < count), 1.0, 0.0)
    if flower_compatible:
      # Flower's aggregate(): the kept models weighted by num_examples.
      raw = jnp.where(selected > 0, info.num_examples, 0.0)
      total = jnp.sum(raw)
      # A committee whose examples sum to 0 (an empty cohort, whose model
      # is kept below) gets zero weights rather than 0 / 0.
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
