"""Centered clipping (Karimireddy et al., ICML 2021).

Golden tests against an independent numpy computation over two rounds
(padding rows hold NaN or 1e30 and must be ignored; the rule runs under
``jax.jit``), and the unweighted mean for a huge radius.
"""

import numpy as np
import pytest

from tests import agg_testutil as tu
from tests.aggregators._util import _assert_update
from tests.aggregators._util import _run
from tests.aggregators._util import flat
from tests.aggregators._util import garbage_cohort
from tests.aggregators._util import MASKS


def np_centered_clipping(updates, center, radius, num_iterations):
  """Karimireddy et al. Eq. (CC), iterated from ``center``."""
  v = center.copy()
  for _ in range(num_iterations):
    diff = updates - v
    dist = np.linalg.norm(diff, axis=1)
    scale = np.minimum(1.0, radius / np.where(dist > 0, dist, 1.0))
    v = v + (scale[:, None] * diff).mean(0)
  return v


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
