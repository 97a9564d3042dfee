"""Stragglers: budgets drawn as documented, and training that stops there."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import engine
from fedjax_agg import objectives
from fedjax_agg import stragglers
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg import rounds as rounds_lib
from tests.test_engine import reference_client
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

FULL = jnp.array([12, 30, 6, 18, 24, 3, 9, 15, 21, 27], jnp.int32)  # E = 3


@pytest.mark.parametrize("fraction,expected", [(0.0, 0), (0.5, 5),
                                               (0.9, 9), (0.25, 3),
                                               (1.0, 10)])
def test_epoch_budgets(fraction, expected):
  draw = jax.jit(lambda k: stragglers.straggler_steps(k, FULL, fraction, 3))
  for seed in range(20):
    steps = np.asarray(draw(jax.random.key(seed)))
    full = np.asarray(FULL)
    per_epoch = full // 3
    short = steps != full
    assert short.sum() <= expected
    # Stragglers run 1..E whole epochs; everyone else all E.
    assert np.all(steps % per_epoch == 0)
    assert np.all((steps >= per_epoch) & (steps <= full))
    mask = stragglers.straggler_mask(
        jax.random.split(jax.random.key(seed))[0], 10, fraction)
    assert int(mask.sum()) == expected
    np.testing.assert_array_equal(steps[~np.asarray(mask)],
                                  full[~np.asarray(mask)])


def test_drawn_epochs_are_uniform_and_seeded():
  keys = jax.random.split(jax.random.key(0), 400)
  steps = jax.vmap(lambda k: stragglers.straggler_steps(k, FULL, 1.0, 3))(
      keys)
  epochs = np.asarray(steps) // (np.asarray(FULL) // 3)
  counts = np.bincount(epochs.ravel(), minlength=4)[1:]
  assert counts.sum() == 4000
  assert np.all(np.abs(counts / 4000 - 1 / 3) < 0.03)
  a = stragglers.straggler_steps(jax.random.key(5), FULL, 0.5, 3)
  b = stragglers.straggler_steps(jax.random.key(5), FULL, 0.5, 3)
  c = stragglers.straggler_steps(jax.random.key(6), FULL, 0.5, 3)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


def test_step_budgets_cover_one_to_full():
  keys = jax.random.split(jax.random.key(1), 300)
  steps = np.asarray(jax.vmap(
      lambda k: stragglers.straggler_steps(k, FULL, 1.0, 3, unit="steps"))(
          keys))
  full = np.asarray(FULL)
  assert np.all((steps >= 1) & (steps <= full))
  # The smallest client (3 steps) takes every value in {1, 2, 3}.
  assert set(steps[:, 5].tolist()) == {1, 2, 3}
  assert steps.min() == 1 and np.any(steps == full)


def test_straggler_params_equal_training_alone_for_its_steps():
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(2))
  batch_size, num_epochs = 3, 3
  ids = jnp.array([0, 1, 3, 2])
  full = engine.full_steps(data, ids, batch_size, num_epochs)
  num_steps = stragglers.straggler_steps(jax.random.key(4), full, 0.5,
                                         num_epochs, unit="steps")
  assert int(jnp.sum(num_steps != full)) >= 1
  objective = objectives.fedprox(mu=0.1)
  train = engine.make_local_trainer(model,
      LocalTraining(batch_size=batch_size, epochs=num_epochs,
                    objective=objective),
      clients_per_step=4)
  key = jax.random.key(8)
  result = train(params, data, ids, jnp.full(4, 0.2), num_steps, key)
  np.testing.assert_array_equal(result.steps_taken, num_steps)
  for k, cid in enumerate(np.asarray(ids)):
    ref, ref_steps = reference_client(
        model, params, x, y, parts[cid], jax.random.fold_in(key, cid), 0.2,
        batch_size, num_epochs, int(num_steps[k]), objective, optax.sgd)
    assert ref_steps == int(num_steps[k])
    got = jax.tree.map(lambda a, k=k: a[k], result.client_params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5,
                                                         atol=2e-6), got, ref)


def test_hook_drives_the_round_function():
  data, *_ = tiny_data()
  model = tiny_model()
  aggregator = aggregators.fedavg()
  hook = stragglers.stragglers(0.5, 2)
  round_fn = rounds_lib.make_round_fn(model, aggregator,
      training=LocalTraining(batch_size=3, epochs=2, learning_rate=0.1,
                             steps_fn=hook),
      execution=Execution(clients_per_step=4))
  state = rounds_lib.init_state(model.init(jax.random.key(0)), aggregator,
                                seed=1)
  cohort = jnp.array([4, 1, 2, 0])
  _, out = round_fn(state, data, cohort, jnp.ones(4))
  steps_key = jax.random.split(state.key, 4)[3]
  expected = hook(steps_key, engine.full_steps(data, cohort, 3, 2))
  np.testing.assert_array_equal(out.steps_taken, expected)


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="fraction"):
    stragglers.stragglers(1.5, 2)
  with pytest.raises(ValueError, match="num_epochs"):
    stragglers.stragglers(0.5, 0)
  with pytest.raises(ValueError, match="unit"):
    stragglers.straggler_steps(jax.random.key(0), FULL, 0.5, 3, unit="x")
  with pytest.raises(ValueError, match="full_steps"):
    stragglers.straggler_steps(jax.random.key(0), FULL[None], 0.5, 3)
