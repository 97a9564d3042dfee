"""The omniscient attacks read only the honest clients' updates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import attacks
from tests.attacks._util import _clean
from tests.attacks._util import _cohort
from tests.attacks._util import _flat
from tests.attacks._util import _flat_one
from tests.attacks._util import MALICIOUS
from tests.attacks._util import MASK


@pytest.mark.parametrize("attack", [attacks.little_is_enough(),
                                    attacks.inner_product(epsilon=2.0)])
def test_omniscient_attacks_read_only_honest_updates(setup, attack):
  params = setup[5]
  clean = _clean(setup)
  update = jax.jit(attack.update)
  want = update(params, clean, _cohort(MALICIOUS))
  # A malicious client's own model, or a padding row's, changes nothing.
  changed = jax.tree.map(
      lambda a: a.at[1].set(jnp.nan).at[3].add(100.0).at[5].set(jnp.inf),
      clean)
  got = update(params, changed, _cohort(MALICIOUS))
  np.testing.assert_array_equal(_flat(got)[MALICIOUS],
                                _flat(want)[MALICIOUS])
  # Without an honest client the malicious clients send g.
  everyone = update(params, clean, _cohort(MASK > 0))
  np.testing.assert_array_equal(
      _flat(everyone), np.broadcast_to(_flat_one(params), (6, 75)))
