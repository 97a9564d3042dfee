"""``models.lora``: the adapted network against NumPy, exact parameter and
byte counts, the frozen base, dropout, and every refusal by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import clock
from fedjax_agg import models
from fedjax_agg.models import lora
from tests.lora import _util


def _np_mlp(variables, adapter_nodes, frozen_a, scale, x):
  """mlp2's forward pass in float64 with W + scale (B A)^T per layer."""
  params = variables["params"]
  h = np.asarray(x, np.float64)
  for name in ("fc1", "fc2"):
    kernel = np.asarray(params[name]["kernel"], np.float64)
    if name in adapter_nodes:
      node = adapter_nodes[name]
      a = node["a"] if "a" in node else np.asarray(frozen_a[name], np.float64)
      kernel = kernel + scale * (node["b"] @ a).T
    h = h @ kernel + np.asarray(params[name]["bias"], np.float64)
    if name == "fc1":
      h = np.maximum(h, 0.0)
  return h


@pytest.mark.parametrize("freeze_a", [False, True])
def test_adapted_network_equals_numpy_and_merge(freeze_a):
  base, variables, model = _util.lora_mlp(rank=3, alpha=6.0,
                                          freeze_a=freeze_a)
  adapters = _util.random_adapters(model, seed=1)
  x = np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32)
  got, returned = jax.jit(lambda p, x: model.apply(p, x, False))(adapters, x)
  spec = lora.spec(model)
  want = _np_mlp(variables, _util.np_nodes(adapters), spec.frozen_a,
                 2.0, x)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert jax.tree.structure(returned) == jax.tree.structure(adapters)
  # The merged plain network computes the same function.
  merged, _ = base.apply(lora.merge(model, adapters), x, False)
  np.testing.assert_allclose(merged, want, rtol=1e-5, atol=1e-5)


def test_at_initialisation_the_adapted_network_is_the_base():
  # Hu et al.: A random, B zero, so B A = 0.
  base = _util.transformer()
  variables = jax.jit(base.init)(jax.random.key(0))
  model = lora.lora(base, variables, rank=2,
                    targets=lora.TRANSFORMER_TARGETS, key=jax.random.key(1))
  adapters = jax.jit(model.init)(jax.random.key(2))
  tokens = jnp.asarray(np.random.default_rng(0).integers(
      0, _util.VOCAB, size=(3, _util.LENGTH)), jnp.int32)
  adapted = jax.jit(lambda p: model.apply(p, tokens, False)[0])(adapters)
  plain = jax.jit(lambda v: base.apply(v, tokens, False)[0])(variables)
  # Equal up to how XLA fuses the two programs.
  np.testing.assert_allclose(adapted, plain, rtol=1e-6, atol=1e-6)
  for node in adapters[lora.ADAPTERS].values():
    assert not np.any(node["b"]) and np.all(np.std(node["a"]) > 0)
  # ... and A gets no gradient there (its gradient is B^T (...) = 0).
  grads = jax.jit(jax.grad(
      lambda p: jnp.sum(model.apply(p, tokens, True)[0] ** 2)))(adapters)
  for node in grads[lora.ADAPTERS].values():
    assert not np.any(node["a"]) and np.any(node["b"])


def test_trainable_parameters_and_uplink_bytes_are_counted_exactly():
  base = _util.transformer()
  variables = base.init(jax.random.key(0))
  w, r = _util.WIDTH, 2
  # Per block: q, k, v, out (w x w each; out's kernel [heads, head_dim, w]
  # is d_in = w), MLP w -> 4w and 4w -> w: r (d_in + d_out) each.
  by_hand = 4 * r * (w + w) + r * (w + 4 * w) + r * (4 * w + w)
  model = lora.lora(base, variables, rank=r,
                    targets=lora.TRANSFORMER_TARGETS, key=jax.random.key(1))
  adapters = model.init(jax.random.key(2))
  assert model.num_params() == lora.num_trainable(model) == by_hand
  assert lora.uplink_bytes(adapters) == clock.model_bytes(adapters) == (
      4 * by_hand)
  # FFA-LoRA on the square (attention) layers: half FedIT's uplink.
  attention = (lora.TRANSFORMER_TARGETS[0],)
  fedit_model = lora.lora(base, variables, rank=r, targets=attention,
                          key=jax.random.key(1))
  ffa_model = lora.lora(base, variables, rank=r, targets=attention,
                        freeze_a=True, key=jax.random.key(1))
  fedit_bytes = clock.model_bytes(fedit_model.init(jax.random.key(0)))
  ffa_bytes = clock.model_bytes(ffa_model.init(jax.random.key(0)))
  assert fedit_bytes == 4 * 4 * r * 2 * w and ffa_bytes * 2 == fedit_bytes
  assert lora.num_trainable(ffa_model) == 4 * r * w
  # FLoRA's frozen "merged" leaves are not trained and not sent.
  flora_model = lora.lora(base, variables, rank=r, targets=attention,
                          merged=True, key=jax.random.key(1))
  flora_adapters = flora_model.init(jax.random.key(0))
  assert lora.num_trainable(flora_model) == 4 * r * 2 * w
  assert lora.uplink_bytes(flora_adapters) == fedit_bytes
  assert flora_model.num_params() == 4 * r * 2 * w + 4 * w * w


def test_targets_select_dense_layers_of_the_cnns_and_refuse_convolutions():
  base = models.get("cnn_tf_cifar", num_classes=10)
  variables = jax.tree.map(np.asarray, jax.jit(base.init)(jax.random.key(0)))
  model = lora.lora(base, variables, rank=2, key=jax.random.key(1))
  shapes = jax.eval_shape(model.init, jax.random.key(0))[lora.ADAPTERS]
  assert sorted(shapes) == ["fc1", "fc2"]
  assert shapes["fc1"]["a"].shape == (2, 1024)
  assert shapes["fc1"]["b"].shape == (64, 2)
  with pytest.raises(ValueError, match=r"targets: .* matches \['conv1'"):
    lora.lora(base, variables, rank=2, targets=[r"conv\d"],
              key=jax.random.key(1))
  with pytest.raises(ValueError, match="targets: 'head' matches no Dense"):
    lora.lora(base, variables, rank=2, targets=["head"],
              key=jax.random.key(1))
  x = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype(np.float32)
  # Eager calls: two jitted programs may fuse the same sums differently.
  adapters = jax.jit(model.init)(jax.random.key(3))
  np.testing.assert_array_equal(model.apply(adapters, x, False)[0],
                                base.apply(variables, x, False)[0])


def test_the_base_is_frozen_batch_statistics_included():
  _, variables, model = _util.lora_mlp(rank=2, batch_norm=True)
  before = jax.tree.map(np.array, variables)
  adapters = _util.random_adapters(model, seed=3)
  x = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
  train_out, returned = model.apply(adapters, x, True)
  eval_out, _ = model.apply(adapters, x, False)
  # The base runs in inference mode: training changes only dropout.
  np.testing.assert_array_equal(train_out, eval_out)
  assert returned is adapters
  jax.tree.map(np.testing.assert_array_equal,
               jax.tree.map(np.asarray, lora.spec(model).base_variables),
               before)


def test_dropout_masks_the_adapter_input_in_training_only():
  _, _, model = _util.lora_mlp(rank=2, dropout=0.5)
  _, _, plain = _util.lora_mlp(rank=2)
  adapters = _util.random_adapters(model, seed=4)
  x = np.random.default_rng(2).normal(size=(64, 4)).astype(np.float32)
  apply = jax.jit(model.apply, static_argnums=2)
  evaluated = apply(adapters, x, False)[0]
  np.testing.assert_allclose(evaluated, plain.apply(adapters, x, False)[0],
                             rtol=1e-6, atol=1e-6)
  first, again = apply(adapters, x, True)[0], apply(adapters, x, True)[0]
  np.testing.assert_array_equal(first, again)  # same adapters and batch
  assert not np.allclose(first, evaluated)
  moved = jax.tree.map(lambda a: a + 1e-3, adapters)
  assert not np.allclose(apply(moved, x, True)[0] - apply(moved, x, False)[0],
                         first - evaluated, atol=1e-3)
  # Per client under vmap: different adapters draw different masks.
  stacked = jax.tree.map(lambda a: jnp.stack([a, a + 1e-3]), adapters)
  both = jax.jit(jax.vmap(lambda p: model.apply(p, x, True)[0]))(stacked)
  assert both.shape == (2, 64, 3) and not np.allclose(both[0], both[1],
                                                      atol=1e-2)
  # The mask's key reads the adapters' bits without a gradient.
  grads = jax.jit(jax.grad(lambda p: jnp.sum(model.apply(p, x, True)[0])))(
      adapters)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_truncate_and_weighted_product_equal_numpy():
  _, _, model = _util.lora_mlp(rank=3)
  adapters = _util.random_adapters(model, seed=5)
  cut = jax.jit(lora.truncate)(adapters, 2)
  for path, node in _util.np_nodes(cut).items():
    original = _util.np_nodes(adapters)[path]
    np.testing.assert_array_equal(node["a"][:2], original["a"][:2])
    np.testing.assert_array_equal(node["b"][:, :2], original["b"][:, :2])
    assert not np.any(node["a"][2:]) and not np.any(node["b"][:, 2:])
  rng = np.random.default_rng(6)
  a, b = rng.normal(size=(4, 3, 5)), rng.normal(size=(4, 6, 3))
  a[2] = np.nan  # a padding row (weight 0)
  weights = np.array([0.5, 0.25, 0.0, 0.25])
  got = jax.jit(lora.weighted_product)(jnp.asarray(a, jnp.float32),
                                       jnp.asarray(b, jnp.float32),
                                       jnp.asarray(weights, jnp.float32))
  want = sum(weights[k] * b[k] @ a[k] for k in (0, 1, 3))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_refusals_name_the_argument():
  base, variables, model = _util.lora_mlp(rank=2)
  key = jax.random.key(0)
  for kwargs, match in [({"rank": 0}, "rank"), ({"rank": 5}, "rank=5"),
                        ({"rank": 2, "alpha": -1.0}, "alpha"),
                        ({"rank": 2, "dropout": 1.0}, "dropout"),
                        ({"rank": 2, "freeze_a": True, "merged": True},
                         "freeze_a and merged"),
                        ({"rank": 2, "targets": "fc1"}, "targets"),
                        ({"rank": 2, "targets": ["fc("]}, "targets")]:
    with pytest.raises((TypeError, ValueError), match=match):
      lora.lora(base, variables, key=key, **kwargs)
  with pytest.raises(ValueError, match="base_variables"):
    lora.lora(base, {"params": {}}, rank=2, key=key)
  with pytest.raises(TypeError, match="model must be built by"):
    lora.spec(base)
  with pytest.raises(ValueError, match="apply: adapters are not LoRA"):
    model.apply(variables, np.zeros((1, 4), np.float32), False)
  assert lora.is_adapters(model.init(key))
  assert not lora.is_adapters(variables)
  assert not lora.is_adapters({"lora": {"fc1": {"a": np.zeros(1)}}})
