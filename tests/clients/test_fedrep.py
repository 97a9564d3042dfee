"""FedRep: references over rounds and minibatches, fixed leaves bit for
bit in each phase, the table's writes, argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import engine
from fedjax_agg import objectives
from fedjax_agg import tree_math
from fedjax_agg.clients._fedrep import fedrep, train_only
from fedjax_agg.config import LocalTraining, client_optimizer
from tests.clients.test_fedper import (HEAD, SCHEDULE, linear_model,
                                       check_against_reference,
                                       reference_rounds, run_rounds)
from tests.test_engine import reference_client, tiny_data, tiny_model


def _split(tree):
  """(head leaves, body leaves) of a model, in leaf order."""
  pairs = list(zip(tree_math.leaf_paths(tree), jax.tree.leaves(tree),
                   strict=True))
  return ([leaf for path, leaf in pairs if HEAD(path)],
          [leaf for path, leaf in pairs if not HEAD(path)])


def heads_from(update, params, data, cohort, mask, batch_size, epochs,
               learning_rate=0.2):
  """The client state after one local update of ``cohort`` from
  ``params`` (the update alone, no round: its trainers compile once)."""
  cohort, mask = jnp.array(cohort), jnp.array(mask, jnp.float32)
  steps = jnp.where(mask > 0, engine.full_steps(data, cohort, batch_size,
                                                epochs), 0)
  _, state, _ = update.update(
      update.init(data.num_clients), params, data, cohort, mask,
      jnp.full(cohort.shape, learning_rate), steps, 1, jax.random.key(8))
  return state


def test_fedrep_matches_a_client_by_client_reference_over_three_rounds():
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  lr, head_epochs, epochs = 0.3, 3, 2
  # One full batch per epoch: the data order cannot matter.
  training = LocalTraining(epochs=epochs, batch_size=16, learning_rate=lr)
  update = fedrep(model, training, head_epochs=head_epochs,
                  clients_per_step=2)
  rule = aggregators.fedavg("uniform")  # the paper's average
  state = run_rounds(model, rule, training, update, params, data, SCHEDULE)
  glob, heads = reference_rounds(
      model, params, SCHEDULE, x, y, parts, lr,
      [(head_epochs, "head"), (epochs, "body")], HEAD, weighting="uniform")
  check_against_reference(update, state, glob, heads, HEAD, 5)


def test_fedrep_minibatches_match_the_reference_loop_of_each_phase():
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(4))
  lr, batch_size, head_epochs, epochs = 0.2, 3, 2, 2
  momentum = lambda learning_rate: optax.sgd(learning_rate, momentum=0.5)
  training = LocalTraining(epochs=epochs, batch_size=batch_size,
                           learning_rate=lr, optimizer=momentum)
  update = fedrep(model, training, head_epochs=head_epochs,
                  clients_per_step=2)
  # Clients 0 and 3 get their own heads, then client 3 trains beside
  # client 2 (never trained) and a padding row.
  client_state = heads_from(update, params, data, [0, 3, 1], [1, 1, 0],
                            batch_size, epochs)
  cohort = jnp.array([3, 2, 0])
  key = jax.random.key(9)
  full = engine.full_steps(data, cohort, batch_size, epochs)
  mask = jnp.array([1.0, 1.0, 0.0])
  result, _, metrics = update.update(
      client_state, params, data, cohort, mask, jnp.full(3, lr),
      jnp.where(mask > 0, full, 0), 2, key)
  start = update.personalize(client_state, params, cohort)
  paths = tree_math.leaf_paths(params)

  def fixing(part):
    # An optimizer written independently: SGD, then the other part's
    # updates zeroed.
    fixed = jax.tree.unflatten(jax.tree.structure(params), [
        HEAD(p) != (part == "head") for p in paths])
    return lambda learning_rate: optax.chain(
        momentum(learning_rate), optax.masked(optax.set_to_zero(), fixed))

  plain = objectives.cross_entropy()
  for k, client in enumerate(np.asarray(cohort)[:2]):
    own = jax.tree.map(lambda a, k=k: a[k], start)
    after_head, head_steps = reference_client(
        model, own, x, y, parts[client],
        jax.random.fold_in(jax.random.fold_in(key, 1), client), lr,
        batch_size, head_epochs, 10**6, plain, fixing("head"))
    want, body_steps = reference_client(
        model, after_head, x, y, parts[client],
        jax.random.fold_in(key, client), lr, batch_size, epochs, 10**6,
        plain, fixing("body"))
    got = jax.tree.map(lambda a, k=k: a[k], result.client_params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want),
                    strict=True):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    assert int(result.steps_taken[k]) == head_steps + body_steps
  assert metrics["head_train_loss"].shape == (3,)
  assert np.all(np.isfinite(result.train_loss))


@pytest.mark.parametrize("phase", ["head", "body"])
def test_each_phase_leaves_the_other_part_bit_identical(phase):
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(5))
  # Momentum and weight decay would move every leaf they were given.
  training = LocalTraining(epochs=2, batch_size=3, learning_rate=0.2,
                           optimizer=client_optimizer(
                               momentum=0.9, weight_decay=0.5))
  update = fedrep(model, training, head_epochs=2 if phase == "head" else 0,
                  clients_per_step=2)
  client_state = heads_from(update, params, data, [0, 3, 4], [1, 1, 1],
                            3, 2)
  cohort = jnp.array([0, 2, 4])  # client 2 has no head of its own yet
  start = update.personalize(client_state, params, cohort)
  # The head phase alone: no body steps. The body phase alone: no head
  # epochs.
  steps = (jnp.zeros(3, jnp.int32) if phase == "head"
           else engine.full_steps(data, cohort, 3, 2))
  result, table, _ = update.update(
      client_state, params, data, cohort, jnp.ones(3),
      jnp.full(3, 0.2), steps, 3, jax.random.key(1))
  head_start, body_start = _split(start)
  head_got, body_got = _split(result.client_params)
  fixed, moved = ((body_start, body_got), (head_start, head_got))
  if phase == "body":
    fixed, moved = moved, fixed
  for a, b in zip(*fixed, strict=True):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(*moved, strict=True):
    assert np.all(np.any(np.asarray(a != b).reshape(3, -1), axis=1))
  # The table holds the heads the clients leave with.
  for row, leaf in zip(table.local.rows, head_got, strict=True):
    np.testing.assert_array_equal(row[np.asarray(cohort)], leaf)


def test_fedrep_writes_only_real_finite_rows():
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(3))
  update = fedrep(model, LocalTraining(batch_size=4), head_epochs=1,
                  clients_per_step=2)
  cohort = jnp.array([0, 1, 0])  # row 1 diverges, row 2 pads
  result, new, _ = update.update(
      update.init(5), params, data, cohort, jnp.array([1.0, 1.0, 0.0]),
      jnp.array([0.1, jnp.nan, 0.1]), jnp.array([4, 4, 0]), 1,
      jax.random.key(0))
  np.testing.assert_array_equal(new.local.seen, [True] + [False] * 4)
  head_got, _ = _split(result.client_params)
  for row, leaf in zip(new.local.rows, head_got, strict=True):
    np.testing.assert_array_equal(row[0], leaf[0])
    np.testing.assert_array_equal(row[1:], np.zeros_like(row[1:]))
  assert int(result.steps_taken[2]) == 0  # the padding row did nothing
  personal = update.personalize(new, params, jnp.array([1, 4]))
  for a, b in zip(jax.tree.leaves(personal), jax.tree.leaves(params),
                  strict=True):
    np.testing.assert_array_equal(a, jnp.stack([b, b]))


def test_train_only_gives_the_other_leaves_no_update():
  params = {"a": jnp.ones(2), "b": -jnp.zeros(2)}
  make = train_only(client_optimizer(momentum=0.9, weight_decay=1.0),
                    [True, False])
  optimizer = make(learning_rate=0.5)
  grads = {"a": jnp.ones(2), "b": jnp.ones(2)}
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  np.testing.assert_array_equal(updates["b"], [0.0, 0.0])
  np.testing.assert_allclose(updates["a"], [-1.0, -1.0])


def test_fedrep_argument_checks():
  model = tiny_model()
  with pytest.raises(ValueError, match="head_epochs"):
    fedrep(model, head_epochs=-1)
  with pytest.raises(TypeError, match="head_epochs"):
    fedrep(model, head_epochs=1.5)
  with pytest.raises(TypeError, match="head_epochs"):
    fedrep(model, head_epochs=True)
  with pytest.raises(ValueError, match="head is empty"):
    fedrep(model, is_local=lambda path: False)
  with pytest.raises(ValueError, match="body is empty"):
    fedrep(model, is_local=lambda path: True)
  with pytest.raises(ValueError, match="fedrep: no Dense layer"):
    fedrep(linear_model())
  with pytest.raises(TypeError, match="is_local"):
    fedrep(model, is_local=0)
  with pytest.raises(TypeError, match="training"):
    fedrep(model, None)
  with pytest.raises(TypeError, match="fedrep"):
    fedrep(model, epochs=3)
