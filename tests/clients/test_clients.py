"""Stateful clients: the table, SCAFFOLD, FedBN, Ditto, personalised
evaluation, checkpoints and sweeps of the client state."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import engine
from fedjax_agg import federated
from fedjax_agg import rounds
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg import validation
from fedjax_agg.config import (Checkpointing, Evaluation, Execution,
                               LocalTraining)
from fedjax_agg.types import Model

QUIET = Execution(clients_per_step=2, progress=False)
DIM, CLASSES = 4, 3
RUN_TRAINING = LocalTraining(epochs=1, batch_size=4, learning_rate=0.2)


def linear_model() -> Model:
  def init(key):
    return {"params": {"w": 0.1 * jax.random.normal(key, (DIM, CLASSES)),
                       "b": jnp.zeros((CLASSES,))}}

  def apply(params, x, train):
    del train
    p = params["params"]
    return x @ p["w"] + p["b"], params
  return Model(init, apply)


class _BNNet(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    x = nn.Dense(6, name="fc1")(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9,
                     name="bn1")(x)
    return nn.Dense(CLASSES, name="fc2")(nn.relu(x))


def bn_model() -> Model:
  net = _BNNet()

  def apply(variables, x, train):
    if train:
      out, updates = net.apply(variables, x, True, mutable=["batch_stats"])
      return out, {**variables, "batch_stats": updates["batch_stats"]}
    return net.apply(variables, x, False), variables
  return Model(lambda key: net.init(key, jnp.zeros((1, DIM))), apply)


def small_data(sizes=(6, 9, 5, 8), seed=0):
  rng = np.random.default_rng(seed)
  total = sum(sizes)
  x = rng.normal(size=(total, DIM)).astype(np.float32)
  y = rng.integers(0, CLASSES, size=total)
  bounds = np.cumsum((0,) + tuple(sizes))
  parts = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:],
                                          strict=True)]
  return federated.from_partition(x, y, parts), x, y, parts


def close(a, b, **kw):
  for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), **kw)


# ---------------------------------------------------------------- table


def test_table_padding_rows_never_write_even_with_duplicate_ids():
  table = clients.init_table(5, {"a": jax.ShapeDtypeStruct((2,),
                                                           jnp.float32)})
  ids = jnp.array([3, 1, 3])  # the last row pads with a real client's id
  rows = {"a": jnp.array([[1.0, 1.0], [2.0, 2.0], [9.0, 9.0]])}
  new = jax.jit(clients.scatter)(table, ids, rows,
                                 jnp.array([True, True, False]))
  np.testing.assert_array_equal(new.rows["a"][3], [1.0, 1.0])
  np.testing.assert_array_equal(new.rows["a"][1], [2.0, 2.0])
  np.testing.assert_array_equal(new.seen, [False, True, False, True, False])
  got = jax.jit(clients.gather)(new, jnp.array([0, 3]),
                                {"a": jnp.array([7.0, 7.0])})
  np.testing.assert_array_equal(got["a"], [[7.0, 7.0], [1.0, 1.0]])


# ------------------------------------------------------------- SCAFFOLD


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


# ---------------------------------------------------------------- FedBN


def _bn_leaves(tree):
  flat = {"/".join(str(k.key) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  return ({p: v for p, v in flat.items() if clients.batch_norm_leaf(p)},
          {p: v for p, v in flat.items() if not clients.batch_norm_leaf(p)})


def test_fedbn_keeps_batch_norm_per_client_and_averages_the_rest():
  data, *_ = small_data()
  model = bn_model()
  training = LocalTraining(epochs=2, batch_size=3, learning_rate=0.1)
  update = clients.fedbn(model, training, clients_per_step=2)
  rule = aggregators.fedavg()
  round_fn = rounds.make_round_fn(model, rule, training, execution=QUIET,
                                  local_update=update)
  params = model.init(jax.random.key(0))
  state = rounds.init_state(params, rule, client_state=update.init(4))
  cohort, mask = jnp.array([0, 1, 2]), jnp.array([1.0, 1.0, 0.0])
  state, _ = round_fn(state, data, cohort, mask)
  cohort2 = jnp.array([0, 1, 3])
  start = update.personalize(state.client_state, state.params, cohort2)
  # Round 2 by hand: the local update from the clients' own BN leaves.
  train_key = jax.random.split(state.key, 4)[1]
  local, table, _ = update.update(
      state.client_state, state.params, data, cohort2, jnp.ones(3),
      jnp.full(3, 0.1), engine.full_steps(data, cohort2, 3, 2), 2,
      train_key)
  new, _ = round_fn(state, data, cohort2, jnp.ones(3))
  # Clients 0 and 1 start from their own BN leaves, client 3 (never
  # trained) from the server's copy.
  bn_start, _ = _bn_leaves(start)
  bn_global, _ = _bn_leaves(state.params)
  for path, leaf in bn_start.items():
    assert not np.allclose(leaf[0], leaf[1]), path
    np.testing.assert_array_equal(leaf[2], bn_global[path])
  # Non-BN leaves: FedAvg of the clients' trained models.
  weights = np.asarray(data.num_examples)[np.asarray(cohort2)]
  weights = weights / weights.sum()
  want = jax.tree.map(lambda a: jnp.tensordot(weights, a, 1),
                      local.client_params)
  _, got_rest = _bn_leaves(new.params)
  _, want_rest = _bn_leaves(want)
  close(got_rest, want_rest, atol=1e-5)
  # The table holds each client's own trained BN leaves.
  own = update.personalize(new.client_state, new.params, cohort2)
  close(_bn_leaves(own)[0], _bn_leaves(local.client_params)[0], atol=1e-6)
  np.testing.assert_array_equal(new.client_state.local.seen,
                                [True, True, False, True])
  del table


def test_fedbn_needs_a_batch_norm_leaf():
  with pytest.raises(ValueError, match="no local leaves"):
    clients.fedbn(linear_model())


# ---------------------------------------------------------------- Ditto


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


# ------------------------------------- runs: evaluation, checkpoint, sweep


def _run_data():
  data, x, y, _ = small_data(sizes=(10, 12, 9, 11, 10, 8))
  train, held = validation.holdout_split(data, 0.3, seed=0)
  return train.with_validation(held), (x, y)


def test_personalised_evaluation_in_the_history():
  data, test = _run_data()
  model = linear_model()
  training = RUN_TRAINING
  update = clients.ditto(model, training, lam=0.5)
  result = simulation.run(
      model, data, test, aggregators.fedavg(), num_rounds=3,
      participation=0.5, training=training, execution=QUIET,
      evaluation=Evaluation(personalized=True, finetune_steps=2),
      local_update=update, seed=0)
  last = result.history.rows[-1]
  for name in ("personal_accuracy", "finetuned_accuracy",
               "global_accuracy"):
    assert 0.0 <= last[f"{name}_mean"] <= 1.0
    assert last[f"{name}_std"] >= 0.0
  assert "personal_accuracy_mean" in result.history.rows[0]
  assert "personal_accuracy_mean" not in result.history.rows[1]
  # Clients that never trained hold the global model: their personal
  # accuracy before round 1 is the global one.
  first = result.history.rows[0]
  assert first["personal_accuracy_mean"] == pytest.approx(
      first["global_accuracy_mean"])


def test_sweep_members_get_the_personalised_evaluation_of_their_run():
  data, test = _run_data()
  model = linear_model()
  update = clients.ditto(model, RUN_TRAINING, lam=0.5)
  evaluation = Evaluation(personalized=True, finetune_steps=2)
  members = sweep.run_sweep(
      lambda h: aggregators.fedavg(), None, seeds=[0, 3], model=model,
      data=data, test_data=test, num_rounds=2, participation=0.5,
      training=RUN_TRAINING, execution=QUIET, evaluation=evaluation,
      local_update=update)
  columns = [f"{name}_{stat}" for name in ("personal_accuracy",
                                           "finetuned_accuracy",
                                           "global_accuracy")
             for stat in ("mean", "std")]
  for member in members:
    alone = simulation.run(
        model, data, test, aggregators.fedavg(), num_rounds=2,
        participation=0.5, training=RUN_TRAINING, execution=QUIET,
        evaluation=evaluation, local_update=update, seed=member.seed)
    for got, want in zip(member.history.rows, alone.history.rows,
                         strict=True):
      assert set(got) == set(want)
      for column in set(columns) & set(want):
        assert got[column] == pytest.approx(want[column], abs=1e-6), column
    assert set(columns) <= set(member.history.rows[0])


def test_personalised_evaluation_needs_a_split_and_personal_models():
  data, test = _run_data()
  model = linear_model()
  with pytest.raises(ValueError, match="validation split"):
    simulation.run(model, data._replace(validation=None), test,
                   aggregators.fedavg(), num_rounds=1, execution=QUIET,
                   evaluation=Evaluation(finetune_steps=1))
  with pytest.raises(ValueError, match="personalize"):
    simulation.run(model, data, test, aggregators.fedavg(), num_rounds=1,
                   execution=QUIET, evaluation=Evaluation(personalized=True))
  with pytest.raises(ValueError, match="finetune_steps"):
    Evaluation(finetune_steps=-1)


def test_client_state_resume_equals_uninterrupted(tmp_path):
  data, test = _run_data()
  model = linear_model()
  training = RUN_TRAINING
  update = clients.scaffold(model, training)
  rule = clients.scaffold_aggregator(1.0)
  kw = dict(participation=0.5, training=training, execution=QUIET,
            local_update=update, seed=3)
  straight = simulation.run(model, data, test, rule, num_rounds=4, **kw)
  directory = str(tmp_path / "ckpt")
  simulation.run(model, data, test, rule, num_rounds=2,
                 checkpointing=Checkpointing(directory, every=1), **kw)
  resumed = simulation.run(
      model, data, test, rule, num_rounds=4,
      checkpointing=Checkpointing(directory, every=1, resume=True), **kw)
  close(resumed.state.client_state, straight.state.client_state,
        atol=0)
  close(resumed.state.params, straight.state.params, atol=0)


def test_sweep_members_keep_their_own_client_state():
  data, test = _run_data()
  model = linear_model()
  training = RUN_TRAINING
  update = clients.ditto(model, training, lam=0.5)
  members = sweep.run_sweep(
      lambda h: aggregators.fedavg(), {"learning_rate": [0.1, 0.2]},
      seeds=[0], model=model, data=data, test_data=test, num_rounds=2,
      participation=0.5, training=training, execution=QUIET,
      local_update=update)
  for member, lr in zip(members, [0.1, 0.2], strict=True):
    alone = simulation.run(
        model, data, test, aggregators.fedavg(), num_rounds=2,
        participation=0.5, training=LocalTraining(
            epochs=1, batch_size=4, learning_rate=lr),
        execution=QUIET, local_update=update, seed=0)
    close(member.state.client_state,
          alone.state.client_state, atol=1e-6)


# ----------------------------------------------------------- host table


@pytest.mark.parametrize("file_backed", [False, True])
def test_host_table_rounds_equal_device_table_rounds(tmp_path, file_backed):
  data, test = _run_data()
  model = linear_model()
  rule = clients.scaffold_aggregator(1.0)
  path = str(tmp_path / "table.bin") if file_backed else None
  runs = []
  for placement in ("device", "host"):
    update = clients.scaffold(model, RUN_TRAINING, placement=placement,
                              path=path if placement == "host" else None)
    runs.append(simulation.run(
        model, data, test, rule, num_rounds=3, participation=0.5,
        training=RUN_TRAINING, execution=QUIET, local_update=update,
        seed=1))
  device, host = (run.state for run in runs)
  close(host.params, device.params, atol=0)
  store = host.client_state.controls.store
  np.testing.assert_array_equal(store.seen,
                                device.client_state.controls.seen)
  for a, b in zip(store.arrays,
                  jax.tree.leaves(device.client_state.controls.rows),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  assert int(host.client_state.controls.version) == 3


def test_host_table_refuses_checkpoints_sweeps_and_bad_placement(tmp_path):
  data, test = _run_data()
  model = linear_model()
  update = clients.ditto(model, RUN_TRAINING, placement="host")
  with pytest.raises(ValueError, match="host memory"):
    simulation.run(model, data, test, aggregators.fedavg(), num_rounds=1,
                   execution=QUIET, local_update=update,
                   checkpointing=Checkpointing(str(tmp_path / "c"), 1))
  with pytest.raises(ValueError, match="host memory"):
    sweep.run_sweep(lambda h: aggregators.fedavg(), seeds=[0, 1],
                    model=model, data=data, test_data=test, num_rounds=1,
                    execution=QUIET, local_update=update)
  with pytest.raises(ValueError, match="placement"):
    clients.ditto(model, placement="disk")
  with pytest.raises(ValueError, match="path"):
    clients.scaffold(model, placement="device", path="x.bin")
