"""FedAvg against numpy: weighted mean over the real participants."""

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES

RULES = {w: aggregators.fedavg(w) for w in ("num_examples", "uniform")}
AGG = {w: jax.jit(rule.aggregate) for w, rule in RULES.items()}


@pytest.mark.parametrize("weighting", sorted(RULES))
@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=st.lists(
    st.sampled_from([0.0, 1.0]), min_size=5, max_size=5).filter(any))
def test_golden(weighting, seed, mask):
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 5)
  num_examples = rng.integers(1, 60, size=5).astype(float)
  mask = np.asarray(mask)
  info = tu.make_info(np.arange(5), num_examples, mask)
  out, _, metrics = AGG[weighting](global_params, clients, info,
                                   RULES[weighting].init(global_params))
  raw = num_examples if weighting == "num_examples" else np.ones(5)
  p = np.where(mask > 0, raw, 0.0) / np.sum(np.where(mask > 0, raw, 0.0))
  np.testing.assert_allclose(metrics["client_weights"], p, rtol=1e-6)
  tu.assert_trees_close(
      out, jax.tree.map(lambda c: np.tensordot(p, np.asarray(c), axes=1),
                        clients), rtol=1e-5, atol=1e-6)
