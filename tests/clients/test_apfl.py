"""APFL: a step-by-step reference over rounds, the alpha = 0 and alpha = 1
identities, the table's writes, argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import engine
from fedjax_agg import objectives
from fedjax_agg import rounds
from fedjax_agg.clients._apfl import apfl, mix
from fedjax_agg.config import Execution, LocalTraining
from tests.clients._util import bn_model
from tests.clients.test_fedper import average_leaves, SCHEDULE, run_rounds
from tests.test_engine import tiny_data, tiny_model


def _loss_grad(model):
  def loss(params, x, y):
    logits, _ = model.apply(params, x, True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  return jax.jit(jax.grad(loss))


def reference_apfl(model, params, schedule, x, y, parts, lr, alpha_lr,
                   alpha0, steps):
  """Algorithm 1 with full-batch steps, one client at a time: each step
  from (w, v, alpha), w -= lr g(w), v -= lr alpha g(v_bar), alpha -=
  alpha_lr <v - w, g(v_bar)> clipped to [0, 1]; the server averages the w
  in float64 by examples. Returns (global leaves, {client: (v leaves,
  alpha)})."""
  grad = _loss_grad(model)
  treedef = jax.tree.structure(params)
  glob = [np.asarray(a, np.float64) for a in jax.tree.leaves(params)]
  personal = {}
  for cohort, mask in schedule:
    trained, weights = [], []
    for client, real in zip(cohort, mask, strict=True):
      if not real:
        continue
      xs, ys = x[parts[client]], y[parts[client]]
      w = [np.float32(a) for a in glob]
      v, alpha = personal.get(client, ([np.float32(a) for a in glob],
                                       np.float32(alpha0)))
      for _ in range(steps):
        tree = lambda leaves: jax.tree.unflatten(treedef, [
            jnp.asarray(a) for a in leaves])
        mixed = [alpha * b + (1 - alpha) * a for a, b in zip(w, v,
                                                             strict=True)]
        g_w = [np.asarray(g) for g in jax.tree.leaves(grad(tree(w), xs, ys))]
        g_m = [np.asarray(g) for g in jax.tree.leaves(grad(tree(mixed), xs,
                                                           ys))]
        g_alpha = sum(float(np.sum((b - a) * g))
                      for a, b, g in zip(w, v, g_m, strict=True))
        w, v, alpha = (
            [a - lr * g for a, g in zip(w, g_w, strict=True)],
            [b - lr * alpha * g for b, g in zip(v, g_m, strict=True)],
            np.float32(np.clip(alpha - alpha_lr * g_alpha, 0.0, 1.0)))
      personal[client] = (v, alpha)
      trained.append([np.asarray(a, np.float64) for a in w])
      weights.append(len(parts[client]))
    glob = average_leaves(trained, weights)
  return glob, personal


@pytest.mark.parametrize("alpha_lr", [0.5, 40.0])  # 40: alpha clips
def test_apfl_matches_a_step_by_step_reference_over_three_rounds(alpha_lr):
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  lr, steps = 0.3, 2
  # One full batch per epoch: the data order cannot matter.
  training = LocalTraining(epochs=steps, batch_size=16, learning_rate=lr)
  update = apfl(model, training, alpha=0.4, alpha_learning_rate=alpha_lr,
                clients_per_step=2)
  state = run_rounds(model, aggregators.fedavg(), training, update, params,
                     data, SCHEDULE)
  glob, personal = reference_apfl(model, params, SCHEDULE, x, y, parts, lr,
                                  alpha_lr, 0.4, steps)
  for got, want in zip(jax.tree.leaves(state.params), glob, strict=True):
    np.testing.assert_allclose(got, want, atol=2e-5)
  table = state.client_state.personal
  np.testing.assert_array_equal(table.seen, [c in personal for c in range(5)])
  for client, (v, alpha) in personal.items():
    np.testing.assert_allclose(table.rows["alpha"][client], alpha,
                               atol=2e-5)
    for got, want in zip(jax.tree.leaves(table.rows["v"]), v, strict=True):
      np.testing.assert_allclose(got[client], want, atol=2e-5)
  alphas = [float(alpha) for _, alpha in personal.values()]
  if alpha_lr > 1:
    assert {0.0, 1.0} & set(alphas)
  else:
    assert all(0.0 < a < 1.0 for a in alphas)
  # The personalised models: alpha v + (1 - alpha) w, w the global model.
  mixed = jax.jit(update.personalize)(state.client_state, state.params,
                                      jnp.arange(5))
  for i, (got, w) in enumerate(zip(jax.tree.leaves(mixed),
                                   jax.tree.leaves(state.params),
                                   strict=True)):
    for client in range(5):
      if client in personal:
        v, alpha = personal[client]
        want = alpha * v[i] + (1 - alpha) * np.asarray(w, np.float64)
        np.testing.assert_allclose(got[client], want, atol=3e-5)
      else:
        np.testing.assert_array_equal(got[client], w)


def test_apfl_with_alpha_fixed_at_zero_is_fedavg():
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(2))
  training = LocalTraining(epochs=2, batch_size=3, learning_rate=0.2)
  update = apfl(model, training, alpha=0.0, alpha_learning_rate=0.0,
                clients_per_step=2)
  rule = aggregators.fedavg()
  got = run_rounds(model, rule, training, update, params, data, SCHEDULE)
  plain = rounds.make_round_fn(
      model, rule, training,
      execution=Execution(clients_per_step=2, progress=False, stream=False))
  want = rounds.init_state(params, rule)
  for cohort, mask in SCHEDULE:
    want, _ = plain(want, data, jnp.array(cohort),
                    jnp.array(mask, jnp.float32))
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params),
                  strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)
  # v never moves (its gradient is alpha times another), alpha stays 0:
  # every client's model is the global one.
  personal = update.personalize(got.client_state, got.params, jnp.arange(5))
  for a, b in zip(jax.tree.leaves(personal), jax.tree.leaves(got.params),
                  strict=True):
    np.testing.assert_array_equal(a, jnp.broadcast_to(b, a.shape))
  np.testing.assert_array_equal(got.client_state.personal.rows["alpha"],
                                np.zeros(5))


def test_apfl_with_alpha_fixed_at_one_trains_v_alone():
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(3))
  training = LocalTraining(epochs=2, batch_size=3, learning_rate=0.2)
  update = apfl(model, training, alpha=1.0, alpha_learning_rate=0.0,
                clients_per_step=2)
  cohort, key = jnp.array([4, 1, 2]), jax.random.key(5)
  steps = engine.full_steps(data, cohort, 3, 2)
  result, state, metrics = update.update(
      update.init(5), params, data, cohort, jnp.ones(3), jnp.full(3, 0.2),
      steps, 1, key)
  # The mixture is v itself: v and w both train as plain local training
  # would, on the same minibatches.
  alone = engine.make_local_trainer(model, training, clients_per_step=2)(
      params, data, cohort, jnp.full(3, 0.2), steps, key)
  for got_w, got_v, want in zip(
      jax.tree.leaves(result.client_params),
      jax.tree.leaves(state.personal.rows["v"]),
      jax.tree.leaves(alone.client_params), strict=True):
    np.testing.assert_allclose(got_w, want, atol=1e-6)
    np.testing.assert_allclose(got_v[np.asarray(cohort)], want, atol=1e-6)
  np.testing.assert_array_equal(metrics["alpha"], np.ones(3))
  np.testing.assert_allclose(result.loss_after, alone.loss_after, atol=1e-6)
  np.testing.assert_allclose(result.train_loss, alone.train_loss, atol=1e-6)
  np.testing.assert_array_equal(result.steps_taken, alone.steps_taken)


def test_apfl_writes_only_real_finite_rows():
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(3))
  update = apfl(model, LocalTraining(batch_size=4), clients_per_step=2)
  cohort = jnp.array([0, 1, 0, 3])  # row 1 diverges, row 2 pads, row 3
  result, new, _ = update.update(  # takes no step
      update.init(5), params, data, cohort, jnp.array([1.0, 1.0, 0.0, 1.0]),
      jnp.array([0.1, jnp.nan, 0.1, 0.1]), jnp.array([4, 4, 0, 0]), 1,
      jax.random.key(0))
  np.testing.assert_array_equal(new.personal.seen, [True] + [False] * 4)
  np.testing.assert_array_equal(new.personal.rows["alpha"][1:], 0.0)
  assert 0.0 <= float(new.personal.rows["alpha"][0]) <= 1.0
  personal = update.personalize(new, params, jnp.array([1, 3, 4]))
  for a, b in zip(jax.tree.leaves(personal), jax.tree.leaves(params),
                  strict=True):
    np.testing.assert_array_equal(a, jnp.stack([b, b, b]))
  # The rule gets w: the global model where no step was taken.
  for a, b in zip(jax.tree.leaves(result.client_params),
                  jax.tree.leaves(params), strict=True):
    np.testing.assert_array_equal(a[3], b)


def test_mix_interpolates_per_client():
  w = {"a": jnp.zeros((2, 3))}
  v = {"a": jnp.ones((2, 3))}
  got = mix(w, v, jnp.array([0.25, 1.0]))
  np.testing.assert_allclose(got["a"], [[0.25] * 3, [1.0] * 3])


def test_apfl_argument_checks():
  model = tiny_model()
  for alpha in (-0.1, 1.5, float("nan")):
    with pytest.raises(ValueError, match="alpha"):
      apfl(model, alpha=alpha)
  with pytest.raises(TypeError, match="alpha"):
    apfl(model, alpha="0.5")
  with pytest.raises(ValueError, match="alpha_learning_rate"):
    apfl(model, alpha_learning_rate=-1.0)
  with pytest.raises(ValueError, match="objective"):
    apfl(model, LocalTraining(objective=objectives.fedprox(0.1)))
  with pytest.raises(TypeError, match="training"):
    apfl(model, "sgd")
  with pytest.raises(ValueError, match="BatchNorm"):
    apfl(bn_model())
  with pytest.raises(TypeError, match="apfl"):
    apfl(model, lam=0.1)
