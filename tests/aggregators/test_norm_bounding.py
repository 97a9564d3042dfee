"""Norm bounding (Sun et al., 2019): clipped updates, FedAvg weights.

Golden tests against an independent numpy computation (padding rows hold
NaN or 1e30 and must be ignored; the rule runs under ``jax.jit``), and
FedAvg for a huge bound.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings

from fedjax_agg import testing
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES
from tests.aggregators._util import _assert_update
from tests.aggregators._util import _run
from tests.aggregators._util import garbage_cohort
from tests.aggregators._util import K
from tests.aggregators._util import MASKS


def np_norm_bounding(updates, counts, max_norm):
  """Sun et al. Sec. 3: clip to max_norm, FedAvg weights."""
  norms = np.linalg.norm(updates, axis=1)
  clipped = updates * np.minimum(1.0, max_norm / norms)[:, None]
  return counts @ clipped / counts.sum(), np.mean(norms > max_norm)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("max_norm", [0.5, 6.0, 1e6])
def test_norm_bounding_golden(mask, max_norm):
  global_params, clients, info, updates, counts = garbage_cohort(5, mask)
  out, _, metrics = _run("norm_bounding", global_params, clients, info,
                         max_norm=max_norm)
  expected, fraction = np_norm_bounding(updates, counts, max_norm)
  _assert_update(out, global_params, expected)
  np.testing.assert_allclose(metrics["fraction_clipped"], fraction)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(K))
def test_norm_bounding_with_a_huge_bound_is_fedavg(cohort):
  global_params, clients, info = cohort
  out, _, metrics = _run("norm_bounding", global_params, clients, info,
                         max_norm=1e6)
  expected, _, _ = _run("fedavg", global_params, clients, info)
  tu.assert_trees_close(out, expected, rtol=1e-5, atol=1e-5)
  assert float(metrics["fraction_clipped"]) == 0.0
