"""Shared inputs of the attack tests: a cohort with two malicious clients
and a padding row, the clean and attacked models of its round.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import engine
from fedjax_agg import simulation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining


TRAINING = LocalTraining(batch_size=3, learning_rate=0.2,
                         compute_losses=False)
QUIET = Execution(clients_per_step=2, progress=False)
# Five real clients and a padding row that repeats a malicious id.
IDS = jnp.array([0, 1, 2, 3, 4, 1])
MASK = jnp.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
BAD = (1, 3)
MALICIOUS = np.array([False, True, False, True, False, False])
HONEST = np.array([True, False, True, False, True, False])
KEY = jax.random.key(7)


def _args(data):
  steps = jnp.where(MASK > 0, engine.full_steps(data, IDS, 3, 1), 0)
  return IDS, MASK, jnp.full(IDS.shape, 0.2), steps


def _clean(setup, data=None):
  """The cohort's models without any attack."""
  data0, *_, params, trainer = setup
  data = data0 if data is None else data
  ids, _, lrs, steps = _args(data)
  return jax.jit(trainer)(params, data, ids, lrs, steps, KEY).client_params


def _attacked_fn(setup, attack, adversaries=None, update=None):
  """The jitted attacked update of the cohort: ``fn(state, key)``."""
  data, *_, params, trainer = setup
  update = attacks.with_attack(
      attack, adversaries or attacks.fixed(data.num_clients, ids=BAD),
      trainer if update is None else update)
  ids, mask, lrs, steps = _args(data)
  fn = jax.jit(update.update)
  return lambda state, key: fn(state, params, data, ids, mask, lrs, steps,
                               jnp.int32(1), key)


def _attacked(setup, attack, adversaries=None, state=(), update=None):
  return _attacked_fn(setup, attack, adversaries, update)(state, KEY)


def _flat(stacked):
  """[K, P] numpy: every client's params as one vector."""
  return np.concatenate([np.asarray(a).reshape(a.shape[0], -1)
                         for a in jax.tree.leaves(stacked)], axis=1)


def _flat_one(params):
  return np.concatenate([np.asarray(a).ravel()
                         for a in jax.tree.leaves(params)])


def _check_rows(got, clean, malicious_rows):
  """Non-malicious rows bit-identical to ``clean``; malicious as given."""
  got, clean = _flat(got), _flat(clean)
  np.testing.assert_array_equal(got[~MALICIOUS], clean[~MALICIOUS])
  np.testing.assert_allclose(got[MALICIOUS], malicious_rows, rtol=1e-6,
                             atol=1e-6)


def _honest_numpy(clean, g):
  updates = _flat(clean)[HONEST] - g
  return updates.mean(axis=0), updates.std(axis=0)


def _cohort(malicious, mask=MASK):
  return attacks.Cohort(IDS, mask, jnp.asarray(malicious), jnp.int32(1),
                        KEY)


def _run(setup, attack, ids, rounds=2):
  data, x, y, _, model, *_ = setup
  update = attacks.local_update(model, TRAINING, attack,
                                attacks.fixed(data.num_clients, ids=ids),
                                execution=QUIET)
  return simulation.run(model, data, (x, y), aggregators.fedavg(),
                        num_rounds=rounds, participation=1.0,
                        training=TRAINING, execution=QUIET,
                        local_update=update, seed=0)
