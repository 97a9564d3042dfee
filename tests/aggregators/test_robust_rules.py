"""Krum, geometric median (RFA), centered clipping and norm bounding.

Golden tests against independent numpy computations of the papers'
equations (padding rows hold NaN or 1e30 and must be ignored; rules run
under ``jax.jit``), and property tests of their identities. Bulyan and
q-FedAvg join the shared tables at the end (permutation, a single real
participant, bad arguments); their golden tests are in test_bulyan.py and
test_qffl.py.
"""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg import testing
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES

K = 6
MASKS = [[1] * K, [1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0],
         [1, 1, 0, 0, 0, 0]]


_run = tu.run_rule
flat = tu.flat
flat_rows = tu.flat_rows


def garbage_cohort(seed, mask, scale=1.0):
  """Global params, clients with garbage padding rows, info; the real
  rows' updates [m, P] (float64) and example counts [m]."""
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, K, scale=scale)
  real = np.flatnonzero(np.asarray(mask))
  counts = rng.integers(1, 30, size=K).astype(np.float64)
  updates = flat_rows(clients)[real] - flat(global_params)
  padding = np.flatnonzero(np.asarray(mask) == 0)
  garbage = {row: (np.nan if i % 2 == 0 else 1e30)
             for i, row in enumerate(padding)}

  def spoil(leaf):
    leaf = np.array(leaf)
    for row, value in garbage.items():
      leaf[row] = value
    return jnp.asarray(leaf)
  counts_in = counts.copy()
  counts_in[padding] = 1e9
  info = tu.make_info(np.arange(K), counts_in, mask)
  return (global_params, jax.tree.map(spoil, clients), info, updates,
          counts[real])


def permute_info(info, perm):
  """The cohort's per-client fields in the order ``perm``."""
  return info._replace(**{
      field: getattr(info, field)[perm] for field in (
          "client_ids", "num_examples", "mask", "loss_before",
          "loss_after")})


def _assert_update(out, global_params, expected, rtol=1e-5, atol=1e-6):
  np.testing.assert_allclose(flat(out) - flat(global_params), expected,
                             rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------
# Numpy references.


def np_sq_distances(updates):
  return ((updates[:, None, :] - updates[None, :, :]) ** 2).sum(-1)


def np_krum(updates, num_byzantine, num_selected):
  """Blanchard et al. Sec. 4 (Multi-Krum) on [m, P]; clamped counts."""
  m = updates.shape[0]
  n = min(max(m - num_byzantine - 2, 1), m - 1)
  dist = np_sq_distances(updates)
  scores = np.array([np.sort(np.delete(dist[i], i))[:n].sum()
                     for i in range(m)])
  chosen = np.argsort(scores, kind="stable")[:min(num_selected, m)]
  return updates[chosen].mean(0), chosen


def np_geometric_median(updates, alpha, max_iterations, tolerance,
                        smoothing):
  """Pillutla et al. Alg. 3 (smoothed Weiszfeld), weights alpha; stops
  after the first step with |z_t - z_{t-1}| <= tolerance |z_t|."""
  alpha = alpha / alpha.sum()
  z = alpha @ updates

  def objective(z):
    dist = np.linalg.norm(updates - z, axis=1)
    return dist, alpha @ dist
  dist, obj = objective(z)
  settled, iterations = False, 0
  while iterations < max_iterations and not settled:
    beta = alpha / np.maximum(smoothing, dist)
    previous, z = z, beta @ updates / beta.sum()
    settled = np.linalg.norm(z - previous) <= tolerance * np.linalg.norm(z)
    dist, obj = objective(z)
    iterations += 1
  return z, iterations, obj


def np_centered_clipping(updates, center, radius, num_iterations):
  """Karimireddy et al. Eq. (CC), iterated from ``center``."""
  v = center.copy()
  for _ in range(num_iterations):
    diff = updates - v
    dist = np.linalg.norm(diff, axis=1)
    scale = np.minimum(1.0, radius / np.where(dist > 0, dist, 1.0))
    v = v + (scale[:, None] * diff).mean(0)
  return v


def np_norm_bounding(updates, counts, max_norm):
  """Sun et al. Sec. 3: clip to max_norm, FedAvg weights."""
  norms = np.linalg.norm(updates, axis=1)
  clipped = updates * np.minimum(1.0, max_norm / norms)[:, None]
  return counts @ clipped / counts.sum(), np.mean(norms > max_norm)


# ---------------------------------------------------------------------------
# Golden tests.


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("num_byzantine,num_selected",
                         [(0, 1), (1, 1), (1, 3), (2, 2), (0, K)])
def test_krum_golden(mask, num_byzantine, num_selected):
  global_params, clients, info, updates, _ = garbage_cohort(sum(mask), mask)
  out, _, metrics = _run("krum", global_params, clients, info,
                         num_byzantine=num_byzantine,
                         num_selected=num_selected)
  expected, chosen = np_krum(updates, num_byzantine, num_selected)
  _assert_update(out, global_params, expected)
  real = np.flatnonzero(mask)
  selected = np.zeros(K)
  selected[real[chosen]] = 1.0
  np.testing.assert_array_equal(metrics["krum_selected"], selected)
  assert int(metrics["num_selected"]) == len(chosen)


@pytest.mark.parametrize("mask", MASKS)
def test_geometric_median_golden(mask):
  global_params, clients, info, updates, counts = garbage_cohort(
      7 + sum(mask), mask)
  out, _, metrics = _run("geometric_median", global_params, clients, info,
                         max_iterations=50, tolerance=1e-5)
  expected, _, objective = np_geometric_median(updates, counts, 50, 1e-5,
                                               1e-6)
  _assert_update(out, global_params, expected, rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(metrics["gm_objective"], objective, rtol=1e-4)


@pytest.mark.parametrize("max_iterations", [1, 3])
def test_geometric_median_runs_exactly_the_steps_asked(max_iterations):
  mask = [1, 0, 1, 1, 1, 1]
  global_params, clients, info, updates, counts = garbage_cohort(3, mask)
  out, _, metrics = _run("geometric_median", global_params, clients, info,
                         max_iterations=max_iterations, tolerance=0.0)
  expected, iterations, _ = np_geometric_median(updates, counts,
                                                max_iterations, 0.0, 1e-6)
  assert int(metrics["gm_iterations"]) == iterations == max_iterations
  _assert_update(out, global_params, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mask", [[1] * K, [1, 0, 1, 1, 0, 1]])
def test_geometric_median_without_tolerance_reaches_the_float64_median(
    seed, mask):
  # tolerance=0 once stopped where the float32 objective stopped changing
  # (7 to 104 steps here), up to 4e-3 relative (2.3e-2 absolute) from the
  # median; stopping on the iterate's movement runs until float32 z stops
  # moving: within 5e-6 relative of float64 Weiszfeld run to its end.
  global_params, clients, info, updates, counts = garbage_cohort(seed, mask)
  out, _, metrics = _run("geometric_median", global_params, clients, info,
                         max_iterations=5000, tolerance=0.0)
  expected, _, objective = np_geometric_median(updates, counts, 100_000,
                                               0.0, 1e-6)
  got = flat(out) - flat(global_params)
  assert (np.linalg.norm(got - expected)
          <= 1e-5 * np.linalg.norm(expected))
  np.testing.assert_allclose(metrics["gm_objective"], objective, rtol=1e-6)
  assert int(metrics["gm_iterations"]) < 5000  # z settled in float32


def test_geometric_median_without_tolerance_runs_every_step_while_moving():
  # This cohort converges slowly: float64 z still moves by 1e-5 |z| at
  # step 150, far above float32 resolution, so all 150 steps run (the
  # objective rule stopped after 104).
  mask = [1, 0, 1, 1, 0, 1]
  global_params, clients, info, updates, counts = garbage_cohort(3, mask)
  out, _, metrics = _run("geometric_median", global_params, clients, info,
                         max_iterations=150, tolerance=0.0)
  expected, iterations, _ = np_geometric_median(updates, counts, 150, 0.0,
                                                1e-6)
  previous, _, _ = np_geometric_median(updates, counts, 149, 0.0, 1e-6)
  assert (np.linalg.norm(expected - previous)
          > 1e-6 * np.linalg.norm(expected))
  assert int(metrics["gm_iterations"]) == iterations == 150
  _assert_update(out, global_params, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("radius,num_iterations", [(2.0, 1), (3.0, 3),
                                                   (1e4, 1)])
def test_centered_clipping_golden_over_two_rounds(mask, radius,
                                                  num_iterations):
  global_params, clients, info, updates, _ = garbage_cohort(11, mask)
  rule, aggregate = tu.jitted_aggregate("centered_clipping", tuple(sorted(
      {"radius": radius, "num_iterations": num_iterations}.items())))
  state = rule.init(global_params)
  center = np.zeros_like(updates[0])
  params = global_params
  for _ in range(2):
    new_params, state, _ = aggregate(params, clients, info, state)
    # The clients' models are fixed: their updates are relative to the
    # current global model.
    round_updates = updates + flat(global_params) - flat(params)
    center = np_centered_clipping(round_updates, center, radius,
                                  num_iterations)
    _assert_update(new_params, params, center, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(flat(state.previous_update), center,
                               rtol=1e-4, atol=1e-5)
    params = new_params


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("max_norm", [0.5, 6.0, 1e6])
def test_norm_bounding_golden(mask, max_norm):
  global_params, clients, info, updates, counts = garbage_cohort(5, mask)
  out, _, metrics = _run("norm_bounding", global_params, clients, info,
                         max_norm=max_norm)
  expected, fraction = np_norm_bounding(updates, counts, max_norm)
  _assert_update(out, global_params, expected)
  np.testing.assert_allclose(metrics["fraction_clipped"], fraction)


# ---------------------------------------------------------------------------
# Properties.

SYMMETRIC = [("krum", (("num_byzantine", 1), ("num_selected", 2))),
             ("bulyan", ()), ("geometric_median", ()),
             ("norm_bounding", ()), ("centered_clipping", (("radius", 1.0),))]


@pytest.mark.parametrize("name,items", SYMMETRIC)
@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(K), perm_seed=st.integers(0, 2**31))
def test_permuting_the_clients_changes_nothing(name, items, cohort,
                                               perm_seed):
  global_params, clients, info = cohort
  perm = np.random.default_rng(perm_seed).permutation(K)
  out, _, _ = _run(name, global_params, clients, info, **dict(items))
  p_out, _, _ = _run(name, global_params, tu.take_rows(clients, perm),
                     permute_info(info, perm), **dict(items))
  tu.assert_trees_close(p_out, out, rtol=1e-5, atol=1e-5)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(K))
def test_krum_selecting_every_client_is_the_unweighted_mean(cohort):
  global_params, clients, info = cohort
  out, _, _ = _run("krum", global_params, clients, info, num_selected=K)
  real = np.asarray(info.mask) > 0
  expected = jax.tree.map(lambda c: np.asarray(c)[real].mean(0), clients)
  tu.assert_trees_close(out, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**31), num_bad=st.integers(1, 2),
       distance=st.sampled_from([5.0, 1e3, 1e6]))
def test_krum_never_selects_far_attackers(seed, num_bad, distance):
  num = 8
  global_params, clients, info, bad = tu.colluding_cohort(
      seed, num, num_bad, distance)
  _, _, metrics = _run("krum", global_params, clients, info,
                       num_byzantine=num_bad, num_selected=num - num_bad)
  selected = np.asarray(metrics["krum_selected"])
  assert selected[bad].sum() == 0
  assert selected.sum() == num - num_bad


def _krum_hostile_cohort(seed, common, far):
  """Honest updates c + N(0, 1e-3^2) (c per coordinate ~ ``common`` times
  the noise), one outlier 3 noise scales off them, one attacker ``far``
  off in every coordinate (0: none), two padding rows of garbage (NaN,
  1e30). Returns params, clients, info, the real rows' float64 updates,
  the real rows, and the outlier's and attacker's indices among them."""
  num_real, noise = 6, 1e-3
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  shift = jax.tree.map(lambda g: rng.normal(size=g.shape) * noise * common,
                       global_params)
  outlier, attacker = rng.choice(num_real, size=2, replace=False)

  def leaf(g, c):
    rows = (np.asarray(g, np.float64) + c
            + rng.normal(size=(num_real,) + g.shape) * noise)
    rows[outlier] += rng.normal(size=g.shape) * 3 * noise
    rows[attacker] += far
    return rows
  real_rows = jax.tree.map(leaf, global_params, shift)
  # Padding rows at positions 1 and 4 of K = 8 hold garbage.
  order = [0, 6, 1, 2, 7, 3, 4, 5]
  mask = np.asarray([1, 0, 1, 1, 0, 1, 1, 1])

  def padded(rows):
    garbage = np.stack([np.full(rows.shape[1:], np.nan),
                        np.full(rows.shape[1:], 1e30)])
    return jnp.asarray(np.concatenate([rows, garbage])[order], jnp.float32)
  clients = jax.tree.map(padded, real_rows)
  real = np.flatnonzero(mask)
  updates = flat_rows(clients)[real] - flat(global_params)
  info = tu.make_info(np.arange(8) % tu.NUM_CLIENTS, np.ones(8), mask)
  return (global_params, clients, info, updates, real, outlier,
          attacker if far else None)


@pytest.mark.parametrize("common,far,num_byzantine,num_selected", [
    (3e4, 0.0, 1, 3),  # a large component common to every update
    (3e4, 0.0, 1, 1),
    (0.0, 1e3, 2, 3),  # one far attacker: a mean centre would move to it
    (1e4, 1e3, 2, 1),
])
def test_krum_in_float32_selects_what_float64_krum_selects(
    common, far, num_byzantine, num_selected):
  # The Gram form |a|^2 + |b|^2 - 2<a, b> of the distances cancels in
  # float32 when the updates share a component 1e4 times their spread
  # (before the rows were centred, Multi-Krum picked the outlier in 10 of
  # these 20 draws and disagreed with float64 in 19). A reference Krum in
  # float64 on the same float32 inputs never picks the outlier.
  for seed in range(20):
    (global_params, clients, info, updates, real, outlier,
     attacker) = _krum_hostile_cohort(seed, common, far)
    out, _, metrics = _run("krum", global_params, clients, info,
                           num_byzantine=num_byzantine,
                           num_selected=num_selected)
    expected, chosen = np_krum(updates, num_byzantine, num_selected)
    assert outlier not in chosen and attacker not in chosen
    selected = np.zeros(8)
    selected[real[chosen]] = 1.0
    np.testing.assert_array_equal(metrics["krum_selected"], selected,
                                  err_msg=f"seed {seed}")
    np.testing.assert_allclose(flat(out), flat(global_params) + expected,
                               rtol=1e-6, atol=1e-6)


@settings(max_examples=EXAMPLES, deadline=None)
@given(seed=st.integers(0, 2**31), size=st.sampled_from([10.0, 1e4, 1e8]))
def test_geometric_median_moves_less_than_the_mean_for_an_outlier(seed,
                                                                  size):
  global_params, clients, info, _, _ = garbage_cohort(seed, [1] * K)
  info = info._replace(num_examples=jnp.ones(K))
  attacked = jax.tree.map(lambda c: c.at[0].add(size), clients)

  def moves(name):
    before, _, _ = _run(name, global_params, clients, info)
    after, _, _ = _run(name, global_params, attacked, info)
    return np.linalg.norm(flat(after) - flat(before))
  assert moves("geometric_median") < 0.5 * moves("fedavg")


@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(K))
def test_norm_bounding_with_a_huge_bound_is_fedavg(cohort):
  global_params, clients, info = cohort
  out, _, metrics = _run("norm_bounding", global_params, clients, info,
                         max_norm=1e6)
  expected, _, _ = _run("fedavg", global_params, clients, info)
  tu.assert_trees_close(out, expected, rtol=1e-5, atol=1e-5)
  assert float(metrics["fraction_clipped"]) == 0.0


def test_centered_clipping_with_a_huge_radius_is_the_unweighted_mean():
  global_params, clients, info, updates, _ = garbage_cohort(
      2, [1, 1, 0, 1, 1, 1])
  out, state, metrics = _run("centered_clipping", global_params, clients,
                             info, radius=1e6)
  _assert_update(out, global_params, updates.mean(0), atol=1e-5)
  assert float(metrics["fraction_clipped"]) == 0.0
  # The first round starts from v = 0; the state keeps the aggregate.
  np.testing.assert_allclose(flat(state.previous_update), updates.mean(0),
                             rtol=1e-5, atol=1e-5)


def test_a_single_real_participant_is_its_own_aggregate():
  mask = [0, 0, 0, 1, 0, 0]
  global_params, clients, info, updates, _ = garbage_cohort(4, mask)
  for name in ("krum", "bulyan", "geometric_median", "centered_clipping"):
    out, _, _ = _run(name, global_params, clients, info)
    _assert_update(out, global_params, updates[0], atol=1e-5)


@pytest.mark.parametrize("name,kwargs,arg", [
    ("krum", {"num_byzantine": -1}, "num_byzantine"),
    ("krum", {"num_selected": 0}, "num_selected"),
    ("krum", {"num_selected": 1.5}, "num_selected"),
    ("geometric_median", {"max_iterations": 0}, "max_iterations"),
    ("geometric_median", {"tolerance": -1.0}, "tolerance"),
    ("geometric_median", {"smoothing": 0.0}, "smoothing"),
    ("centered_clipping", {"radius": 0.0}, "radius"),
    ("centered_clipping", {"num_iterations": 0}, "num_iterations"),
    ("norm_bounding", {"max_norm": -2.0}, "max_norm"),
    ("bulyan", {"num_byzantine": -1}, "num_byzantine"),
    ("qffl", {"q": -1.0}, "q"),
    ("qffl", {"lipschitz": 0.0}, "lipschitz"),
])
def test_bad_arguments_name_the_argument(name, kwargs, arg):
  with pytest.raises((ValueError, TypeError), match=arg):
    aggregators.get(name, **kwargs)
