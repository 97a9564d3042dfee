"""Server optimizers: Algorithm 2 of Reddi et al. in numpy, optax identities."""

import jax
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES

MASKS = [[1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 1, 1]]


def np_fedavg(clients, num_examples, mask):
  p = np.where(mask > 0, num_examples, 0.0)
  return jax.tree.map(lambda c: np.tensordot(p / p.sum(), c, axes=1),
                      clients)


def np_server_step(kind, delta, m, v, *, eta, b1, b2, tau):
  """One step of Algorithm 2 (lines 11-15) on one array; Delta = avg - w."""
  if kind == "avgm":  # heavy-ball SGD: m = b1 m + Delta, w += eta m
    m = b1 * m + delta
    return eta * m, m, v
  m = b1 * m + (1 - b1) * delta
  if kind == "adagrad":
    v = v + delta**2
  elif kind == "adam":
    v = b2 * v + (1 - b2) * delta**2
  else:
    v = v - (1 - b2) * delta**2 * np.sign(v - delta**2)
  return eta * m / (np.sqrt(v) + tau), m, v


def run_rounds(aggregate, state, global_params, rng, reference):
  """Three jitted rounds against ``reference(w, target) -> new w``."""
  w = tu.np_tree(global_params)
  for round_, mask in enumerate(MASKS, start=1):
    clients = tu.make_clients(rng, global_params, 4, scale=0.3,
                              zero_rows=(3,) if round_ == 2 else ())
    num_examples = rng.integers(1, 50, size=4).astype(float)
    info = tu.make_info([0, 1, 2, 3], num_examples, mask, round_)
    global_params, state, _ = aggregate(global_params, clients, info, state)
    w = reference(w, np_fedavg(tu.np_tree(clients), num_examples,
                               np.asarray(mask, float)))
    tu.assert_trees_close(global_params, w, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name,kind,kwargs", [
    ("fedadagrad", "adagrad", dict(server_learning_rate=0.1, b1=0.9,
                                   tau=1e-3)),
    ("fedadam", "adam", dict(server_learning_rate=0.01, b1=0.9, b2=0.99,
                             tau=1e-3)),
    ("fedyogi", "yogi", dict(server_learning_rate=0.01, b1=0.9, b2=0.99,
                             tau=1e-3)),
    ("fedavgm", "avgm", dict(server_learning_rate=0.7, momentum=0.9)),
])
def test_golden_against_algorithm_2(name, kind, kwargs):
  # The defaults are the paper's (v_{-1} = tau^2, no bias correction).
  rule = tu.JittedRule(name, **kwargs)
  eta = kwargs["server_learning_rate"]
  b1 = kwargs.get("b1", kwargs.get("momentum"))
  b2, tau = kwargs.get("b2", 0.0), kwargs.get("tau", 0.0)
  rng = np.random.default_rng(31)
  global_params = tu.make_params(rng)
  moments = {"m": jax.tree.map(np.zeros_like, tu.np_tree(global_params)),
             "v": jax.tree.map(lambda x: np.full_like(x, tau**2),
                               tu.np_tree(global_params))}

  def reference(w, target):
    steps, ms, vs = [], [], []
    for leaf, aim, m, v in zip(*(jax.tree.leaves(t) for t in (
        w, target, moments["m"], moments["v"])), strict=True):
      step, m, v = np_server_step(kind, aim - leaf, m, v, eta=eta, b1=b1,
                                  b2=b2, tau=tau)
      steps.append(leaf + step)
      ms.append(m)
      vs.append(v)
    treedef = jax.tree.structure(w)
    moments["m"] = jax.tree.unflatten(treedef, ms)
    moments["v"] = jax.tree.unflatten(treedef, vs)
    return jax.tree.unflatten(treedef, steps)

  run_rounds(rule.aggregate, rule.init(global_params), global_params, rng,
             reference)
  assert rule.traces == 1


ADAM = aggregators.get("fedadam", server_learning_rate=0.05, b1=0.8,
                       b2=0.95, tau=1e-4, bias_correction=True,
                       initial_accumulator=0.0)
ADAM_AGG = jax.jit(ADAM.aggregate)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31))
def test_fedadam_with_bias_correction_is_optax_adam(seed):
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  adam = optax.adam(0.05, b1=0.8, b2=0.95, eps=1e-4)
  opt_state = adam.init(global_params)

  def reference(w, target):
    nonlocal opt_state
    pseudo_gradient = jax.tree.map(lambda a, b: a - b, w, target)
    updates, opt_state = adam.update(pseudo_gradient, opt_state)
    return optax.apply_updates(w, updates)

  run_rounds(ADAM_AGG, ADAM.init(global_params), global_params, rng,
             reference)


def test_bad_arguments_raise():
  with pytest.raises(TypeError, match="aggregator"):
    aggregators.with_server_optimizer(lambda: None, optax.sgd(1.0))
  with pytest.raises(TypeError, match="transformation"):
    aggregators.with_server_optimizer(aggregators.fedavg(), "adam")
  with pytest.raises(ValueError, match="server_learning_rate"):
    aggregators.fedadam(server_learning_rate=0.0)
  with pytest.raises(ValueError, match="tau"):
    aggregators.fedyogi(tau=0.0)
  with pytest.raises(ValueError, match="b1"):
    aggregators.fedadagrad(b1=1.0)
  with pytest.raises(ValueError, match="momentum"):
    aggregators.fedavgm(momentum=1.5)
