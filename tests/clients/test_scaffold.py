"""SCAFFOLD against numpy over rounds with partial participation, FedAvg
with zero controls, argument checks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import rounds
from fedjax_agg.config import LocalTraining
from tests.clients._util import close
from tests.clients._util import linear_model
from tests.clients._util import QUIET
from tests.clients._util import small_data


def _softmax_grad(w, b, x, y):
  logits = x @ w + b
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  p[np.arange(len(y)), y] -= 1.0
  return x.T @ p / len(y), p.mean(0)


def test_scaffold_matches_numpy_over_three_rounds_partial_participation():
  data, x, y, parts = small_data()
  model = linear_model()
  lr, steps, server_lr = 0.3, 3, 0.7
  # One full batch per epoch: the data order cannot matter.
  training = LocalTraining(epochs=steps, batch_size=16, learning_rate=lr)
  update = clients.scaffold(model, training, clients_per_step=2)
  rule = clients.scaffold_aggregator(server_lr)
  round_fn = rounds.make_round_fn(model, rule, training, execution=QUIET,
                                  local_update=update)
  params = model.init(jax.random.key(1))
  state = rounds.init_state(params, rule, client_state=update.init(4))
  schedule = [([0, 2, 1], [1, 1, 0]), ([1, 3, 0], [1, 1, 1]),
              ([3, 2, 2], [1, 1, 0])]
  w = np.asarray(params["params"]["w"], np.float64)
  b = np.asarray(params["params"]["b"], np.float64)
  cw, cb = np.zeros_like(w), np.zeros_like(b)
  ciw, cib = np.zeros((4,) + w.shape), np.zeros((4,) + b.shape)
  for cohort, mask in schedule:
    state, _ = round_fn(state, data, jnp.array(cohort), jnp.array(
        mask, jnp.float32))
    real = [c for c, m in zip(cohort, mask, strict=True) if m]
    new_w, new_b, dcw, dcb = [], [], 0.0, 0.0
    for c in real:
      yw, yb = w.copy(), b.copy()
      for _ in range(steps):
        gw, gb = _softmax_grad(yw, yb, x[parts[c]], y[parts[c]])
        yw -= lr * (gw - ciw[c] + cw)
        yb -= lr * (gb - cib[c] + cb)
      nciw = ciw[c] - cw + (w - yw) / (steps * lr)
      ncib = cib[c] - cb + (b - yb) / (steps * lr)
      dcw, dcb = dcw + nciw - ciw[c], dcb + ncib - cib[c]
      ciw[c], cib[c] = nciw, ncib
      new_w.append(yw)
      new_b.append(yb)
    w = w + server_lr * (np.mean(new_w, 0) - w)
    b = b + server_lr * (np.mean(new_b, 0) - b)
    cw, cb = cw + dcw / 4, cb + dcb / 4
  np.testing.assert_allclose(state.params["params"]["w"], w, atol=2e-5)
  np.testing.assert_allclose(state.params["params"]["b"], b, atol=2e-5)
  ctrl = state.client_state
  np.testing.assert_allclose(ctrl.server_control["params"]["w"], cw,
                             atol=2e-5)
  np.testing.assert_allclose(ctrl.controls.rows["params"]["w"], ciw,
                             atol=2e-5)
  np.testing.assert_array_equal(ctrl.controls.seen, [True] * 4)


def test_scaffold_with_zero_controls_and_one_step_is_fedavg():
  data, *_ = small_data()
  model = linear_model()
  training = LocalTraining(epochs=1, batch_size=3, learning_rate=0.2)
  update = clients.scaffold(model, training, clients_per_step=2)
  params = model.init(jax.random.key(0))
  cohort, mask = jnp.array([0, 1, 3]), jnp.ones(3)
  one_step = LocalTraining(epochs=1, batch_size=3, learning_rate=0.2,
                           steps_fn=lambda key, full: jnp.ones_like(full))
  got = rounds.make_round_fn(
      model, clients.scaffold_aggregator(1.0), one_step, execution=QUIET,
      local_update=update)
  want = rounds.make_round_fn(model, aggregators.fedavg("uniform"),
                              one_step, execution=QUIET)
  rule = clients.scaffold_aggregator(1.0)
  a, _ = got(rounds.init_state(params, rule, client_state=update.init(4)),
             data, cohort, mask)
  b, _ = want(rounds.init_state(params, aggregators.fedavg("uniform")),
              data, cohort, mask)
  close(a.params, b.params, atol=1e-6)


def test_scaffold_refuses_an_objective():
  from fedjax_agg import objectives
  with pytest.raises(ValueError, match="objective"):
    clients.scaffold(linear_model(), LocalTraining(
        objective=objectives.fedprox(0.1)))
  with pytest.raises(ValueError, match="server_learning_rate"):
    clients.scaffold_aggregator(0.0)
