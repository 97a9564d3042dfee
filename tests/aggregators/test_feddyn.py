"""FedDyn's server rule (Acar et al., ICLR 2021).

Golden tests against independent float64 numpy computations of
Algorithm 1's server step (padding rows hold NaN or 1e30 and out-of-range
ids, a BatchNorm statistic takes the plain mean, the rule runs under
``jax.jit``, its streaming form equals ``aggregate``), and argument checks.
"""

import functools
import math

import jax
import numpy as np
import pytest

from fedjax_agg.aggregators._feddyn import feddyn as feddyn_rule
from fedjax_agg.aggregators._feddyn import FedDynState
from fedjax_agg.clients._feddyn import feddyn as feddyn_client
from tests import agg_testutil as tu
from tests.test_engine import tiny_model


K = 6
N = 9  # the federation of the server-rule tests
MASKS = [[1] * K, [1, 0, 1, 1, 0, 1], [0, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0]]
# A model with a BatchNorm statistic (no gradient, no h).
SHAPES = {"params": {"conv": {"kernel": (3, 3, 1, 2), "bias": (2,)},
                     "dense": {"kernel": (5, 3), "bias": (3,)}},
          "batch_stats": {"bn": {"mean": (3,), "var": (3,)}}}


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
