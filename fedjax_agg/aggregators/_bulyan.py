"""Bulyan: Krum picks a committee, a trimmed mean around its median.

El Mhamdi, Guerraoui and Rouault, "The Hidden Vulnerability of Distributed
Learning in Byzantium", ICML 2018 (Sec. 4, Bulyan over Krum).

Over the m real participants (mask 1), with f = ``num_byzantine``. The
paper defines Bulyan in two steps; the comments number them:

  Step 1   theta = m - 2f models are selected by Krum, one at a time: S
           starts empty, R holds every model; repeat until |S| = theta:
             k* = argmin_{k in R} s_R(k),
             s_R(k) = sum_{j in N_k} |w_k - w_j|^2
                  (N_k: the |R| - f - 2 nearest other members of R)
             R <- R \\ {k*},  S <- S + {k*}
  Step 2   beta = theta - 2f; for every coordinate i, with med[i] the
           coordinate-wise median of S,
             M[i] = the beta members X of S with the smallest |X[i] - med[i]|
             w_{t+1}[i] = (1 / beta) sum_{X in M[i]} X[i]

Interpretations:
* The bound. The paper requires n >= 4f + 3. Here n is K, the rows of the
  cohort (a static shape): a smaller K raises ValueError when the rule is
  traced (and when it is built, if ``num_participants`` is given). The
  real participants m may be fewer (padding rows, clients excluded as
  non-finite, or a cohort drawn smaller than K): as Krum does for a small
  cohort, the rule then still aggregates with its counts clamped,
  theta = clamp(m - 2f, 1, m) and beta = clamp(theta - 2f, 1, theta), and
  Krum's neighbour count clamp(|R| - f - 2, 1, |R| - 1) (``krum``); the
  guarantee of the paper does not hold for that round. The metrics
  "num_selected" (theta) and "num_kept" (beta) show it.
* Krum in Step 1 is applied to the remaining set R (the paper's recursive
  use of Krum), so its neighbour count shrinks with R. In the last picks
  (|R| <= f + 3) it is 1, where f colluding Byzantine clients sending the
  same model score 0 and can enter S; Step 2 is what bounds them then: S
  holds at most f Byzantine models among theta >= 2f + 3, so every
  coordinate's median lies within the honest values of S, and only the
  beta values nearest it are kept.
* Distances are whole-model, between the updates w_k - w_t, from one
  [K, K] matrix computed once (``krum.pairwise_squared_distances``: per
  pair sums of squared differences, exactly symmetric); each pick only
  masks the rows already chosen.
* Ties. Each pick takes the member of R lowest by the key (s_R(k),
  t_R(k)), t_R(k) the sum of squared distances from k to all of R, then
  by the lower cohort position (row index): the tie rule of every
  selecting rule (``_fedmedian.client_order``: lower score first, then the
  lower row), with Krum's score extended by t_R. Equal Krum scores are
  systematic here, not accidental: with one neighbour (the last picks)
  the two members of R's closest pair score exactly the same (the matrix
  is exactly symmetric). t_R, a sum over R that does not depend on the
  order of the clients (a sum of sorted values), splits them, so the
  committee does not depend on the order of the clients but for exact
  double ties (duplicated updates), which go to the lower row. The keys
  are compared by one lexicographic sort with the row as its last key,
  never by testing a score for equality with their minimum: on an H200
  that test found no row equal to the minimum (the two were not rounded
  alike), so an argmin over no candidates took row 0 at every pick.
* Step 2 runs on the updates too (the median and the distances to it
  commute with a common shift) and is unweighted (number of examples
  unused). With an even |S| the median is the mean of the two middle
  values (both are then among the beta closest). Equal distances at the
  edge of M[i] go to the lower cohort position (an explicit row key; two
  equal values tie without consequence, two values mirrored about the
  median change the mean, e.g. beta = 1 with an even |S|). The distances
  to the median are elementwise, so Step 2 rounds alike on every backend.
  Near the float's largest value Step 2 does not overflow: a distance
  beyond its range (-3e38 from 3e38) is compared halved, and the mean of
  M[i] is rescaled where its plain sum would be inf
  (``_trimmed_mean.kept_mean``).
* f = 0 selects every real participant and keeps every value: the
  unweighted mean.
* A cohort with no real participant leaves the model unchanged.

Breakdown point: f Byzantine clients with K >= 4f + 3, a fraction just under
1/4 (half of Krum's 1/2: the price of the paper's "strong" resilience,
which also bounds every coordinate, not only the whole-model distance).

Memory: the rule needs all K updates at once (stacked [K, ...] models, no
streaming form). The [K, K] distances are accumulated leaf by leaf (never a
[K, K, params] temporary); the theta Krum picks cost O(K^3 log K) on that
matrix. Step 2 sorts each leaf over the client axis twice (median, then
distance to it): temporaries of the leaf's [K, ...] size.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg import tree_math
from fedjax_agg.aggregators._fedmedian import client_order
from fedjax_agg.aggregators._fedmedian import masked_median
from fedjax_agg.aggregators._krum import krum_scores
from fedjax_agg.aggregators._krum import pairwise_squared_distances
from fedjax_agg.aggregators._krum import sorted_distances
from fedjax_agg.aggregators._trimmed_mean import kept_mean
from fedjax_agg.types import Aggregator, empty_init, Params, StackedParams

__all__ = ["BulyanState", "bulyan", "check_cohort_bound", "krum_committee",
           "mean_around_median"]


class BulyanState(NamedTuple):
  """Bulyan keeps no state."""


def check_cohort_bound(num_byzantine, num_rows: int, what: str) -> None:
  """Raises ValueError unless ``num_rows`` >= 4 num_byzantine + 3.

  A traced ``num_byzantine`` (a sweep) passes unchecked.
  """
  if checks.is_traced(num_byzantine):
    return
  bound = 4 * num_byzantine + 3
  if num_rows < bound:
    raise ValueError(
        f"bulyan needs {what} >= 4 num_byzantine + 3 = {bound} clients for "
        f"num_byzantine={num_byzantine} (El Mhamdi et al. 2018), got "
        f"{what}={num_rows}")


def krum_committee(distances: jax.Array, mask: jax.Array, num_byzantine,
                   num_selected: jax.Array) -> jax.Array:
  """Step 1: ``num_selected`` rows picked by Krum one at a time.

  Args:
    distances: [K, K] squared distances between the rows (any common
      scale; entries of padding rows are never read).
    mask: [K], 1 for a real row.
    num_byzantine: f.
    num_selected: [] theta, at most the number of real rows.

  Returns:
    [K] 1.0 for a selected row, 0.0 otherwise.
  """
  num = mask.shape[0]

  def pick(step, carry):
    remaining, selected = carry
    size = jnp.sum(remaining > 0).astype(jnp.int32)
    # Krum on R: n = |R| - f - 2, clamped to [1, |R| - 1].
    neighbours = jnp.minimum(jnp.maximum(size - num_byzantine - 2, 1),
                             size - 1)
    nearest = sorted_distances(distances, remaining)
    scores = krum_scores(nearest, remaining, neighbours)
    # Ties (every pick with n = 1: the closest pair) go to the member
    # closest to all of R, then to the lower row (module docstring).
    # Distances to rows outside R are inf in ``nearest``; they are left out
    # of t_R rather than making every spread inf.
    spread = jnp.sum(jnp.where(jnp.isfinite(nearest), nearest, 0.0), axis=1)
    chosen = client_order((scores, spread), remaining)[0]
    take = (step < num_selected) & (jnp.arange(num) == chosen)
    return (jnp.where(take, 0.0, remaining),
            jnp.where(take, 1.0, selected))

  real = jnp.where(mask > 0, 1.0, 0.0)
  # theta depends on the mask and is traced, so the loop runs a static K
  # picks and those past theta change nothing (``take`` is False).
  _, selected = jax.lax.fori_loop(0, num, pick,
                                  (real, jnp.zeros_like(real)))
  return selected


def mean_around_median(stacked: StackedParams, mask: jax.Array,
                       num_kept: jax.Array) -> Params:
  """Step 2: per coordinate, the mean of the ``num_kept`` real values
  closest to the real values' median.

  Rows with mask 0 are never read (they may hold anything); the caller
  keeps 1 <= ``num_kept`` <= the number of real rows.
  """
  real = mask > 0
  centre = masked_median(stacked, mask)

  def leaf_mean(leaf, middle):
    rows = real.reshape((-1,) + (1,) * (leaf.ndim - 1))
    # Rows outside the mask (padding may hold NaN) are zeroed before the
    # subtraction, and an explicit first key sorts them last.
    values = jnp.where(rows, leaf, jnp.zeros_like(leaf))
    outside = jnp.broadcast_to(jnp.where(rows, 0, 1).astype(jnp.int32),
                               leaf.shape)
    distance = jnp.abs(values - middle[None])
    # A finite value can lie beyond the float's range from the median
    # (-3e38 from 3e38): its distance is inf, so the halved distance, which
    # cannot overflow, orders such values among themselves. It is 0 for
    # finite distances, so they keep their plain order to the bit.
    far = jnp.where(jnp.isinf(distance),
                    jnp.abs(values / 2 - middle[None] / 2), 0.0)
    # Values ordered by their distance to the median, equal distances by
    # row (an explicit key, not the sort's stability); the first
    # ``num_kept`` are M[i].
    row = jax.lax.broadcasted_iota(jnp.int32, leaf.shape, 0)
    *_, ordered = jax.lax.sort((outside, distance, far, row, values),
                               dimension=0, num_keys=4)
    rank = jnp.arange(leaf.shape[0]).reshape(rows.shape)
    return kept_mean(ordered, rank < num_kept,
                     jnp.maximum(num_kept, 1)).astype(leaf.dtype)
  return jax.tree.map(leaf_mean, stacked, centre)


@run_context.derived_from_run(num_participants="cohort_size")
def bulyan(num_byzantine: int = 0, *,
           num_participants: Optional[int] = None) -> Aggregator:
  """Bulyan aggregator (over Krum).

  Args:
    num_byzantine: f, the number of Byzantine clients assumed (>= 0); a
      cohort needs K >= 4f + 3 rows.
    num_participants: K, the cohort size the rule will be given, when
      known (runs fill it in): the bound is then checked here, when the
      rule is built, rather than at its first round. None: checked at the
      first round only.

  Returns:
    An ``Aggregator``; metrics hold "bulyan_selected" [K] (1.0 for a
    client Krum put in S), "num_selected" [] (theta) and "num_kept" []
    (beta).
  """
  checks.check_int("num_byzantine", num_byzantine, 0)
  if num_participants is not None:
    checks.check_int("num_participants", num_participants, 1)
    check_cohort_bound(num_byzantine, num_participants, "num_participants")

  init = empty_init(BulyanState)

  def aggregate(global_params, client_params, info, state):
    num_rows = checks.check_cohort(global_params, client_params, info,
                                   uses_num_examples=False)
    check_cohort_bound(num_byzantine, num_rows, "K")
    num_real = jnp.sum(info.mask > 0).astype(jnp.int32)
    updates = tree_math.client_updates(client_params, global_params,
                                       info.mask)
    # Step 1: theta = m - 2f, clamped to [1, m] for a small cohort.
    num_selected = jnp.minimum(
        jnp.maximum(num_real - 2 * num_byzantine, 1), num_real)
    selected = krum_committee(
        pairwise_squared_distances(updates, info.mask), info.mask,
        num_byzantine, num_selected)
    # Step 2: beta = theta - 2f, clamped to [1, theta].
    num_kept = jnp.minimum(
        jnp.maximum(num_selected - 2 * num_byzantine, 1), num_selected)
    # The committee S is the mask of Step 2: only its members' values enter
    # the median and the trimmed mean.
    new_global = tree_math.add_update(
        global_params, mean_around_median(updates, selected, num_kept))
    new_global = tree_math.keep_if_no_clients(info.mask, new_global,
                                              global_params)
    return new_global, state, {"bulyan_selected": selected,
                               "num_selected": num_selected,
                               "num_kept": num_kept}

  return Aggregator(init, aggregate)
