"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017).

Golden tests against an independent numpy computation of the paper's
scores (padding rows hold NaN or 1e30 and must be ignored; the rule runs
under ``jax.jit``), float32 against float64 selections, and properties:
selecting every client is the unweighted mean, far attackers are never
selected.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import testing
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES
from tests.aggregators._util import _assert_update
from tests.aggregators._util import _run
from tests.aggregators._util import flat
from tests.aggregators._util import flat_rows
from tests.aggregators._util import garbage_cohort
from tests.aggregators._util import K
from tests.aggregators._util import MASKS
from tests.aggregators._util import np_krum


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
  # (uncentred, Multi-Krum picked the outlier in 10 of these 20 draws and
  # disagreed with float64 in 19); the distances are now sums of squared
  # differences, which do not cancel. A reference Krum in float64 on the
  # same float32 inputs never picks the outlier.
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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_krum_selects_as_float64_krum_near_the_float32_maximum(seed):
  # Updates from 2^127 up: their squared distances exist only in scaled
  # form (tree_math's power-of-two scales, which must not flush to 0 under
  # jit); the selection must be float64 Krum's.
  from fedjax_agg import aggregators, types  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  num = 6
  rows = (rng.uniform(1.7e38, 3.3e38, size=(num, 3))
          * rng.choice([-1.0, 1.0], size=(num, 3))).astype(np.float32)
  rows[0] = -rows[0]  # one far client
  global_params = {"w": jnp.zeros(3, jnp.float32)}
  zeros = jnp.zeros(num)
  info = types.ClientInfo(jnp.arange(num), jnp.ones(num), jnp.ones(num),
                          zeros, zeros, jnp.int32(1), jax.random.key(0))
  rule = aggregators.krum(num_byzantine=1, num_selected=1)
  out, _, metrics = jax.jit(rule.aggregate)(
      global_params, {"w": jnp.asarray(rows)}, info,
      rule.init(global_params))
  _, chosen = np_krum(rows.astype(np.float64), 1, 1)
  np.testing.assert_array_equal(np.flatnonzero(metrics["krum_selected"]),
                                chosen)
  np.testing.assert_array_equal(np.asarray(out["w"]), rows[chosen[0]])
