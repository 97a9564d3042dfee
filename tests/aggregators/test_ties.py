"""One tie rule for every rule that selects or sorts clients.

Lower score first, then the lower cohort position (row index)
(``_fedmedian.client_order``); Bulyan's score is Krum's extended by the sum
of squared distances to the remaining clients. The cohorts make scores tie
exactly (duplicated clients, a mirrored closest pair, equal accuracies);
each test checks the selected rows and the output against an independent
numpy computation under ``jax.jit``. Permuting clients that do not tie
keeps the selected client ids; coordinate-wise order statistics (median,
trimmed mean) give bitwise the same result for any order.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from fedjax_agg.aggregators._fedacs import select_top
from fedjax_agg.aggregators._fedmedian import client_order
from fedjax_agg.aggregators._fedmedian import client_ranks
from fedjax_agg.aggregators._krum import krum_scores
from fedjax_agg.aggregators._krum import pairwise_squared_distances
from fedjax_agg.aggregators._krum import sorted_distances
from tests import agg_testutil as tu
from tests.aggregators._util import np_krum
from tests.aggregators.test_bulyan import np_bulyan

_run = tu.run_rule
flat = tu.flat
NUM_PARAMS = 38  # parameters of the tests' model (tu.SHAPES)


def _cohort(updates, mask=None, ids=None):
  """Global model 0 (so each client's update is its row exactly), clients
  from [K, NUM_PARAMS] ``updates`` (padding rows, mask 0, turned to NaN),
  info with unequal counts."""
  updates = np.asarray(updates, np.float32)
  num = updates.shape[0]
  mask = np.ones(num) if mask is None else np.asarray(mask)
  updates = np.where(mask[:, None] > 0, updates, np.nan)
  global_params = jax.tree.map(jnp.zeros_like,
                               tu.make_params(np.random.default_rng(0)))
  _, unravel = ravel_pytree(global_params)
  clients = jax.vmap(unravel)(jnp.asarray(updates))
  ids = np.arange(num) if ids is None else np.asarray(ids)
  info = tu.make_info(ids, 1.0 + np.arange(num), mask)
  return global_params, clients, info


def _selected_ids(metrics, key, info):
  return set(np.asarray(info.client_ids)[np.asarray(metrics[key]) > 0])


# ---------------------------------------------------------------------------
# The ordering itself.


@pytest.mark.parametrize("seed", range(5))
def test_client_order_is_lexicographic_then_by_row(seed):
  rng = np.random.default_rng(seed)
  num = 9
  # Few distinct values: many exact ties, 0.0 and -0.0 among them.
  first = rng.choice([-1.0, -0.0, 0.0, 2.5], size=num).astype(np.float32)
  second = rng.integers(0, 2, size=num).astype(np.float32)
  mask = rng.integers(0, 2, size=num).astype(np.float32)
  first[mask == 0] = np.nan  # padding may hold anything
  order = jax.jit(client_order)((jnp.asarray(first), jnp.asarray(second)),
                                jnp.asarray(mask))
  expected = sorted(range(num), key=lambda k: (
      mask[k] == 0, 0.0 if mask[k] == 0 else float(first[k]) + 0.0,
      second[k], k))
  np.testing.assert_array_equal(order, expected)
  ranks = jax.jit(client_ranks)(jnp.asarray(second), jnp.asarray(mask))
  np.testing.assert_array_equal(
      np.asarray(ranks)[np.asarray(jax.jit(client_order)(
          jnp.asarray(second), jnp.asarray(mask)))], np.arange(num))


# ---------------------------------------------------------------------------
# Krum and Multi-Krum.


def _closest_pair(first, second):
  """Five real rows and a padding row: the pair (0, e_1) at distance 1 in
  rows ``first`` and ``second``, three others far from everything."""
  updates = np.zeros((6, NUM_PARAMS))
  updates[second, 1] = 1.0
  rest = [row for row in range(6) if row not in (first, second, 2)]
  for place, row in enumerate(rest):
    updates[row, 2 + place] = 100.0 * (place + 1)
  mask = np.ones(6)
  mask[2] = 0  # a padding row between them counts no position
  return updates, mask


@pytest.mark.parametrize("first,second", [(1, 4), (4, 1), (0, 5), (5, 3)])
def test_krum_breaks_the_closest_pair_tie_by_row(first, second):
  # m = 5, f = 2: one neighbour, so both members of the closest pair score
  # exactly |0 - e_1|^2 = 1; Krum takes the one in the lower row.
  updates, mask = _closest_pair(first, second)
  global_params, clients, info = _cohort(updates, mask)
  out, _, metrics = _run("krum", global_params, clients, info,
                         num_byzantine=2)
  real = np.flatnonzero(mask)
  expected, chosen = np_krum(updates[real], 2, 1)
  assert real[chosen].tolist() == [min(first, second)]
  np.testing.assert_array_equal(metrics["krum_selected"],
                                np.isin(np.arange(6), real[chosen]))
  np.testing.assert_array_equal(flat(out), expected)


def test_duplicated_clients_have_bitwise_equal_distances_and_scores():
  rng = np.random.default_rng(1)
  updates = rng.normal(size=(7, NUM_PARAMS)).astype(np.float32)
  updates[5] = updates[1] = 0.1 * updates[1]  # central: the lowest scores
  updates[3] = updates[6]
  global_params, clients, info = _cohort(updates)

  @jax.jit
  def scores(clients):
    rows = jax.tree.map(lambda c, g: c - g, clients, global_params)
    distances = pairwise_squared_distances(rows, info.mask)
    return distances, krum_scores(sorted_distances(distances, info.mask),
                                  info.mask, 3)
  distances, scores = map(np.asarray, scores(clients))
  np.testing.assert_array_equal(distances, distances.T)
  for a, b in ((1, 5), (3, 6)):
    assert distances[a, b] == 0.0
    others = np.setdiff1d(np.arange(7), [a, b])
    np.testing.assert_array_equal(distances[a, others], distances[b, others])
    assert scores[a] == scores[b]
  # Multi-Krum keeping 3: the central twins, then the lower of the other
  # twins if they tie for the third place (numpy's stable argsort agrees).
  for num_selected in (1, 2, 3):
    out, _, metrics = _run("krum", global_params, clients, info,
                           num_byzantine=2, num_selected=num_selected)
    expected, chosen = np_krum(updates.astype(np.float64), 2, num_selected)
    np.testing.assert_array_equal(metrics["krum_selected"],
                                  np.isin(np.arange(7), chosen))
    np.testing.assert_allclose(flat(out), expected, rtol=1e-6, atol=1e-7)
  assert chosen[:2].tolist() == [1, 5]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("num_selected", [1, 3])
def test_permuting_untied_clients_keeps_the_krum_selection(seed,
                                                           num_selected):
  rng = np.random.default_rng(seed)
  updates = rng.normal(size=(7, NUM_PARAMS))
  ids = rng.permutation(7)
  global_params, clients, info = _cohort(updates, ids=ids)
  out, _, metrics = _run("krum", global_params, clients, info,
                         num_byzantine=1, num_selected=num_selected)
  for _ in range(3):
    perm = rng.permutation(7)
    p_params, p_clients, p_info = _cohort(updates[perm], ids=ids[perm])
    p_out, _, p_metrics = _run("krum", p_params, p_clients, p_info,
                               num_byzantine=1, num_selected=num_selected)
    assert (_selected_ids(p_metrics, "krum_selected", p_info)
            == _selected_ids(metrics, "krum_selected", info))
    tu.assert_trees_close(p_out, out, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------
# Bulyan.


def _bulyan_twins():
  """K = 7 normal rows, row 5 a copy of row 2: the twins tie exactly on
  both keys at Krum's second pick, where one of them enters S."""
  rng = np.random.default_rng(6)
  updates = rng.normal(size=(7, NUM_PARAMS)).astype(np.float32)
  updates[5] = updates[2]
  return updates


@pytest.mark.parametrize("twin_rows", [(2, 5), (5, 2), (0, 6)])
def test_bulyan_takes_the_lower_row_of_exact_twins(twin_rows):
  updates = _bulyan_twins()
  # Move the twins (rows 2 and 5) to ``twin_rows``, keeping the others'
  # order; ids follow their clients.
  others = [row for row in range(7) if row not in (2, 5)]
  free = [row for row in range(7) if row not in twin_rows]
  perm = np.empty(7, int)
  perm[list(twin_rows)] = [2, 5]
  perm[free] = others
  global_params, clients, info = _cohort(updates[perm], ids=perm)
  out, _, metrics = _run("bulyan", global_params, clients, info,
                         num_byzantine=1)
  expected, chosen = np_bulyan(updates[perm].astype(np.float64), 1)
  # Exactly one twin enters S: the one in the lower row, whichever it is.
  assert len({2, 5} & set(perm[chosen])) == 1
  assert min(twin_rows) in chosen
  np.testing.assert_array_equal(metrics["bulyan_selected"],
                                np.isin(np.arange(7), chosen))
  np.testing.assert_allclose(flat(out), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_permuting_untied_clients_keeps_the_bulyan_committee(seed):
  # The last picks (one neighbour) tie the closest pair exactly; the sum
  # of distances to R splits them, whatever the order of the clients.
  rng = np.random.default_rng(10 + seed)
  updates = rng.normal(size=(11, NUM_PARAMS))
  ids = rng.permutation(11)
  global_params, clients, info = _cohort(updates, ids=ids)
  out, _, metrics = _run("bulyan", global_params, clients, info,
                         num_byzantine=2)
  expected, _ = np_bulyan(updates.astype(np.float32).astype(np.float64), 2)
  np.testing.assert_allclose(flat(out), expected, rtol=1e-5, atol=1e-6)
  for _ in range(3):
    perm = rng.permutation(11)
    p_params, p_clients, p_info = _cohort(updates[perm], ids=ids[perm])
    p_out, _, p_metrics = _run("bulyan", p_params, p_clients, p_info,
                               num_byzantine=2)
    assert (_selected_ids(p_metrics, "bulyan_selected", p_info)
            == _selected_ids(metrics, "bulyan_selected", info))
    tu.assert_trees_close(p_out, out, rtol=1e-6, atol=1e-7)


def test_bulyan_step_two_breaks_a_mirrored_tie_by_row():
  # m = 6, f = 2: theta = 2, beta = 1. Krum picks row 3, then row 2
  # (scores tie at one neighbour, the spread decides); per coordinate the
  # two values are mirrored about their median (equal distances), and the
  # lower row's value is kept, though row 3 entered S first.
  # K = 11 >= 4f + 3 rows, the last five padding.
  updates = np.zeros((11, NUM_PARAMS))
  updates[:6, 0] = [5.0, -40.0, 1.0, 3.0, 40.0, 50.0]
  updates[:6, 1] = [-3.0, -40.0, 2.0, 0.0, 40.0, 50.0]
  mask = np.arange(11) < 6
  global_params, clients, info = _cohort(updates, mask)
  out, _, metrics = _run("bulyan", global_params, clients, info,
                         num_byzantine=2)
  expected, chosen = np_bulyan(updates[:6], 2)
  assert chosen == [3, 2]
  np.testing.assert_array_equal(metrics["bulyan_selected"],
                                np.isin(np.arange(11), chosen))
  np.testing.assert_array_equal(flat(out), expected)
  np.testing.assert_array_equal(flat(out), updates[2])


# ---------------------------------------------------------------------------
# Coordinate-wise order statistics: ties cannot change the value.


@pytest.mark.parametrize("rule,kwargs", [
    ("fedmedian", {}), ("trimmed_mean", {"beta": 0.2}),
    ("trimmed_mean", {"beta": 0.34})])
def test_order_statistics_with_ties_are_the_same_for_any_order(rule, kwargs):
  rng = np.random.default_rng(3)
  # Values from {-1, 0, 2}: every coordinate ties many clients.
  updates = rng.choice([-1.0, 0.0, 2.0], size=(7, NUM_PARAMS))
  mask = np.asarray([1, 1, 0, 1, 1, 1, 1])
  global_params, clients, info = _cohort(updates, mask)
  out, _, _ = _run(rule, global_params, clients, info, **kwargs)
  real = np.sort(updates[mask > 0], axis=0)
  if rule == "fedmedian":
    expected = np.median(real, axis=0)
  else:
    cut = int(np.floor(kwargs["beta"] * len(real) + 1e-9))
    expected = real[cut:len(real) - cut].mean(axis=0)
  np.testing.assert_allclose(flat(out), expected, rtol=1e-6, atol=0)
  for _ in range(3):
    perm = rng.permutation(7)
    p_params, p_clients, p_info = _cohort(updates[perm], mask[perm])
    p_out, _, _ = _run(rule, p_params, p_clients, p_info, **kwargs)
    np.testing.assert_array_equal(flat(p_out), flat(out))


# ---------------------------------------------------------------------------
# FedACS.


def test_fedacs_equal_accuracies_go_to_the_lower_row():
  accuracy = np.asarray([0.5, 0.75, np.nan, 0.75, 0.5, 0.75, 0.25],
                        np.float32)
  mask = np.asarray([1, 1, 0, 1, 1, 1, 1], np.float32)
  real = np.flatnonzero(mask)
  for fraction in (0.2, 0.4, 0.6, 1.0):
    kept = max(int(np.ceil(fraction * len(real))), 1)
    expected = sorted(real, key=lambda k: (-accuracy[k], k))[:kept]
    got = jax.jit(select_top, static_argnums=2)(
        jnp.asarray(accuracy), jnp.asarray(mask), fraction)
    np.testing.assert_array_equal(got, np.isin(np.arange(7), expected))
