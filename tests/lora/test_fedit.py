"""FedIT: FedAvg of A and B against NumPy, its inexact-aggregation metric,
and what it reduces to."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import testing
from fedjax_agg.models import lora
from tests.lora import _util


def _np_fedit(global_params, clients, weights):
  """Eq. (1) to Eq. (4) in float64: (the mean factors, the gap over the
  product, the gap over the round's update)."""
  mean, gap, total, update = {}, 0.0, 0.0, 0.0
  start = _util.np_nodes(global_params)
  for path, node in _util.np_nodes(clients).items():
    live = weights > 0
    a = np.where(live[:, None, None], node["a"], 0.0)
    b = np.where(live[:, None, None], node["b"], 0.0)
    mean_a = np.einsum("k,kri->ri", weights, a)
    mean_b = np.einsum("k,kor->or", weights, b)
    product = np.einsum("k,kor,kri->oi", weights, b, a)
    gap += np.sum((product - mean_b @ mean_a) ** 2)
    total += np.sum(product ** 2)
    update += np.sum((product - start[path]["b"] @ start[path]["a"]) ** 2)
    mean[path] = {"a": mean_a, "b": mean_b}
  return mean, np.sqrt(gap / total), np.sqrt(gap / update)


@pytest.mark.parametrize("weighting", ["num_examples", "uniform"])
def test_fedit_equals_numpy_with_padding_rows(weighting):
  _, _, model = _util.lora_mlp(rank=3)
  global_params, clients, info = _util.cohort(model, 6, seed=1,
                                              garbage=(1, 4))
  rule = aggregators.fedit(weighting)
  out, _, metrics = jax.jit(rule.aggregate)(global_params, clients, info,
                                            rule.init(global_params))
  weights = _util.np_weights(info, weighting)
  mean, of_product, of_update = _np_fedit(global_params, clients, weights)
  for path, node in _util.np_nodes(out).items():
    for leaf in ("a", "b"):
      np.testing.assert_allclose(node[leaf], mean[path][leaf], rtol=1e-5,
                                 atol=1e-6)
  np.testing.assert_allclose(metrics["client_weights"], weights, rtol=1e-6)
  np.testing.assert_allclose(metrics["inexact_aggregation"], of_product,
                             rtol=1e-4)
  np.testing.assert_allclose(metrics["inexact_aggregation_of_update"],
                             of_update, rtol=1e-4)
  assert float(metrics["inexact_aggregation"]) > 1e-3
  # The clients moved little from the global adapters: the gap is a
  # larger share of the round's update than of the whole product.
  assert of_update > 1.5 * of_product


def test_the_gap_over_the_update_is_the_applied_updates_relative_error():
  # Eq. (4) read off the rule's output: FedIT applies B A - B_t A_t where
  # the clients' mean update is sum_k p_k B_k A_k - B_t A_t.
  _, _, model = _util.lora_mlp(rank=2)
  global_params, clients, info = _util.cohort(model, 5, seed=4,
                                              garbage=(2,))
  out, _, metrics = jax.jit(aggregators.fedit().aggregate)(
      global_params, clients, info, ())
  weights = _util.np_weights(info)
  start, new = _util.np_nodes(global_params), _util.np_nodes(out)
  error, size = 0.0, 0.0
  for path, node in _util.np_nodes(clients).items():
    live = weights > 0
    mean_product = np.einsum("k,kor,kri->oi", weights[live], node["b"][live],
                             node["a"][live])
    before = start[path]["b"] @ start[path]["a"]
    applied = new[path]["b"] @ new[path]["a"] - before
    error += np.sum((applied - (mean_product - before)) ** 2)
    size += np.sum((mean_product - before) ** 2)
  np.testing.assert_allclose(metrics["inexact_aggregation_of_update"],
                             np.sqrt(error / size), rtol=1e-4)


def _round_from_zero_b(num, seed, clients_at_global=False):
  """FedIT's metrics of a cohort whose global adapters have B = 0 (the
  clients at those adapters with ``clients_at_global``)."""
  _, _, model = _util.lora_mlp(rank=2)
  global_params, clients, info = _util.cohort(model, num, seed=seed)
  global_params = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.zeros_like(x) if path[-1].key == "b" else x,
      global_params)
  if clients_at_global:
    clients = jax.tree.map(lambda g: jnp.broadcast_to(g, (num,) + g.shape),
                           global_params)
  return jax.jit(aggregators.fedit().aggregate)(global_params, clients,
                                                info, ())[2]


def test_both_gaps_are_equal_from_a_zero_product():
  # From B_t = 0 (LoRA's initialisation) the round's update is the whole
  # product, so Eq. (3) and Eq. (4) agree.
  metrics = _round_from_zero_b(4, seed=5)
  assert float(metrics["inexact_aggregation"]) > 1e-3
  np.testing.assert_allclose(metrics["inexact_aggregation_of_update"],
                             metrics["inexact_aggregation"], rtol=1e-5)


def test_no_product_and_no_update_give_zero_not_nan():
  # Every client at global adapters with B = 0: no product, no update and
  # no gap (0 / 0 -> 0).
  metrics = _round_from_zero_b(3, seed=6, clients_at_global=True)
  assert float(metrics["inexact_aggregation_of_update"]) == 0.0
  assert float(metrics["inexact_aggregation"]) == 0.0


def test_fedit_is_fedavg_on_the_adapters():
  # The paper's rule: FedAvg applied to the LoRA parameters.
  _, _, model = _util.lora_mlp(rank=2)
  global_params, clients, info = _util.cohort(model, 5, seed=2, garbage=(3,))
  fedit, fedavg = aggregators.fedit(), aggregators.fedavg()
  got = jax.jit(fedit.aggregate)(global_params, clients, info, ())[0]
  want = jax.jit(fedavg.aggregate)(global_params, clients, info, ())[0]
  jax.tree.map(np.testing.assert_array_equal, got, want)


def test_exact_when_clients_share_a_or_are_identical():
  _, _, model = _util.lora_mlp(rank=2)
  global_params, clients, info = _util.cohort(model, 4, seed=3)
  rule = jax.jit(aggregators.fedit().aggregate)
  shared_a = jax.tree_util.tree_map_with_path(
      lambda path, x: (jnp.broadcast_to(x[0], x.shape)
                       if path[-1].key == "a" else x), clients)
  identical = jax.tree.map(lambda x: jnp.broadcast_to(x[0], x.shape), clients)
  for cohort in (shared_a, identical):
    metrics = rule(global_params, cohort, info, ())[2]
    assert float(metrics["inexact_aggregation"]) < 1e-6
    assert float(metrics["inexact_aggregation_of_update"]) < 1e-6


def test_one_step_from_hu_initialisation_at_full_rank_is_exact():
  # fc1 is 4 x 4: rank 4 is its full dimension. From A random and B = 0,
  # one local SGD step moves only B (A's gradient is B^T (...) = 0), so the
  # clients share A and FedIT's B A is the average of the clients' B_k A:
  # the paper's FedAvg of LoRA parameters is then exact.
  _, _, model = _util.lora_mlp(rank=4, targets=["fc1"])
  start = model.init(jax.random.key(7))
  rng = np.random.default_rng(0)
  xs = jnp.asarray(rng.normal(size=(3, 8, 4)), jnp.float32)
  ys = jnp.asarray(rng.integers(0, 3, size=(3, 8)))

  def local_step(x, y):
    loss = lambda p: jnp.mean(model.loss(model.apply(p, x, True)[0], y))
    return optax.apply_updates(start, jax.tree.map(
        lambda g: -0.5 * g, jax.grad(loss)(start)))

  clients = jax.jit(jax.vmap(local_step))(xs, ys)
  info = testing.make_info([0, 1, 2], [8.0, 8.0, 8.0])
  out, _, metrics = jax.jit(aggregators.fedit().aggregate)(start, clients,
                                                           info, ())
  node = _util.np_nodes(clients)["fc1"]
  np.testing.assert_array_equal(node["a"], np.broadcast_to(
      np.asarray(start["lora"]["fc1"]["a"]), node["a"].shape))
  assert float(metrics["inexact_aggregation"]) < 1e-6
  assert float(metrics["inexact_aggregation_of_update"]) < 1e-6
  mean_product = np.mean(node["b"] @ node["a"], axis=0)
  assert np.abs(mean_product).max() > 1e-3  # B moved
  merged = _util.np_nodes(out)["fc1"]
  np.testing.assert_allclose(merged["b"] @ merged["a"], mean_product,
                             rtol=1e-5, atol=1e-7)


def test_refuses_what_is_not_trained_adapters_naming_fedit():
  rng = np.random.default_rng(0)
  plain = testing.make_params(rng)
  info = testing.make_info([0, 1], [1.0, 2.0])
  stack = lambda tree: jax.tree.map(lambda x: jnp.stack([x, x]), tree)
  rule = aggregators.fedit()
  _, _, ffa = _util.lora_mlp(rank=2, freeze_a=True)
  _, _, flora = _util.lora_mlp(rank=2, merged=True)
  for params in (plain, ffa.init(jax.random.key(0)),
                 flora.init(jax.random.key(0))):
    with pytest.raises(ValueError, match="fedit"):
      rule.aggregate(params, stack(params), info, ())
  with pytest.raises(ValueError, match="weighting"):
    aggregators.fedit("median")
  assert aggregators.get("fedit") is not None
  assert "fedit" in aggregators.ADAPTER_RULES
  assert lora.is_adapters(_util.random_adapters(ffa, 0))
