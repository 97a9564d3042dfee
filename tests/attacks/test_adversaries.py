"""Who is malicious: ``per_round`` draws floor(fraction m) of each round's
real clients, ``fixed`` the same clients every round.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import attacks
from tests.attacks._util import _attacked
from tests.attacks._util import _flat
from tests.attacks._util import _flat_one


def test_per_round_picks_floor_fraction_of_the_real_clients():
  for fraction, size, real in [(0.5, 6, 5), (0.7, 12, 10), (0.3, 10, 10),
                               (0.0, 4, 4), (0.99, 8, 1)]:
    select = jax.jit(attacks.per_round(fraction).select)
    ids = jnp.arange(size)
    mask = jnp.arange(size) < real
    picks = []
    for seed in range(6):
      chosen = np.asarray(select(ids, mask.astype(jnp.float32),
                                 jax.random.key(seed)))
      assert chosen.sum() == math.floor(fraction * real)
      assert not chosen[real:].any()
      np.testing.assert_array_equal(
          chosen, select(ids, mask.astype(jnp.float32),
                         jax.random.key(seed)))
      picks.append(tuple(chosen))
    if 0 < math.floor(fraction * real) < real:
      assert len(set(picks)) > 1


def test_per_round_through_the_wrapper(setup):
  result, _, metrics = _attacked(setup, attacks.free_rider(),
                                 attacks.per_round(0.5))
  chosen = np.asarray(metrics["malicious"]) > 0
  assert chosen.sum() == 2 and not chosen[5]
  params = setup[5]
  np.testing.assert_array_equal(
      _flat(result.client_params)[chosen],
      np.broadcast_to(_flat_one(params), (2, 75)))


def test_fixed_picks_the_same_clients_every_round():
  adversaries = attacks.fixed(20, 0.25, seed=3)
  table = np.asarray(adversaries.table)
  assert table.sum() == 5
  np.testing.assert_array_equal(attacks.fixed(20, count=5, seed=3).table,
                                table)
  assert not np.array_equal(attacks.fixed(20, 0.25, seed=4).table, table)
  ids = jnp.array([3, 0, 17, 9, 12, 5, 3])
  mask = jnp.array([1, 1, 1, 1, 1, 1, 0.0])
  select = jax.jit(adversaries.select)
  for seed in range(3):
    chosen = np.asarray(select(ids, mask, jax.random.key(seed)))
    np.testing.assert_array_equal(chosen[:6], table[np.asarray(ids)][:6])
    assert not chosen[6]
  assert np.asarray(attacks.fixed(4, ids=[2]).table).tolist() == [
      False, False, True, False]
