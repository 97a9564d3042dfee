"""``compose`` chains the data and update sides of two attacks."""

import numpy as np

from fedjax_agg import attacks
from tests.attacks._util import _attacked
from tests.attacks._util import _check_rows
from tests.attacks._util import _clean
from tests.attacks._util import _flat
from tests.attacks._util import _flat_one
from tests.attacks._util import MALICIOUS


def test_compose_chains_both_sides(setup):
  params = setup[5]
  clean = _clean(setup)
  g = _flat_one(params)[None]
  result, _, _ = _attacked(setup, attacks.compose(
      attacks.sign_flip(), attacks.scale_update(3.0)))
  _check_rows(result.client_params, clean,
              g - 3.0 * (_flat(clean)[MALICIOUS] - g))
  both = attacks.compose(attacks.label_flip(), attacks.free_rider())
  assert both.data is not None and both.update is not None
  result, _, _ = _attacked(setup, both)
  _check_rows(result.client_params, clean, np.broadcast_to(g, (2, 75)))
