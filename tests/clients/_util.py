"""Shared inputs of the client-side tests: a linear model, a BatchNorm
network, small federations, ADCT's grid and learnable data.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import federated
from fedjax_agg import validation
from fedjax_agg.clients._adct import adct
from fedjax_agg.config import Execution, LocalTraining
from fedjax_agg.types import Model
from tests.test_engine import tiny_model


QUIET = Execution(clients_per_step=2, progress=False)
DIM, CLASSES = 4, 3
RUN_TRAINING = LocalTraining(epochs=1, batch_size=4, learning_rate=0.2)


@functools.cache  # one object, as tiny_model
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


def _run_data():
  data, x, y, _ = small_data(sizes=(10, 12, 9, 11, 10, 8))
  train, held = validation.holdout_split(data, 0.3, seed=0)
  return train.with_validation(held), (x, y)


GRID = ((0.05, 1), (0.5, 1), (0.05, 2), (2.0, 2))
BATCH = 3


def learnable_data(sizes=(12, 16, 10, 14, 9), seed=0):
  """5 features, 3 classes given by a fixed linear map (so training helps)."""
  rng = np.random.default_rng(seed)
  total = sum(sizes)
  x = rng.normal(size=(total, 5)).astype(np.float32)
  y = np.argmax(x @ rng.normal(size=(5, 3)), axis=1)
  bounds = np.cumsum((0,) + tuple(sizes))
  parts = [np.arange(a, b)
           for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
  return federated.from_partition(x, y, parts), x, y


def rows_of(data):
  n = np.asarray(data.num_examples)
  return [np.asarray(data.client_indices[i, :n[i]]) for i in range(len(n))]


def np_accuracy(model, params, x, y, indices):
  logits, _ = model.apply(params, x[indices], False)
  return float(np.mean(np.argmax(np.asarray(logits), 1) == y[indices]))


@functools.lru_cache(maxsize=None)
def _tuner(**kwargs):
  """The gamma reading with target 0 in round 1 (the tests below were
  written for it); the defaults have their own tests."""
  kwargs = {"threshold_mode": "absolute", "round_one": "first", **kwargs}
  return adct(tiny_model(), grid=GRID, batch_size=BATCH,
                       clients_per_step=8, **kwargs)
