"""The coordinate-wise median (Yin et al., ICML 2018) against numpy."""

import jax
import numpy as np
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES
from tests.aggregators._util import _cohort
from tests.aggregators._util import K
from tests.aggregators._util import MEDIAN
from tests.aggregators._util import MEDIAN_AGG


MASKS = st.lists(st.sampled_from([0.0, 1.0]), min_size=K,
                 max_size=K).filter(any)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=MASKS)
def test_median_golden(seed, mask):
  global_params, clients, info, real = _cohort(seed, mask)
  out, _, _ = MEDIAN_AGG(global_params, clients, info,
                         MEDIAN.init(global_params))
  expected = jax.tree.map(lambda c: np.median(np.asarray(c)[real], axis=0),
                          clients)
  tu.assert_trees_close(out, expected, rtol=1e-6, atol=1e-6)
