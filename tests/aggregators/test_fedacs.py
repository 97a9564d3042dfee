"""FedACS: top clients by server-side accuracy, then their FedAvg mean."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg.aggregators._fedacs import fedacs
from fedjax_agg.aggregators._fedacs import select_top
from fedjax_agg.types import ClientInfo
from tests.test_engine import tiny_model


def _setup(num_clients=6, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(40, 5)).astype(np.float32)
  y = rng.integers(0, 3, size=40)
  model = tiny_model()
  clients = jax.vmap(model.init)(jax.random.split(jax.random.key(seed),
                                                  num_clients))
  glob = jax.tree.map(lambda a: a[0], clients)
  return model, x, y, glob, clients


def _info(num_examples, mask):
  k = len(mask)
  return ClientInfo(jnp.arange(k), jnp.asarray(num_examples, jnp.float32),
                    jnp.asarray(mask, jnp.float32), jnp.ones(k), jnp.ones(k),
                    jnp.int32(1), jax.random.key(0))


def np_accuracy(model, params, x, y):
  with jax.default_matmul_precision("highest"):  # as the rule's (a GPU: TF32)
    logits, _ = model.apply(params, x, False)
  return float(np.mean(np.argmax(np.asarray(logits), 1) == y))


@pytest.mark.parametrize("fraction", [0.3, 0.5, 1.0])
def test_aggregates_the_most_accurate_real_clients(fraction):
  model, x, y, glob, clients = _setup()
  num_examples = np.array([5.0, 9.0, 3.0, 7.0, 4.0, 6.0])
  mask = np.array([1, 1, 1, 1, 1, 0], np.float32)
  rule = fedacs(model, x, y, fraction=fraction, eval_batch_size=16)
  aggregate = jax.jit(rule.aggregate)
  new_global, state, metrics = aggregate(glob, clients,
                                         _info(num_examples, mask),
                                         rule.init(glob))
  acc = np.array([np_accuracy(model, jax.tree.map(lambda a, k=k: a[k], clients),
                              x, y) for k in range(6)])
  np.testing.assert_allclose(metrics["client_accuracy"], acc, rtol=1e-6)
  num_kept = max(int(np.ceil(fraction * 5)), 1)
  order = sorted(range(5), key=lambda k: (-acc[k], k))  # real clients only
  selected = np.zeros(6)
  selected[order[:num_kept]] = 1.0
  np.testing.assert_array_equal(metrics["selected"], selected)
  weights = num_examples * selected / np.sum(num_examples * selected)
  np.testing.assert_allclose(metrics["client_weights"], weights, rtol=1e-6)
  for got, leaf in zip(jax.tree.leaves(new_global),
                       jax.tree.leaves(clients), strict=True):
    np.testing.assert_allclose(
        got, np.tensordot(weights, np.asarray(leaf, np.float64), 1),
        rtol=1e-5, atol=1e-6)
  if fraction == 1.0:  # everyone selected: FedAvg
    fedavg_global, _, _ = aggregators.fedavg().aggregate(
        glob, clients, _info(num_examples, mask), ())
    for a, b in zip(jax.tree.leaves(new_global),
                    jax.tree.leaves(fedavg_global), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert aggregate._cache_size() == 1
  np.testing.assert_array_equal(state.y_eval, y)


def test_select_top_ties_and_padding():
  acc = jnp.array([0.5, 0.9, 0.5, 0.9, 1.0])
  mask = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0])
  np.testing.assert_array_equal(select_top(acc, mask, 0.5), [0, 1, 0, 1, 0])
  np.testing.assert_array_equal(select_top(acc, mask, 0.6), [1, 1, 0, 1, 0])
  np.testing.assert_array_equal(select_top(acc, mask, 0.01), [0, 1, 0, 0, 0])
  np.testing.assert_array_equal(select_top(acc, jnp.zeros(5), 0.5),
                                np.zeros(5))


def test_padding_only_cohort_keeps_the_model():
  model, x, y, glob, clients = _setup(3)
  rule = fedacs(model, x, y)
  new_global, _, _ = jax.jit(rule.aggregate)(glob, clients, _info([1, 1, 1],
                                                         [0, 0, 0]),
                                    rule.init(glob))
  for a, b in zip(jax.tree.leaves(new_global), jax.tree.leaves(glob),
                  strict=True):
    np.testing.assert_array_equal(a, b)


def test_bad_arguments_are_named():
  model, x, y = tiny_model(), np.zeros((4, 5)), np.zeros(4, np.int32)
  with pytest.raises(ValueError, match="fraction"):
    fedacs(model, x, y, fraction=0.0)
  with pytest.raises(ValueError, match="weighting"):
    fedacs(model, x, y, weighting="loss")
  with pytest.raises(ValueError, match="x_eval"):
    fedacs(model, x, y[:3])
