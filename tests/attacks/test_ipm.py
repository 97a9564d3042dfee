"""The inner-product manipulation (Xie et al., UAI 2020) against numpy."""

import numpy as np

from fedjax_agg import attacks
from tests.attacks._util import _attacked
from tests.attacks._util import _check_rows
from tests.attacks._util import _clean
from tests.attacks._util import _flat_one
from tests.attacks._util import _honest_numpy


def test_inner_product_matches_numpy(setup):
  params = setup[5]
  clean = _clean(setup)
  g = _flat_one(params)
  mu, _ = _honest_numpy(clean, g)
  result, _, _ = _attacked(setup, attacks.inner_product(epsilon=0.1))
  _check_rows(result.client_params, clean,
              np.broadcast_to(g - 0.1 * mu, (2, g.size)))
