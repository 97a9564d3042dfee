"""FedPer: a numpy reference over rounds, the empty-head identity with
FedAvg, the table's writes, argument checks and personalised evaluation.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import rounds
from fedjax_agg import simulation
from fedjax_agg import tree_math
from fedjax_agg import validation
from fedjax_agg.clients._fedper import fedper
from fedjax_agg.config import Evaluation, Execution, LocalTraining
from fedjax_agg.types import Model
from tests.test_engine import tiny_data, tiny_model

QUIET = Execution(clients_per_step=2, progress=False)
HEAD = lambda path: path.startswith("params/Dense_1/")
# Rounds 1 and 3 end with a padding row (the last repeats a real client's
# id); client 2 never trains.
SCHEDULE = [([0, 3, 1], [1, 1, 0]), ([1, 3, 0], [1, 1, 1]),
            ([3, 4, 4], [1, 1, 0])]


@functools.lru_cache(maxsize=None)
def _gradient(model):
  def loss(params, x, y):
    logits, _ = model.apply(params, x, True)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
  return jax.jit(jax.grad(loss))


def full_batch_sgd(model, params, x, y, lr, steps, trains):
  """``steps`` full-batch SGD steps on the leaves flagged in ``trains``
  (a list in ``jax.tree.leaves`` order), written out leaf by leaf."""
  for _ in range(steps):
    leaves, treedef = jax.tree.flatten(params)
    grads = jax.tree.leaves(_gradient(model)(params, x, y))
    params = jax.tree.unflatten(treedef, [
        p - lr * g if flag else p
        for p, g, flag in zip(leaves, grads, trains, strict=True)])
  return params


def average_leaves(trained, weights):
  """The server's mean in float64: [leaf lists] and their raw weights ->
  one leaf list."""
  weights = np.asarray(weights, np.float64) / np.sum(weights)
  return [np.tensordot(weights, np.stack([t[i] for t in trained]), 1)
          for i in range(len(trained[0]))]


def reference_rounds(model, params, schedule, x, y, parts, lr, phases,
                     is_local, weighting="num_examples"):
  """Rounds of a personalised-head algorithm, one client at a time.

  ``phases``: [(steps, 'all' | 'head' | 'body')], full-batch SGD steps per
  phase. Every real client starts from the global leaves with its own head
  (the global head until it has trained), keeps its new head, and the
  server averages the models in float64. Returns (global leaves, {client:
  head leaves}).
  """
  paths = tree_math.leaf_paths(params)
  in_head = [bool(is_local(p)) for p in paths]
  trains = {"all": [True] * len(paths), "head": in_head,
            "body": [not h for h in in_head]}
  treedef = jax.tree.structure(params)
  glob = [np.asarray(a, np.float64) for a in jax.tree.leaves(params)]
  heads = {}
  for cohort, mask in schedule:
    trained, weights = [], []
    for client, real in zip(cohort, mask, strict=True):
      if not real:
        continue
      own = heads.get(client)
      start = [own[i] if (own is not None and in_head[i]) else glob[i]
               for i in range(len(glob))]
      model_params = jax.tree.unflatten(
          treedef, [jnp.asarray(a, jnp.float32) for a in start])
      for steps, part in phases:
        model_params = full_batch_sgd(model, model_params, x[parts[client]],
                                      y[parts[client]], lr, steps,
                                      trains[part])
      leaves = [np.asarray(a, np.float64)
                for a in jax.tree.leaves(model_params)]
      heads[client] = leaves
      trained.append(leaves)
      weights.append(len(parts[client]) if weighting == "num_examples"
                     else 1.0)
    glob = average_leaves(trained, weights)
  return glob, heads


def run_rounds(model, rule, training, update, params, data, schedule):
  round_fn = rounds.make_round_fn(model, rule, training, execution=QUIET,
                                  local_update=update)
  state = rounds.init_state(params, rule, client_state=update.init(
      data.num_clients))
  for cohort, mask in schedule:
    state, _ = round_fn(state, data, jnp.array(cohort),
                        jnp.array(mask, jnp.float32))
  return state


def check_against_reference(update, state, glob, heads, is_local,
                            num_clients, atol=2e-5):
  for got, want in zip(jax.tree.leaves(state.params), glob, strict=True):
    np.testing.assert_allclose(got, want, atol=atol)
  ids = jnp.arange(num_clients)
  personal = update.personalize(state.client_state, state.params, ids)
  paths = tree_math.leaf_paths(state.params)
  for i, (path, got) in enumerate(zip(paths, jax.tree.leaves(personal),
                                      strict=True)):
    for client in range(num_clients):
      if is_local(path) and client in heads:
        np.testing.assert_allclose(got[client], heads[client][i],
                                   atol=atol)
      else:  # the global leaf, bit for bit
        np.testing.assert_array_equal(got[client],
                                      jax.tree.leaves(state.params)[i])
  np.testing.assert_array_equal(
      state.client_state.local.seen,
      [client in heads for client in range(num_clients)])


def test_fedper_matches_a_client_by_client_reference_over_three_rounds():
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  lr, epochs = 0.3, 2
  # One full batch per epoch: the data order cannot matter.
  training = LocalTraining(epochs=epochs, batch_size=16, learning_rate=lr)
  update = fedper(model, training, clients_per_step=2)
  state = run_rounds(model, aggregators.fedavg(), training, update, params,
                     data, SCHEDULE)
  glob, heads = reference_rounds(model, params, SCHEDULE, x, y, parts, lr,
                                 [(epochs, "all")], HEAD)
  check_against_reference(update, state, glob, heads, HEAD, 5)
  assert sorted(heads) == [0, 1, 3, 4]


@pytest.mark.parametrize("stream", [None, False])
def test_fedper_with_no_personal_leaf_is_fedavg(stream):
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(2))
  training = LocalTraining(epochs=2, batch_size=3, learning_rate=0.2)
  update = fedper(model, training, is_local=lambda path: False,
                  clients_per_step=2)
  rule = aggregators.fedavg()
  got = run_rounds(model, rule, training, update, params, data, SCHEDULE)
  execution = Execution(clients_per_step=2, progress=False, stream=stream)
  plain = rounds.make_round_fn(model, rule, training, execution=execution)
  want = rounds.init_state(params, rule)
  for cohort, mask in SCHEDULE:
    want, _ = plain(want, data, jnp.array(cohort),
                    jnp.array(mask, jnp.float32))
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(want.params),
                  strict=True):
    if stream is False:  # the same program, stacked models: bit for bit
      np.testing.assert_array_equal(a, b)
    else:  # FedAvg's streaming sum adds in another order
      np.testing.assert_allclose(a, b, atol=1e-6)
  personal = update.personalize(got.client_state, got.params,
                                jnp.arange(5))
  for a, b in zip(jax.tree.leaves(personal), jax.tree.leaves(got.params),
                  strict=True):
    np.testing.assert_array_equal(a, jnp.broadcast_to(b, a.shape))
  assert got.client_state.local.rows == ()
  np.testing.assert_array_equal(got.client_state.local.seen,
                                [True, True, False, True, True])


def test_fedper_writes_only_real_finite_rows():
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(3))
  training = LocalTraining(epochs=1, batch_size=4, learning_rate=0.1)
  update = fedper(model, training, clients_per_step=2)
  state = update.init(5)
  # Row 1 diverges (NaN learning rate), row 2 pads with client 0's id.
  cohort = jnp.array([0, 1, 0])
  result, new, metrics = update.update(
      state, params, data, cohort, jnp.array([1.0, 1.0, 0.0]),
      jnp.array([0.1, jnp.nan, 0.1]), jnp.array([4, 4, 0]), 1,
      jax.random.key(0))
  np.testing.assert_array_equal(new.local.seen, [True] + [False] * 4)
  trained = result.client_params["params"]["Dense_1"]
  np.testing.assert_array_equal(new.local.rows[0][0], trained["bias"][0])
  np.testing.assert_array_equal(new.local.rows[1][0], trained["kernel"][0])
  for leaf in new.local.rows:
    np.testing.assert_array_equal(leaf[1:], np.zeros_like(leaf[1:]))
  assert float(metrics["num_local_leaves"]) == 2.0
  # Clients that never trained (the diverged one included) hold the
  # global model.
  personal = update.personalize(new, params, jnp.array([1, 2]))
  for a, b in zip(jax.tree.leaves(personal), jax.tree.leaves(params),
                  strict=True):
    np.testing.assert_array_equal(a, jnp.stack([b, b]))


def linear_model() -> Model:
  def init(key):
    return {"params": {"w": jax.random.normal(key, (5, 3)),
                       "b": jnp.zeros((3,))}}
  return Model(init, lambda p, x, train: (x @ p["params"]["w"]
                                          + p["params"]["b"], p))


def test_fedper_argument_checks():
  model = tiny_model()
  with pytest.raises(ValueError, match="fedper: no Dense layer"):
    fedper(linear_model())
  update = fedper(linear_model(), is_local=lambda p: p.endswith("/b"))
  assert update.personalize is not None
  with pytest.raises(TypeError, match="is_local"):
    fedper(model, is_local="params/Dense_1")
  with pytest.raises(TypeError, match="training"):
    fedper(model, {"epochs": 1})
  with pytest.raises(TypeError, match="fedper"):
    fedper(model, head_epochs=2)
  with pytest.raises(ValueError, match="placement"):
    fedper(model, placement="disk")


def test_fedper_personalised_evaluation_in_a_run():
  data, x, y, _ = tiny_data(sizes=(10, 12, 9, 11))
  train, held = validation.holdout_split(data, 0.3, seed=0)
  model = tiny_model()
  training = LocalTraining(epochs=1, batch_size=4, learning_rate=0.2)
  result = simulation.run(
      model, train.with_validation(held), (x, y), aggregators.fedavg(),
      num_rounds=2, participation=0.5, training=training, execution=QUIET,
      evaluation=Evaluation(personalized=True),
      local_update=fedper(model, training), seed=0)
  first, last = result.history.rows[0], result.history.rows[-1]
  # Before any training every client holds the global model.
  assert first["personal_accuracy_mean"] == pytest.approx(
      first["global_accuracy_mean"])
  assert 0.0 <= last["personal_accuracy_mean"] <= 1.0
