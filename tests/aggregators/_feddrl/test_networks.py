"""FedDRL's impact factors (Eq. (5)-(6)): a masked softmax of the
Gaussian sample, against numpy.
"""

import jax
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fedjax_agg.aggregators._feddrl import networks
from tests.aggregators._feddrl._util import K


def np_softmax(z):
  e = np.exp(z - z.max())
  return e / e.sum()


@given(seed=st.integers(0, 10_000),
       mask=st.lists(st.booleans(), min_size=K, max_size=K))
def test_impact_factors_are_a_masked_softmax_of_the_gaussian_sample(seed,
                                                                    mask):
  rng = np.random.default_rng(seed)
  mu = rng.uniform(0, 3, K).astype(np.float32)
  sigma = (0.4 * mu * rng.uniform(0, 1, K)).astype(np.float32)
  mask = np.asarray(mask, np.float32)
  key = jax.random.PRNGKey(seed)
  alpha = np.asarray(jax.jit(networks.impact_factors)(key, mu, sigma, mask))
  sample = mu + sigma * np.asarray(jax.random.normal(key, (K,)))
  expected = np.zeros(K)
  if mask.any():
    expected[mask > 0] = np_softmax(sample[mask > 0].astype(np.float64))
  np.testing.assert_allclose(alpha, expected, rtol=1e-5, atol=1e-7)
