"""Every registered rule against hostile inputs, under jax.jit.

* Padding rows (mask 0) holding NaN, +-inf or +-1e38 in their params,
  example counts, losses and client ids change neither the output nor the
  new state (stacked and streamed), over two rounds, and output, state and
  metrics stay finite.
* Updates of magnitude 1e30 (or 1e-30) give the angles and weights of the
  same updates at magnitude 1 (FedAdp, FedLayerWise), and FedNNNN the same
  normalisation.
* A real row whose id lies outside the federation (possible only under
  jit, where ids cannot be checked) changes no client's per-client state.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES

K = tu.COHORT
# The rules on LoRA adapters refuse these trees by name (tests/lora).
ALL = sorted(set(aggregators.REGISTRY) - set(aggregators.ADAPTER_RULES))
STREAMING = [name for name in ALL if tu.build(name).stream is not None]
POISONS = (np.nan, np.inf, -np.inf, 1e38, -1e38)
MASKS = st.lists(st.sampled_from([0.0, 1.0]), min_size=K,
                 max_size=K).filter(any)


@functools.lru_cache(maxsize=None)
def _streamed(name):
  rule = tu.jitted_rule(name).aggregator
  return jax.jit(functools.partial(tu.streamed_aggregate, rule))


def _cohorts(seed, mask, poison_index):
  """A clean cohort and the same one with poisoned padding rows."""
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, K, scale=0.3)
  ids = rng.permutation(tu.NUM_CLIENTS)[:K]
  num_examples = rng.integers(1, 20, size=K).astype(np.float32)
  clean = tu.make_info(ids, num_examples, mask)
  padded = np.asarray(mask) == 0
  poison = POISONS[poison_index]

  def poisoned_leaf(leaf):
    leaf = np.array(leaf)
    for row in np.flatnonzero(padded):
      # The whole row, or a random half of its entries.
      hit = rng.uniform(size=leaf.shape[1:]) < (1.0 if row % 2 else 0.5)
      leaf[row][hit] = poison
    return jnp.asarray(leaf)

  def poisoned(values, bad):
    return jnp.where(jnp.asarray(padded), jnp.asarray(bad, values.dtype),
                     values)

  dirty = clean._replace(
      client_ids=poisoned(clean.client_ids, [-3, 10**6, -1, 2**30][:K]),
      num_examples=poisoned(clean.num_examples, poison),
      loss_before=poisoned(clean.loss_before, poison),
      loss_after=poisoned(clean.loss_after, poison))
  return (global_params, (clients, clean),
          (jax.tree.map(poisoned_leaf, clients), dirty))


def _two_rounds(aggregate, init, global_params, clients, info):
  """(output, state) after each of two rounds, and the last metrics."""
  params, state = global_params, init(global_params)
  history = []
  for round_ in (1, 2):
    params, state, metrics = aggregate(
        params, clients, info._replace(round=jnp.asarray(round_, jnp.int32)),
        state)
    history.append((params, state))
  return history, metrics


def _assert_finite(tree):
  for leaf in jax.tree.leaves(tree):
    if jnp.issubdtype(leaf.dtype, jnp.inexact):
      assert np.all(np.isfinite(np.asarray(leaf)))


@pytest.mark.parametrize(
    "name,form", [(n, "stacked") for n in ALL]
    + [(n, "streamed") for n in STREAMING])
@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=MASKS,
       poison_index=st.integers(0, len(POISONS) - 1))
def test_poisoned_padding_rows_change_nothing(name, form, seed, mask,
                                              poison_index):
  rule = tu.jitted_rule(name)
  aggregate = rule.aggregate if form == "stacked" else _streamed(name)
  global_params, clean, dirty = _cohorts(seed, mask, poison_index)
  expected, _ = _two_rounds(aggregate, rule.init, global_params, *clean)
  got, metrics = _two_rounds(aggregate, rule.init, global_params, *dirty)
  _assert_finite((got, metrics))
  tu.assert_trees_close(got, expected, rtol=0, atol=0)


def _angle_rule_metrics(name, magnitude, **kwargs):
  """Round-1 metrics of ``name`` for updates of the given magnitude."""
  rng = np.random.default_rng(11)
  global_params = jax.tree.map(jnp.zeros_like, tu.make_params(rng))
  clients = tu.make_clients(rng, global_params, K + 1, scale=1.0,
                            zero_rows=(2,))
  clients = jax.tree.map(lambda x: x * magnitude, clients)
  info = tu.make_info([0, 1, 2, 3, 4], [3.0, 9.0, 1.0, 4.0, 6.0],
                      [1, 1, 1, 0, 1])
  rule = tu.jitted_rule(name, tuple(sorted(kwargs.items())))
  out, state, metrics = rule.aggregate(global_params, clients, info,
                                       rule.init(global_params))
  _assert_finite((out, state, metrics))
  return metrics, state


@pytest.mark.parametrize("magnitude", [1e-30, 1e20, 1e30, 1e37])
@pytest.mark.parametrize("name", ["fedadp", "fedlayerwise"])
def test_huge_or_tiny_updates_give_the_angles_of_unit_ones(name, magnitude):
  metrics, state = _angle_rule_metrics(name, 1.0)
  scaled_metrics, scaled_state = _angle_rule_metrics(name, magnitude)
  tu.assert_trees_close(scaled_metrics, metrics, rtol=1e-5, atol=1e-6)
  tu.assert_trees_close(scaled_state, state, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("magnitude", [1e-30, 1e20, 1e30])
@pytest.mark.parametrize("name", ["fednnnn", "norm_norm"])
def test_huge_or_tiny_updates_keep_fednnnn_normalisation(name, magnitude):
  metrics, _ = _angle_rule_metrics(name, 1.0, min_norm=0.0)
  scaled, _ = _angle_rule_metrics(name, magnitude, min_norm=0.0)
  np.testing.assert_allclose(scaled["norm_scale"], metrics["norm_scale"],
                             rtol=1e-5)
  for key in ("N", "E", "layer_N", "layer_E"):
    np.testing.assert_allclose(
        np.asarray(scaled[key], np.float64) / magnitude, metrics[key],
        rtol=1e-5)


@pytest.mark.parametrize("bad_id", [tu.NUM_CLIENTS, tu.NUM_CLIENTS + 40, -1])
@pytest.mark.parametrize("name", ["fedadp", "fedlayerwise"])
def test_out_of_range_real_ids_touch_no_client_state_under_jit(name, bad_id):
  rule = tu.jitted_rule(name)
  rng = np.random.default_rng(5)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, K)
  state = rule.init(global_params)
  info = tu.make_info([0, bad_id, 2, 3], [4.0, 2.0, 5.0, 1.0])
  _, new_state, _ = rule.aggregate(global_params, clients, info, state)
  written = np.isin(np.arange(tu.NUM_CLIENTS), [0, 2, 3])
  np.testing.assert_array_equal(np.asarray(new_state.times_seen),
                                written.astype(np.int32))
  untouched = np.asarray(new_state.smoothed_angle)[~written]
  np.testing.assert_array_equal(untouched, 0.0)
