"""A model whose rows are independent (``engine.ROWS_INDEPENDENT``) trains
its last batch of an epoch without the rows that only pad: the engine
still equals the per-client reference loop, with fewer products."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import engine
from fedjax_agg import objectives
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import Model

from tests import test_engine


@functools.cache
def rows_independent_model() -> Model:
  model = test_engine.tiny_model()

  def apply(params, x, train):
    return model.apply(params, x, train)
  setattr(apply, engine.ROWS_INDEPENDENT, True)
  return model._replace(apply=apply)


def _trainer(model, unroll, clients_per_step, batch_size=3, num_epochs=2):
  return engine.make_local_trainer(
      model, LocalTraining(batch_size=batch_size, epochs=num_epochs,
                           objective=objectives.fedprox(mu=0.3),
                           optimizer=functools.partial(optax.sgd,
                                                       momentum=0.5),
                           unroll=unroll),
      clients_per_step=clients_per_step)


@pytest.mark.parametrize("unroll", [1, 2])
@pytest.mark.parametrize("clients_per_step", [1, 2, 5])
@pytest.mark.parametrize("limit_steps", [False, True])
def test_a_short_last_batch_equals_the_reference_loop(unroll,
                                                      clients_per_step,
                                                      limit_steps):
  # Sizes 7, 13, 4, 10, 1 in batches of 3: the widest client's last step
  # holds 1 row, the others' partial batches fall in earlier steps.
  data, x, y, parts = test_engine.tiny_data()
  model = rows_independent_model()
  params = model.init(jax.random.key(1))
  client_ids = jnp.array([3, 0, 4, 1, 2])
  lrs = jnp.array([0.1, 0.05, 0.2, 0.1, 0.3])
  num_steps = (jnp.array([1, 4, 0, 7, 2]) if limit_steps else
               engine.full_steps(data, client_ids, 3, 2))
  key = jax.random.key(7)
  result = _trainer(model, unroll, clients_per_step)(
      params, data, client_ids, lrs, num_steps, key)
  for k, cid in enumerate(np.asarray(client_ids)):
    ref, ref_steps = test_engine.reference_client(
        model, params, x, y, parts[cid], jax.random.fold_in(key, cid),
        float(lrs[k]), 3, 2, int(num_steps[k]), objectives.fedprox(mu=0.3),
        functools.partial(optax.sgd, momentum=0.5))
    assert int(result.steps_taken[k]) == ref_steps
    got = jax.tree.map(lambda a, k=k: a[k], result.client_params)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
        got, ref)


@pytest.mark.parametrize("unroll", [1, 2])
def test_the_padding_rows_are_left_out_of_the_program(unroll):
  data, _, _, _ = test_engine.tiny_data()
  params = test_engine.tiny_model().init(jax.random.key(1))

  def rows_trained(independent):
    """The batch sizes that the traced training steps take."""
    model, seen = test_engine.tiny_model(), set()

    def apply(params, x, train):
      if train:
        seen.add(x.shape[0])
      return model.apply(params, x, train)
    if independent:
      setattr(apply, engine.ROWS_INDEPENDENT, True)
    train = _trainer(model._replace(apply=apply), unroll, clients_per_step=5)
    train(params, data, jnp.arange(5), jnp.full((5,), 0.1),
          jnp.full((5,), 99), jax.random.key(0))
    return seen
  # The widest client holds 13 examples: 4 batches of 3, then 1 row.
  assert rows_trained(False) == {3}
  assert rows_trained(True) == {3, 1}
