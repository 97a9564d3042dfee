"""The coordinate-wise trimmed mean (Yin et al., ICML 2018): numpy's
Definition 2, the trimmed count, bad beta.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from tests import agg_testutil as tu
from tests.aggregators._util import _cohort
from tests.aggregators._util import K
from tests.aggregators._util import TRIMMED
from tests.aggregators._util import TRIMMED_AGG


def np_trimmed_mean(values, beta):
  """Yin et al. Definition 2 on [m, ...] values (floor(beta m) per end)."""
  num = values.shape[0]
  cut = int(np.floor(beta * num + 1e-9))
  return np.mean(np.sort(values, axis=0)[cut:num - cut], axis=0)


@pytest.mark.parametrize("beta", sorted(TRIMMED))
def test_trimmed_mean_golden(beta):
  for seed, mask in enumerate([[1] * K, [1, 0, 1, 1, 0, 1], [0, 0, 1, 0, 0,
                                                                0]]):
    global_params, clients, info, real = _cohort(seed, mask)
    out, _, metrics = TRIMMED_AGG[beta](global_params, clients, info,
                                        TRIMMED[beta].init(global_params))
    expected = jax.tree.map(
        lambda c, rows=real: np_trimmed_mean(np.asarray(c)[rows], beta),
        clients)
    tu.assert_trees_close(out, expected, rtol=1e-5, atol=1e-6)
    assert int(metrics["num_trimmed"]) == int(np.floor(beta * len(real)
                                                       + 1e-9))


def test_trimmed_count_is_exact_for_decimal_beta():
  # float32(0.35) * 20 = 6.9999998: the count must still be 7.
  rule = aggregators.trimmed_mean(0.35)
  params = {"w": jnp.zeros((1,))}
  clients = {"w": jnp.arange(20.0).reshape(20, 1)}
  info = tu.make_info(np.arange(20) % tu.NUM_CLIENTS, np.ones(20))
  out, _, metrics = jax.jit(rule.aggregate)(params, clients, info,
                                            rule.init(params))
  assert int(metrics["num_trimmed"]) == 7
  np.testing.assert_allclose(out["w"], [np.mean(np.arange(7.0, 13.0))])


def test_bad_beta_raises():
  for beta in (-0.1, 0.5, 0.7):
    with pytest.raises(ValueError, match="beta"):
      aggregators.trimmed_mean(beta)
