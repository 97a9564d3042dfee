"""FedLayerWise: golden tests against numpy and the paper's identities."""

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES
from tests.aggregators import test_fedadp


def _groups(tree, stacked=False, granularity="layer"):
  """numpy [D_l] (or [K, D_l]) vectors per layer: modules sorted by name,
  each module's arrays (sorted by name) concatenated; "leaf": one each."""
  def flat(x):
    x = np.asarray(x)
    return x.reshape(x.shape[0], -1) if stacked else x.ravel()
  groups = []
  for module in sorted(tree):
    arrays = [flat(tree[module][name]) for name in sorted(tree[module])]
    if granularity == "leaf":
      groups.extend(arrays)
    else:
      groups.append(np.concatenate(arrays, axis=-1))
  return groups


@pytest.mark.parametrize("granularity", ["layer", "leaf"])
@pytest.mark.parametrize("smoothing", ["participation", "round"])
def test_golden_against_numpy(granularity, smoothing):
  def groups(tree, stacked=False):
    return _groups(tree, stacked, granularity)
  metrics, psi = test_fedadp.run_golden("fedlayerwise", groups, smoothing,
                                        granularity=granularity)
  np.testing.assert_allclose(metrics["layer_weights"], psi, rtol=1e-5,
                             atol=1e-7)


def test_layers_get_their_own_weights():
  # Client 0 agrees with the mean in the conv layer and opposes it in the
  # dense layer; client 1 the reverse. FedAdp sees one angle per client.
  rng = np.random.default_rng(0)
  global_params = tu.make_params(rng)
  direction = tu.make_params(rng)
  signs = {"conv": np.array([1.0, 1.0, 1.0]),
           "dense": np.array([-0.5, 1.0, 1.0])}
  clients = {m: jax.tree.map(
      lambda g, d, s=signs[m]: g[None] + s.reshape(-1, *[1] * g.ndim)
      * d[None], global_params[m], direction[m]) for m in global_params}
  info = tu.make_info([0, 1, 2], [1.0, 1.0, 1.0])
  rule = aggregators.get("fedlayerwise", num_clients=tu.NUM_CLIENTS)
  _, _, metrics = jax.jit(rule.aggregate)(global_params, clients, info,
                                          rule.init(global_params))
  weights = np.asarray(metrics["layer_weights"])
  np.testing.assert_allclose(weights[:, 0], 1 / 3, rtol=1e-5)  # conv
  assert weights[0, 1] < 0.01 < weights[1, 1]  # dense: client 0 opposes


SINGLE_LAYER = {"dense": {"kernel": (4, 3), "bias": (3,)}}
LAYERWISE = aggregators.get("fedlayerwise", num_clients=tu.NUM_CLIENTS)
FEDADP = aggregators.get("fedadp", num_clients=tu.NUM_CLIENTS)
LAYERWISE_AGG = jax.jit(LAYERWISE.aggregate)
FEDADP_AGG = jax.jit(FEDADP.aggregate)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=st.lists(
    st.sampled_from([0.0, 1.0]), min_size=4, max_size=4).filter(any))
def test_one_layer_equals_fedadp(seed, mask):
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng, SINGLE_LAYER)
  layer_state = LAYERWISE.init(global_params)
  adp_state = FEDADP.init(global_params)
  for round_ in (1, 2):
    clients = tu.make_clients(rng, global_params, 4, scale=0.3)
    ids = rng.permutation(tu.NUM_CLIENTS)[:4]
    info = tu.make_info(ids, rng.integers(1, 30, size=4), mask, round_)
    layer_out, layer_state, _ = LAYERWISE_AGG(global_params, clients, info,
                                              layer_state)
    adp_out, adp_state, _ = FEDADP_AGG(global_params, clients, info,
                                       adp_state)
    tu.assert_trees_close(layer_out, adp_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer_state.smoothed_angle[:, 0],
                               adp_state.smoothed_angle, rtol=1e-6)
    global_params = layer_out


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=st.lists(
    st.sampled_from([0.0, 1.0]), min_size=5, max_size=5).filter(any),
       scale=st.sampled_from([0.0, 1e-3, 1.0, 100.0]))
def test_layer_weights_sum_to_one_over_real_clients(seed, mask, scale):
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 5, scale=scale,
                            zero_rows=(0,))
  mask = np.asarray(mask)
  info = tu.make_info([0, 1, 2, 3, 4], rng.integers(1, 30, size=5), mask)
  out, _, metrics = LAYERWISE_AGG(global_params, clients, info,
                                  LAYERWISE.init(global_params))
  weights = np.asarray(metrics["layer_weights"])
  np.testing.assert_allclose(weights.sum(axis=0), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(weights[mask == 0], 0.0)
  assert np.all(weights >= 0)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(out))


def test_state_has_one_column_per_layer():
  params = tu.make_params(np.random.default_rng(0))
  for granularity, num_layers in (("layer", 2), ("leaf", 4)):
    rule = aggregators.get("fedlayerwise", num_clients=5,
                           granularity=granularity)
    assert rule.init(params).smoothed_angle.shape == (5, num_layers)
  with pytest.raises(ValueError, match="granularity"):
    aggregators.get("fedlayerwise", num_clients=5, granularity="block")
