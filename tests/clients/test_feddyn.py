"""FedDyn's client side (Acar et al., ICLR 2021).

Whole rounds whose clients are trained one by one with plain SGD on
L_k - <grad_k, theta> + alpha/2 ||theta - theta^{t-1}||^2, against float64
numpy of Algorithm 1; the server's h stays the mean of the clients'
gradient states; BatchNorm statistics get no gradient state; argument
checks.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import objectives
from fedjax_agg import rounds
from fedjax_agg.aggregators._feddyn import feddyn as feddyn_rule
from fedjax_agg.clients._feddyn import FedDynClientState
from fedjax_agg.clients._feddyn import feddyn as feddyn_client
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from tests import agg_testutil as tu
from tests.clients._util import bn_model
from tests.clients._util import small_data
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

QUIET = Execution(clients_per_step=2, progress=False)


def test_client_side_refuses_an_objective_and_unknown_options():
  with pytest.raises(ValueError, match="objective"):
    feddyn_client(tiny_model(), LocalTraining(
        objective=objectives.fedprox(0.1)))
  with pytest.raises(TypeError, match="feddyn"):
    feddyn_client(tiny_model(), server_learning_rate=1.0)


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
