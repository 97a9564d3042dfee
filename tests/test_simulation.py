"""Rounds: jitted round, FedAvg aggregation, reproducibility, history."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import engine
from fedjax_agg import simulation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg import rounds as rounds_lib
from fedjax_agg import history as history_lib
from fedjax_agg import evaluation as evaluation_lib
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model


def test_round_is_fedavg_of_local_training_and_does_not_retrace():
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(0))
  aggregator = aggregators.fedavg()
  round_fn = rounds_lib.make_round_fn(model, aggregator,
      training=LocalTraining(batch_size=3, epochs=2, learning_rate=0.1),
      execution=Execution(clients_per_step=2))
  state = rounds_lib.init_state(params, aggregator, seed=3)
  cohort = jnp.array([4, 1, 2, 0])
  mask = jnp.array([1.0, 1.0, 1.0, 0.0])
  new_state, out = round_fn(state, data, cohort, mask)

  # Independent check: same local training, numpy weighted mean.
  trainer = engine.make_local_trainer(model,
      LocalTraining(batch_size=3, epochs=2), clients_per_step=2)
  _, train_key, _, _ = jax.random.split(state.key, 4)
  steps = engine.full_steps(data, cohort, 3, 2) * mask.astype(jnp.int32)
  local = trainer(params, data, cohort, jnp.full(4, 0.1), steps, train_key)
  n = np.asarray(data.num_examples)[np.asarray(cohort)] * np.asarray(mask)
  for got, stacked in zip(jax.tree.leaves(new_state.params),
                          jax.tree.leaves(local.client_params), strict=True):
    expect = np.tensordot(n / n.sum(), np.asarray(stacked, np.float64), 1)
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.metrics["client_weights"], n / n.sum(),
                             rtol=1e-6)
  assert int(new_state.round) == 1
  assert int(out.steps_taken[3]) == 0  # padding row did no work

  round_fn(new_state, data, jnp.array([0, 1, 2, 3]), mask)
  assert round_fn._cache_size() == 1


def _run(seed, rounds=3):
  data, x, y, _ = tiny_data()
  return simulation.run(tiny_model(), data, (x, y), aggregators.fedavg(),
      num_rounds=rounds, participation=0.6, seed=seed,
      training=LocalTraining(epochs=1, batch_size=3, learning_rate=0.2),
      execution=Execution(clients_per_step=2, progress=False))


def test_same_seed_same_history_different_seed_differs(tmp_path):
  first, second, other = _run(0), _run(0), _run(1)
  strip = lambda rows: [{k: v for k, v in r.items() if k != "time_s"}
                        for r in rows]
  assert strip(first.history.rows) == strip(second.history.rows)
  assert strip(first.history.rows) != strip(other.history.rows)
  cohorts = [tuple(r["client_ids"]) for r in first.history.client_rows]
  other_cohorts = [tuple(r["client_ids"]) for r in other.history.client_rows]
  assert cohorts != other_cohorts
  assert all(len(c) == 3 and len(set(c)) == 3 for c in cohorts)  # 0.6 * 5
  paths = first.history.save(str(tmp_path))
  frame = first.history.to_dataframe()
  assert len(frame) == 4 and frame["round"].tolist() == [0, 1, 2, 3]
  assert open(paths["csv"]).readline().startswith("round,")
  # Training on this easy problem lowers the clients' loss.
  assert frame["client_loss_mean"].iloc[-1] < frame["client_loss_mean"].iloc[0]


def test_metrics_and_rounds_to_target():
  labels = np.array([0, 0, 1, 1, 2, 2])
  preds = np.array([0, 1, 1, 1, 2, 0])
  m = evaluation_lib.classification_metrics(labels, preds, 3)
  # Per-class F1: 1/2 (tp 1, fp 1, fn 1), 4/5, 2/3.
  np.testing.assert_allclose(m["macro_f1"], (1 / 2 + 4 / 5 + 2 / 3) / 3)
  np.testing.assert_allclose(m["accuracy"], 4 / 6)
  history = history_lib.History(
      rows=[{"round": 0, "test_accuracy": 0.1},
            {"round": 1, "test_accuracy": 0.5},
            {"round": 2, "test_accuracy": 0.7}], client_rows=[], config={})
  assert history_lib.rounds_to_target(history, 0.6) == 2
  assert history_lib.rounds_to_target(history, 0.9) is None


def test_bad_participation_is_named():
  with pytest.raises(ValueError, match="participation"):
    rounds_lib.num_sampled(10, 0.0)


def test_rules_that_read_losses_refuse_compute_losses_false():
  model = tiny_model()
  rule = aggregators.feddrl(4)
  assert rule.uses_losses and not aggregators.fedavg().uses_losses
  wrapped = aggregators.with_server_optimizer(rule, optax.sgd(1.0))
  assert wrapped.uses_losses
  for agg in (rule, wrapped):
    with pytest.raises(ValueError, match="compute_losses"):
      rounds_lib.make_round_fn(model, agg,
          training=LocalTraining(batch_size=4, epochs=1, compute_losses=False))
  # Rules that ignore the losses build either way.
  rounds_lib.make_round_fn(model, aggregators.fedavg(),
      training=LocalTraining(batch_size=4, epochs=1, compute_losses=False))
