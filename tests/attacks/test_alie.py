""""A little is enough" (Baruch et al., NeurIPS 2019) against numpy, and
the paper's z_max.
"""

import math

import jax
import numpy as np

from fedjax_agg import attacks
from tests.attacks._util import _attacked
from tests.attacks._util import _check_rows
from tests.attacks._util import _clean
from tests.attacks._util import _flat
from tests.attacks._util import _flat_one
from tests.attacks._util import _honest_numpy
from tests.attacks._util import MALICIOUS


def _normal_ppf(p):
  """Φ^{-1}(p) by bisection on math.erf."""
  low, high = -10.0, 10.0
  for _ in range(200):
    mid = (low + high) / 2
    if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
      low = mid
    else:
      high = mid
  return (low + high) / 2


def test_little_is_enough_matches_numpy(setup):
  params = setup[5]
  clean = _clean(setup)
  g = _flat_one(params)
  mu, sigma = _honest_numpy(clean, g)
  # n = 5 real, m = 2 malicious: s = floor(3.5) - 2 = 1, z = Φ^-1(4/5).
  z = _normal_ppf(4 / 5)
  result, _, _ = _attacked(setup, attacks.little_is_enough())
  want = np.broadcast_to(g + mu - z * sigma, (2, g.size))
  np.testing.assert_allclose(_flat(result.client_params)[MALICIOUS], want,
                             rtol=1e-5, atol=1e-6)
  _check_rows(result.client_params, clean, want)
  fixed_z, _, _ = _attacked(setup, attacks.little_is_enough(z=1.5))
  _check_rows(fixed_z.client_params, clean,
              np.broadcast_to(g + mu - 1.5 * sigma, (2, g.size)))


def test_default_z_is_the_papers_z_max():
  # n = 50, m = 10: s = floor(26) - 10 = 16, z = Φ^-1((50 - 16) / 50).
  np.testing.assert_allclose(attacks.little_is_enough_z(50, 10),
                             _normal_ppf(34 / 50), rtol=1e-5)
  # A malicious majority needs nobody: s is taken as 1.
  np.testing.assert_allclose(attacks.little_is_enough_z(10, 8),
                             _normal_ppf(9 / 10), rtol=1e-5)
  assert np.isfinite(jax.jit(attacks.little_is_enough_z)(7, 3))
