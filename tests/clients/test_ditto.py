"""Ditto: lambda's endpoints (the global model, purely local training),
interpolation between them, argument checks.
"""

import math

import jax
import jax.numpy as jnp
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import engine
from fedjax_agg import rounds
from fedjax_agg.config import LocalTraining
from tests.clients._util import close
from tests.clients._util import linear_model
from tests.clients._util import QUIET
from tests.clients._util import small_data


def _ditto_round(lam, seed=0):
  data, *_ = small_data()
  model = linear_model()
  training = LocalTraining(epochs=2, batch_size=3, learning_rate=0.2)
  update = clients.ditto(model, training, lam=lam, clients_per_step=2)
  rule = aggregators.fedavg()
  params = model.init(jax.random.key(seed))
  state = rounds.init_state(params, rule, client_state=update.init(4))
  round_fn = rounds.make_round_fn(model, rule, training, execution=QUIET,
                                  local_update=update)
  cohort = jnp.array([0, 2, 3])
  new, _ = round_fn(state, data, cohort, jnp.ones(3))
  return data, model, training, update, state, new, cohort


def test_ditto_infinite_lambda_pins_personal_models_to_the_global_one():
  _, _, _, update, state, new, cohort = _ditto_round(math.inf)
  personal = update.personalize(new.client_state, new.params, cohort)
  want = jax.tree.map(lambda a: jnp.broadcast_to(a, (3,) + a.shape),
                      state.params)  # w^t, the model the round received
  close(personal, want, atol=1e-7)


def test_ditto_zero_lambda_is_purely_local_training():
  data, model, training, update, state, new, cohort = _ditto_round(0.0)
  personal = update.personalize(new.client_state, new.params, cohort)
  train_key = jax.random.split(state.key, 4)[1]
  alone = engine.make_local_trainer(model, training, clients_per_step=2)(
      state.params, data, cohort, jnp.full(3, 0.2),
      engine.full_steps(data, cohort, 3, 2), jax.random.fold_in(train_key, 1))
  close(personal, alone.client_params, atol=1e-6)
  # The global side is the plain FedAvg round.
  plain = rounds.make_round_fn(model, aggregators.fedavg(), training,
                               execution=QUIET)
  want, _ = plain(state, data, cohort, jnp.ones(3))
  close(new.params, want.params, atol=1e-6)


def test_ditto_lambda_interpolates():
  _, _, _, update, state, new, cohort = _ditto_round(1.0)
  personal = update.personalize(new.client_state, new.params, cohort)
  _, _, _, update0, _, new0, _ = _ditto_round(0.0)
  local = update0.personalize(new0.client_state, new0.params, cohort)
  dist = lambda a: float(sum(jnp.sum((u - v[None]) ** 2) for u, v in zip(
      jax.tree.leaves(a), jax.tree.leaves(state.params), strict=True)))
  assert 0 < dist(personal) < dist(local)


def test_ditto_rejects_negative_lambda():
  with pytest.raises(ValueError, match="lam"):
    clients.ditto(linear_model(), lam=-1.0)
  with pytest.raises(ValueError, match="lam"):
    clients.ditto(linear_model(), lam=float("nan"))
