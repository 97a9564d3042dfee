"""Model poisoning (sign flip, scaling, free riding, non-finite values,
Gaussian noise) against its formula in numpy; a run excludes the
non-finite clients.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import attacks
from tests.attacks._util import _attacked
from tests.attacks._util import _attacked_fn
from tests.attacks._util import _check_rows
from tests.attacks._util import _clean
from tests.attacks._util import _flat
from tests.attacks._util import _flat_one
from tests.attacks._util import _run
from tests.attacks._util import KEY
from tests.attacks._util import MALICIOUS


@pytest.mark.parametrize("attack, formula", [
    (attacks.sign_flip(), lambda w, g: g - (w - g)),
    (attacks.sign_flip(scale=2.5), lambda w, g: g - 2.5 * (w - g)),
    (attacks.scale_update(5.0), lambda w, g: g + 5.0 * (w - g)),
    (attacks.free_rider(), lambda w, g: np.broadcast_to(g, w.shape)),
    (attacks.nonfinite(), lambda w, g: np.full_like(w, np.nan)),
    (attacks.nonfinite(-math.inf), lambda w, g: np.full_like(w, -np.inf)),
])
def test_update_attacks_follow_their_formula(setup, attack, formula):
  params = setup[5]
  clean = _clean(setup)
  result, state, metrics = _attacked(setup, attack)
  g = _flat_one(params)[None]
  _check_rows(result.client_params, clean,
              formula(_flat(clean)[MALICIOUS], g))
  assert state == ()
  np.testing.assert_array_equal(metrics["malicious"], MALICIOUS)
  assert float(metrics["num_malicious"]) == 2.0


def test_gaussian_is_noise_around_the_global_model(setup):
  params = setup[5]
  clean = _clean(setup)
  attacked = _attacked_fn(setup, attacks.gaussian(stddev=0.5))
  got = _flat(attacked((), KEY)[0].client_params)
  np.testing.assert_array_equal(got[~MALICIOUS], _flat(clean)[~MALICIOUS])
  noise = got[MALICIOUS] - _flat_one(params)[None]
  assert 0.4 < noise.std() < 0.6 and abs(noise.mean()) < 0.1
  assert not np.allclose(noise[0], noise[1])  # independent per client
  np.testing.assert_array_equal(
      _flat(attacked((), KEY)[0].client_params), got)
  other = _flat(attacked((), jax.random.key(8))[0].client_params)
  assert not np.allclose(other[MALICIOUS], got[MALICIOUS])


def test_nonfinite_clients_are_excluded_by_the_round(setup):
  result = _run(setup, attacks.nonfinite(), (1,))
  assert [row["nonfinite_clients"] for row in result.history.rows[1:]] == [
      1, 1]
  assert all(np.isfinite(leaf).all()
             for leaf in jax.tree.leaves(result.state.params))


@pytest.mark.parametrize("attack, from_global", [
    (attacks.sign_flip(), False), (attacks.scale_update(5.0), False),
    (attacks.nonfinite(), False), (attacks.gaussian(stddev=0.5), True),
    (attacks.free_rider(), True),
])
def test_integer_leaves_come_from_the_model_the_formula_starts_from(
    attack, from_global):
  # The module docstring's contract: an integer leaf is sent as trained
  # by the attacks that transform w_k, as received by those that send a
  # model built from g alone.
  global_params = {"w": jnp.zeros((3,), jnp.float32),
                   "steps": jnp.asarray(5, jnp.int32)}
  trained = {"w": jnp.ones((2, 3), jnp.float32),
             "steps": jnp.asarray([7, 8], jnp.int32)}
  cohort = attacks.Cohort(jnp.asarray([0, 1]), jnp.ones(2),
                          jnp.ones(2, bool), jnp.int32(1), KEY)
  sent = jax.jit(attack.update)(global_params, trained, cohort)
  assert sent["steps"].dtype == jnp.int32
  np.testing.assert_array_equal(sent["steps"],
                                [5, 5] if from_global else [7, 8])
