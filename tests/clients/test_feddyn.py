"""FedDyn (Acar et al., ICLR 2021): the server rule and the client side.

Golden tests against independent float64 numpy computations of
Algorithm 1: the server step alone (padding rows hold NaN or 1e30 and
out-of-range ids, a BatchNorm statistic takes the plain mean, the rule
runs under ``jax.jit``, its streaming form equals ``aggregate``), and
whole rounds whose clients are trained one by one with plain SGD on
L_k - <grad_k, theta> + alpha/2 ||theta - theta^{t-1}||^2. Property: the
server's h stays the mean of the clients' gradient states.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import objectives
from fedjax_agg import rounds
from fedjax_agg.aggregators._feddyn import FedDynState
from fedjax_agg.aggregators._feddyn import feddyn as feddyn_rule
from fedjax_agg.clients._feddyn import FedDynClientState
from fedjax_agg.clients._feddyn import feddyn as feddyn_client
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from tests import agg_testutil as tu
from tests.clients.test_clients import bn_model
from tests.clients.test_clients import small_data
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

K = 6
N = 9  # the federation of the server-rule tests
MASKS = [[1] * K, [1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0]]
# A model with a BatchNorm statistic (no gradient, no h).
SHAPES = {"params": {"conv": {"kernel": (3, 3, 1, 2), "bias": (2,)},
                     "dense": {"kernel": (5, 3), "bias": (3,)}},
          "batch_stats": {"bn": {"mean": (3,), "var": (3,)}}}
QUIET = Execution(clients_per_step=2, progress=False)


# ---------------------------------------------------------------- server


def trainable_entries(tree):
  """[P] bool over the flattened model: False on ``batch_stats``."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return np.concatenate([
      np.full(np.size(leaf), path[0].key != "batch_stats")
      for path, leaf in flat])


def np_feddyn(global_flat, models, h, alpha, num_clients, trainable):
  """Eqs. (c)-(d) of Algorithm 1 literally, in float64.

  Args:
    global_flat: [P] theta^{t-1}; models: [m, P] the participants'
      theta_k^t; h: [P] h^{t-1}; trainable: [P] bool.

  Returns:
    (theta^t, h^t).
  """
  if len(models) == 0:
    return global_flat, h
  mean = models.mean(axis=0)
  new_h = h - alpha / num_clients * np.sum(models - global_flat, axis=0)
  new_h = np.where(trainable, new_h, 0.0)
  return np.where(trainable, mean - new_h / alpha, mean), new_h


def garbage_cohort(seed, mask, global_params):
  """Clients near ``global_params`` whose padding rows hold NaN or 1e30,
  out-of-range ids and huge counts; the real rows' float64 models."""
  rng = np.random.default_rng(seed)
  clients = tu.make_clients(rng, global_params, K, scale=0.2)
  mask = np.asarray(mask)
  models = tu.flat_rows(clients)[np.flatnonzero(mask)]
  padding = np.flatnonzero(mask == 0)
  ids = rng.permutation(N)[:K]
  counts = rng.integers(1, 40, size=K).astype(np.float64)

  for i, row in enumerate(padding):
    ids[row] = -1 if i % 2 == 0 else 10**6
    counts[row] = np.nan if i % 2 == 0 else 1e9
  info = tu.make_info(ids, counts, mask)
  return tu.spoil_rows(clients, padding), info, models


@functools.lru_cache(maxsize=None)
def _forms(alpha):
  """(rule, jitted aggregate, jitted streaming form) of FedDyn(alpha)."""
  rule = feddyn_rule(alpha, num_clients=N)
  return (rule, jax.jit(rule.aggregate),
          jax.jit(functools.partial(tu.streamed_aggregate, rule)))


@pytest.mark.parametrize("alpha", [0.01, 0.5])
@pytest.mark.parametrize("masks", [(0, 1), (2, 3), (1, 0)])
@pytest.mark.parametrize("form", ["stacked", "streamed"])
def test_two_server_steps_match_numpy(alpha, masks, form):
  rule, aggregate, streamed = _forms(alpha)
  run = aggregate if form == "stacked" else streamed
  params = tu.make_params(np.random.default_rng(sum(masks)), SHAPES)
  state = rule.init(params)
  trainable = trainable_entries(params)
  want_params, want_h = tu.flat(params), np.zeros(trainable.shape)
  for round_, mask_index in enumerate(masks):
    clients, info, models = garbage_cohort(10 * round_ + mask_index,
                                           MASKS[mask_index], params)
    params, state, metrics = run(params, clients, info, state)
    want_params, want_h = np_feddyn(want_params, models, want_h, alpha, N,
                                    trainable)
    np.testing.assert_allclose(tu.flat(params), want_params, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(tu.flat(state.h), want_h, rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(metrics["h_norm"], np.linalg.norm(want_h),
                               rtol=1e-5)
  assert isinstance(state, FedDynState)


def test_streaming_form_equals_aggregate():
  rule, aggregate, streamed = _forms(0.1)
  params = tu.make_params(np.random.default_rng(3), SHAPES)
  stacked_state = streamed_state = rule.init(params)
  stacked = streamed_params = params
  for round_, mask in enumerate(MASKS[:3]):
    clients, info, _ = garbage_cohort(round_, mask, params)
    stacked, stacked_state, metrics = aggregate(stacked, clients, info,
                                                stacked_state)
    streamed_params, streamed_state, s_metrics = streamed(
        streamed_params, clients, info, streamed_state)
    tu.assert_trees_close((streamed_params, streamed_state, s_metrics),
                          (stacked, stacked_state, metrics))


@pytest.mark.parametrize("form", ["stacked", "streamed"])
def test_a_cohort_of_padding_only_keeps_the_model_and_h(form):
  rule, aggregate, streamed = _forms(0.1)
  run = aggregate if form == "stacked" else streamed
  params = tu.make_params(np.random.default_rng(4), SHAPES)
  clients, info, _ = garbage_cohort(0, MASKS[1], params)
  params, state, _ = run(params, clients, info, rule.init(params))
  assert float(tu.flat(state.h) @ tu.flat(state.h)) > 0
  clients, info, _ = garbage_cohort(1, [0] * K, params)
  new_params, new_state, metrics = run(params, clients, info, state)
  tu.assert_trees_close(new_params, params, rtol=0, atol=0)
  tu.assert_trees_close(new_state, state, rtol=0, atol=0)
  assert np.isfinite(metrics["h_norm"])


def test_zero_updates_from_the_start_keep_the_model():
  rule, aggregate, _ = _forms(0.1)
  params = tu.make_params(np.random.default_rng(5), SHAPES)
  clients = tu.make_clients(np.random.default_rng(6), params, K,
                            zero_rows=range(K))
  out, state, _ = aggregate(params, clients, tu.make_info(range(K),
                                                          [1.0] * K),
                            rule.init(params))
  tu.assert_trees_close(out, params, rtol=0, atol=0)
  assert not np.any(tu.flat(state.h))


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf, "abc",
                                   None])
def test_bad_alpha_is_refused(value):
  with pytest.raises((ValueError, TypeError), match="alpha"):
    feddyn_rule(value, num_clients=N)
  with pytest.raises((ValueError, TypeError), match="alpha"):
    feddyn_client(tiny_model(), alpha=value)


@pytest.mark.parametrize("value", [0, -3, 2.5, None, "7", True])
def test_bad_num_clients_is_refused(value):
  with pytest.raises((ValueError, TypeError), match="num_clients"):
    feddyn_rule(0.1, num_clients=value)


def test_real_ids_outside_the_federation_are_refused():
  rule = feddyn_rule(0.1, num_clients=3)
  params = tu.make_params(np.random.default_rng(0))
  clients = tu.make_clients(np.random.default_rng(1), params, 2)
  with pytest.raises(ValueError, match="num_clients=3"):
    rule.aggregate(params, clients, tu.make_info([0, 3], [1.0, 1.0]),
                   rule.init(params))


def test_client_side_refuses_an_objective_and_unknown_options():
  with pytest.raises(ValueError, match="objective"):
    feddyn_client(tiny_model(), LocalTraining(
        objective=objectives.fedprox(0.1)))
  with pytest.raises(TypeError, match="feddyn"):
    feddyn_client(tiny_model(), server_learning_rate=1.0)


# ---------------------------------------------------------------- rounds


def _to_np(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


@functools.lru_cache(maxsize=None)
def _data_gradient(model):
  """grad of the mean task loss of one client's whole data, in float32."""
  @jax.jit
  def gradient(params, x, y):
    def loss(p):
      logits, _ = model.apply(p, x, True)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(
          logits, y))
    return jax.grad(loss)(params)
  return gradient


def np_rounds(model, params, x, y, parts, schedule, alpha, lr, steps,
              num_clients):
  """FedDyn's rounds one client at a time: plain SGD on Eq. (a), then
  Eq. (b) for each participant and Eqs. (c)-(d), in float64.

  Returns (theta, h, [N] gradient states) after the schedule.
  """
  gradient = _data_gradient(model)
  theta = _to_np(params)
  h = jax.tree.map(np.zeros_like, theta)
  states = [jax.tree.map(np.zeros_like, theta) for _ in range(num_clients)]
  for cohort, mask in schedule:
    real = [c for c, m in zip(cohort, mask, strict=True) if m]
    models = []
    for c in real:
      local = theta
      for _ in range(steps):
        data_grad = _to_np(gradient(
            jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), local),
            x[parts[c]], y[parts[c]]))
        # Gradient of L_k - <grad_k, theta> + alpha/2 ||theta - theta0||^2.
        local = jax.tree.map(
            lambda w, d, g, w0: w - lr * (d - g + alpha * (w - w0)),
            local, data_grad, states[c], theta)
      states[c] = jax.tree.map(lambda g, w, w0: g - alpha * (w - w0),
                               states[c], local, theta)
      models.append(local)
    h = jax.tree.map(
        lambda hh, w0, *ws: hh - alpha / num_clients * sum(w - w0
                                                           for w in ws),
        h, theta, *models)
    theta = jax.tree.map(
        lambda hh, *ws: sum(ws) / len(ws) - hh / alpha, h, *models)
  return theta, h, states


SCHEDULES = {
    # K = 3 of N = 5; padding rows, one repeating a real client's id.
    "partial": [([0, 2, 4], [1, 1, 0]), ([1, 3, 0], [1, 1, 1]),
                ([4, 2, 2], [1, 1, 0])],
    "full": [([0, 1, 2, 3, 4], [1] * 5)] * 2,
}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_rounds_match_clients_trained_alone(schedule):
  data, x, y, parts = tiny_data()
  num_clients = len(parts)
  model = tiny_model()
  alpha, lr, steps = 0.5, 0.3, 3
  # One full batch per epoch: the data order cannot matter.
  training = LocalTraining(epochs=steps, batch_size=16, learning_rate=lr)
  update = feddyn_client(model, training, alpha=alpha, clients_per_step=2)
  rule = feddyn_rule(alpha, num_clients=num_clients)
  round_fn = rounds.make_round_fn(model, rule, training, execution=QUIET,
                                  local_update=update)
  params = model.init(jax.random.key(1))
  state = rounds.init_state(params, rule,
                            client_state=update.init(num_clients))
  for cohort, mask in SCHEDULES[schedule]:
    state, out = round_fn(state, data, jnp.array(cohort),
                          jnp.array(mask, jnp.float32))
    assert out.metrics["gradient_state_norm"].shape == (len(cohort),)
    assert np.isfinite(out.metrics["h_norm"])
  theta, h, states = np_rounds(model, params, x, y, parts,
                               SCHEDULES[schedule], alpha, lr, steps,
                               num_clients)
  tu.assert_trees_close(state.params, theta, rtol=1e-4, atol=2e-5)
  tu.assert_trees_close(state.aggregator_state.h, h, rtol=1e-4, atol=2e-5)
  table = state.client_state.gradients
  assert isinstance(state.client_state, FedDynClientState)
  tu.assert_trees_close(table.rows, tu.stack_rows(states), rtol=1e-4,
                        atol=2e-5)
  seen = sorted({c for cohort, mask in SCHEDULES[schedule]
                 for c, m in zip(cohort, mask, strict=True) if m})
  np.testing.assert_array_equal(np.flatnonzero(table.seen), seen)
  # h^t = (1/N) sum_k grad_k^t, the mean over all N clients.
  tu.assert_trees_close(
      state.aggregator_state.h,
      jax.tree.map(lambda rows: jnp.mean(rows, axis=0), table.rows),
      rtol=1e-5, atol=1e-6)


def test_batch_norm_statistics_get_no_gradient_state_and_no_h():
  data, *_ = small_data()
  model = bn_model()
  training = LocalTraining(epochs=1, batch_size=3, learning_rate=0.2)
  update = feddyn_client(model, training, alpha=0.1, clients_per_step=2)
  rule = feddyn_rule(0.1, num_clients=4)
  round_fn = rounds.make_round_fn(model, rule, training, execution=QUIET,
                                  local_update=update)
  params = model.init(jax.random.key(0))
  state = rounds.init_state(params, rule, client_state=update.init(4))
  state, _ = round_fn(state, data, jnp.array([0, 2, 3]), jnp.ones(3))
  rows = state.client_state.gradients.rows
  for tree in (rows["batch_stats"], state.aggregator_state.h["batch_stats"]):
    assert not np.any(tu.flat(tree))
  # Participants 0, 2, 3 wrote a gradient state; client 1 kept zeros.
  moved = np.abs(tu.flat_rows(rows["params"])).max(axis=1) > 0
  np.testing.assert_array_equal(moved, [True, False, True, True])
  np.testing.assert_array_equal(state.client_state.gradients.seen, moved)
  assert np.all(np.isfinite(tu.flat(state.params)))
  # The statistics moved with training (the uniform mean, no h term).
  assert np.any(tu.flat(state.params["batch_stats"])
                != tu.flat(params["batch_stats"]))
