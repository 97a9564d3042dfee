"""The one-call engine equals a plain per-client Python reference loop."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import engine
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg.types import Model
from fedjax_agg.config import LocalTraining

from tests import agg_testutil as tu


class _MLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.relu(nn.Dense(8)(x.reshape((x.shape[0], -1))))
    return nn.Dense(3)(x)


# One object (models are immutable): runs of it share their compiled
# evaluation, as runs of ``models.get`` with equal options do.
@functools.cache
def tiny_model() -> Model:
  module = _MLP()
  return Model(
      init=lambda key: module.init(key, jnp.zeros((1, 5))),
      apply=lambda params, x, train: (module.apply(params, x), params))


SIZES = (7, 13, 4, 10, 1)  # unequal on purpose; B = 3 leaves partial batches


def tiny_data(sizes=SIZES, seed=0):
  rng = np.random.default_rng(seed)
  total = sum(sizes)
  x = rng.normal(size=(total, 5)).astype(np.float32)
  y = rng.integers(0, 3, size=total)
  perm = rng.permutation(total)
  bounds = np.cumsum((0,) + tuple(sizes))
  parts = [perm[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
  return federated.from_partition(x, y, parts), x, y, parts


def reference_client(model, params, x, y, indices, key, lr, batch_size,
                     num_epochs, max_steps, objective, optimizer_factory):
  """Trains one client alone with a Python loop of jitted steps."""
  global_params = params
  loss_fn = objectives.local_loss(model, objective)
  optimizer = optimizer_factory(learning_rate=lr)
  opt_state = optimizer.init(params)
  n = len(indices)

  @jax.jit
  def step(params, opt_state, xb, yb, context):
    batch = {"x": xb, "y": yb, "mask": jnp.ones(len(yb))}
    grads, _ = jax.grad(loss_fn, has_aux=True)(params, batch, global_params,
                                               context)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  steps = 0
  for epoch in range(num_epochs):
    context = objective.prepare(params, global_params)
    # Alone, the client's padded width is its own size.
    order = np.asarray(engine.epoch_order(jax.random.fold_in(key, epoch), n,
                                          n))
    for start in range(0, n, batch_size):
      if steps >= max_steps:
        return params, steps
      ix = indices[order[start:start + batch_size]]
      params, opt_state = step(params, opt_state, x[ix], y[ix], context)
      steps += 1
  return params, steps


@pytest.mark.parametrize("clients_per_step", [1, 2, 5])
@pytest.mark.parametrize("limit_steps", [False, True])
def test_engine_matches_reference_loop(clients_per_step, limit_steps):
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  batch_size, num_epochs = 3, 2
  client_ids = jnp.array([3, 0, 4, 1, 2])
  lrs = jnp.array([0.1, 0.05, 0.2, 0.1, 0.3])
  if limit_steps:
    num_steps = jnp.array([1, 4, 0, 7, 2])
  else:
    num_steps = engine.full_steps(data, client_ids, batch_size, num_epochs)
  objective = objectives.fedprox(mu=0.3)
  optimizer = functools.partial(optax.sgd, momentum=0.5)
  train = engine.make_local_trainer(model,
      LocalTraining(batch_size=batch_size, epochs=num_epochs,
                    objective=objective, optimizer=optimizer),
      clients_per_step=clients_per_step)
  key = jax.random.key(7)
  result = train(params, data, client_ids, lrs, num_steps, key)
  for k, cid in enumerate(np.asarray(client_ids)):
    ref, ref_steps = reference_client(
        model, params, x, y, parts[cid], jax.random.fold_in(key, cid),
        float(lrs[k]), batch_size, num_epochs, int(num_steps[k]), objective,
        optimizer)
    assert int(result.steps_taken[k]) == ref_steps
    got = jax.tree.map(lambda a, k=k: a[k], result.client_params)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
        got, ref)


def test_losses_before_and_after_match_numpy():
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  train = engine.make_local_trainer(model,
      LocalTraining(batch_size=4, epochs=3, eval_batch_size=3),
      clients_per_step=2)
  ids = jnp.arange(5)
  result = train(params, data, ids, jnp.full(5, 0.5),
                 engine.full_steps(data, ids, 4, 3), jax.random.key(0))

  def np_loss(p, ix):
    # The reference's own products at full precision (a GPU would use TF32).
    with jax.default_matmul_precision("highest"):
      logits, _ = model.apply(p, x[ix], False)
    logits = np.asarray(logits, np.float64)
    logz = np.log(np.exp(logits).sum(1))
    return float(np.mean(logz - logits[np.arange(len(ix)), y[ix]]))

  for k in range(5):
    np.testing.assert_allclose(result.loss_before[k], np_loss(params,
                                                              parts[k]),
                               rtol=1e-5)
    after = jax.tree.map(lambda a, k=k: a[k], result.client_params)
    np.testing.assert_allclose(result.loss_after[k], np_loss(after, parts[k]),
                               rtol=1e-5)
  # Training lowered every client's own loss.
  assert np.all(np.asarray(result.loss_after) < np.asarray(result.loss_before))


def test_zero_steps_leave_params_unchanged_and_no_retrace():
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  train = engine.make_local_trainer(model,
      LocalTraining(batch_size=3, epochs=1), clients_per_step=2)
  ids = jnp.array([0, 1, 2])
  result = train(params, data, ids, jnp.full(3, 0.1), jnp.zeros(3, jnp.int32),
                 jax.random.key(0))
  for leaf, ref in zip(jax.tree.leaves(result.client_params),
                       jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(leaf, np.broadcast_to(ref, leaf.shape))
  train(params, data, jnp.array([2, 3, 4]), jnp.full(3, 0.2),
        jnp.ones(3, jnp.int32), jax.random.key(1))
  assert train._cache_size() == 1


def test_bad_arguments_are_named():
  with pytest.raises(ValueError, match="batch_size"):
    engine.make_local_trainer(tiny_model(),
        LocalTraining(batch_size=0, epochs=1))
  with pytest.raises(ValueError, match="client_indices"):
    federated.from_partition(np.zeros((3, 2)), np.zeros(3), [np.array([5])])


def _training_dot_precisions(matmul_precision):
  data, _, _, _ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  train = engine.make_local_trainer(
      model, LocalTraining(batch_size=4, compute_losses=True,
                           matmul_precision=matmul_precision),
      clients_per_step=2)
  ids = jnp.arange(5)
  return tu.dot_precisions(jax.make_jaxpr(train)(
      params, data, ids, jnp.full(5, 0.5), engine.full_steps(data, ids, 4, 1),
      jax.random.key(0)))


def test_local_training_products_carry_the_requested_precision():
  highest = jax.lax.Precision.HIGHEST
  found = _training_dot_precisions("highest")
  # Forward, backward and the loss passes: every product asks for float32.
  assert len(found) >= 6
  assert all(p == (highest, highest) for p in found), found
  # "default" leaves the products to the backend (TF32 on a GPU).
  assert all(p is None for p in _training_dot_precisions("default"))


def _dot_operand_dtypes(jaxpr):
  return [tuple(str(v.aval.dtype) for v in eqn.invars)
          for eqn in tu.dot_generals(jaxpr)]


def test_bfloat16_mode_trains_bfloat16_products_on_float32_weights():
  data, _, _, _ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  ids = jnp.arange(5)
  args = (params, data, ids, jnp.full(5, 0.5),
          engine.full_steps(data, ids, 4, 2), jax.random.key(0))
  trained = {}
  for precision in ("highest", "bfloat16"):
    train = engine.make_local_trainer(
        model, LocalTraining(batch_size=4, epochs=2,
                             matmul_precision=precision), clients_per_step=2)
    found = _dot_operand_dtypes(jax.make_jaxpr(train)(*args))
    want = "bfloat16" if precision == "bfloat16" else "float32"
    assert len(found) >= 3 and all(d == (want, want) for d in found), found
    trained[precision] = jax.jit(train)(*args).client_params
  # Master weights stay float32 and follow float32 training to within
  # bfloat16 rounding (8 mantissa bits: 2^-8 relative per operand), not
  # to float32's.
  for leaf, reference in zip(jax.tree.leaves(trained["bfloat16"]),
                             jax.tree.leaves(trained["highest"]),
                             strict=True):
    assert leaf.dtype == jnp.float32
    scale = float(jnp.max(jnp.abs(reference)))
    error = float(jnp.max(jnp.abs(leaf - reference)))
    assert 0 < error < 0.05 * scale, (error, scale)


def test_matmul_precision_is_checked_by_name():
  with pytest.raises(ValueError, match="matmul_precision"):
    LocalTraining(matmul_precision="tf32")


def test_local_steps_copy_no_client_model_beyond_what_the_update_needs():
  # From the compiled program (XLA's memory_analysis): working memory does
  # not grow with the number of local steps (no per-step copy of the
  # stacked client models), and each client side by side adds at most 3
  # models' worth: its parameters (the loop carry), its gradient and the
  # updated parameters before they replace the carry. mlp2 at batch 5:
  # the weights dominate the activations.
  model = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(160, 28, 28, 1)).astype(np.float32)
  data = federated.from_partition(x, rng.integers(0, 10, 160),
                                  list(np.array_split(np.arange(160), 8)))
  params = model.init(jax.random.key(0))
  model_bytes = sum(a.nbytes for a in jax.tree.leaves(params))
  temp = {}
  for epochs in (1, 4):
    for width in (2, 8):
      train = engine.make_local_trainer(
          model, LocalTraining(batch_size=5, epochs=epochs),
          clients_per_step=width)
      ids = jnp.arange(width, dtype=jnp.int32)
      compiled = jax.jit(train).lower(
          params, data, ids, jnp.full((width,), 0.1),
          engine.full_steps(data, ids, 5, epochs),
          jax.random.key(1)).compile()
      temp[epochs, width] = compiled.memory_analysis().temp_size_in_bytes
  # 4x the steps: a copy of even one client's model per step would add
  # 12 models; the step schedule's index arrays add kilobytes.
  for width in (2, 8):
    assert temp[4, width] - temp[1, width] < 0.5 * model_bytes
  per_client = (temp[1, 8] - temp[1, 2]) / 6
  if jax.default_backend() == "cpu":
    # XLA:GPU adds per-client matrix-product scratch that is no copy of
    # the model (a cuBLAS workspace, split-K partial sums: 11.2 models'
    # worth here on an H200, experiments/bench/README.md), so this bound
    # states what the CPU compiler's buffers hold.
    assert per_client <= 3 * model_bytes, per_client / model_bytes
