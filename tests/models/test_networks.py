"""The papers' networks: parameter counts, the conv lowerings against
flax.linen.Conv, BatchNorm's running statistics.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import models
from fedjax_agg.models import layers
from tests.models._util import _random_variables


def _conv_trainable(kh, kw, cin, cout):
  return kh * kw * cin * cout + cout


def _dense(fan_in, fan_out):
  return fan_in * fan_out + fan_out


# Counts from the papers, and re-derived from the layer shapes they list.
PAPER_COUNTS = {
    # FedAvg CNN, SAME padding: 28 -> 14 -> 7.
    "cnn_mcmahan": (1_663_370, _conv_trainable(5, 5, 1, 32)
                    + _conv_trainable(5, 5, 32, 64) + _dense(7 * 7 * 64, 512)
                    + _dense(512, 10)),
    # FedLayerWise §IV-A: "totaling 582,026"; FC layers 1024x512, 512x10.
    "cnn_fedlayerwise": (582_026, _conv_trainable(5, 5, 1, 32)
                         + _conv_trainable(5, 5, 32, 64) + _dense(1024, 512)
                         + _dense(512, 10)),
    # FedNNNN Table 3: Fc1 50*4*4 -> 500.
    "cnn_fednnnn_mnist": (431_080, _conv_trainable(5, 5, 1, 20)
                          + _conv_trainable(5, 5, 20, 50)
                          + _dense(50 * 4 * 4, 500) + _dense(500, 10)),
    # FedNNNN Table 4 (+ BN scale and offset per channel).
    "cnn_fednnnn_cifar": (1_146_088, sum(
        _conv_trainable(3, 3, cin, cout) + 2 * cout for cin, cout in
        [(3, 32), (32, 32), (32, 64), (64, 64), (64, 128), (128, 128)])
                          + _dense(128 * 4 * 4, 382) + _dense(382, 192)
                          + _dense(192, 10)),
    "mlp2": (159_010, _dense(784, 200) + _dense(200, 10)),
    # The TensorFlow tutorial's model.summary() total.
    "cnn_tf_cifar": (122_570, _conv_trainable(3, 3, 3, 32)
                     + _conv_trainable(3, 3, 32, 64)
                     + _conv_trainable(3, 3, 64, 64) + _dense(4 * 4 * 64, 64)
                     + _dense(64, 10)),
}


@pytest.mark.parametrize("name", sorted(PAPER_COUNTS))
def test_param_counts_equal_papers(name):
  paper, derived = PAPER_COUNTS[name]
  assert paper == derived
  model = models.get(name, 10)
  variables = jax.eval_shape(model.init, jax.random.key(0))
  assert models.count_params(variables) == paper


def test_vgg11_param_count_for_cifar100():
  cfg = [(3, 64), (64, 128), (128, 256), (256, 256), (256, 512), (512, 512),
         (512, 512), (512, 512)]
  expected = (sum(_conv_trainable(3, 3, a, b) for a, b in cfg)
              + _dense(512, 512) * 2 + _dense(512, 100))
  variables = jax.eval_shape(models.get("vgg11", 100).init,
                             jax.random.key(0))
  assert models.count_params(variables) == expected == 9_797_092


def test_mlp2_hidden_width_and_flat_input():
  model = models.get("mlp2", 10, input_shape=(60,), hidden=7)
  variables = _random_variables(model, 0)
  assert models.count_params(variables) == 60 * 7 + 7 + 7 * 10 + 10
  logits, _ = jax.jit(model.apply, static_argnums=2)(
      variables, jnp.ones((3, 60)), False)
  p = variables["params"]
  want = (np.maximum(np.ones((3, 60)) @ p["fc1"]["kernel"] + p["fc1"]["bias"],
                     0) @ p["fc2"]["kernel"] + p["fc2"]["bias"])
  np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)


class _ReferenceConv(nn.Conv):
  """flax.linen.Conv that accepts (and ignores) ``impl``."""
  impl: str = "xla"


# Small input shapes keep the comparison fast; every conv model is covered.
CONV_MODELS = {
    "cnn_mcmahan": (12, 12, 1),
    "cnn_fedlayerwise": (16, 16, 1),
    "cnn_fednnnn_mnist": (16, 16, 1),
    "cnn_fednnnn_cifar": (8, 8, 3),
    "cnn_tf_cifar": (18, 18, 3),
    "vgg11": (32, 32, 3),
}


GRAD_MODELS = ("cnn_fedlayerwise", "cnn_fednnnn_cifar")
# Every lowering once: an alias ("auto") is covered by what it resolves to.
CONCRETE_IMPLS = sorted({layers.resolve_impl(i) for i in layers.CONV_IMPLS})


@pytest.mark.parametrize("impl", CONCRETE_IMPLS)
@pytest.mark.parametrize("name", sorted(CONV_MODELS))
def test_conv_impl_matches_flax_linen_conv(name, impl, monkeypatch):
  shape = CONV_MODELS[name]
  model = models.get(name, 10, input_shape=shape, conv_impl=impl)
  monkeypatch.setattr(layers, "Conv", _ReferenceConv)
  ref_model = models.get(name, 10, input_shape=shape, conv_impl=impl)
  monkeypatch.undo()
  variables = _random_variables(model, 1)
  assert (jax.tree.map(jnp.shape, variables)
          == jax.tree.map(jnp.shape, jax.eval_shape(ref_model.init,
                                                    jax.random.key(1))))
  x = jax.random.normal(jax.random.key(2), (2,) + shape)

  def loss(model, variables, x):
    logits, new_vars = model.apply(variables, x, True)
    return jnp.sum(jnp.sin(logits)), (logits, new_vars)

  # The gradient (the impls' custom backward passes) is compared on the
  # models covering VALID and SAME padding, 3x3 and 5x5 kernels and
  # BatchNorm; the other models' forward passes only (to keep tests fast).
  with_grad = name in GRAD_MODELS

  @jax.jit
  def both(variables, x):
    # Train mode exercises BatchNorm with batch statistics as well.
    if with_grad:
      return [jax.grad(loss, argnums=1, has_aux=True)(m, variables, x)
              for m in (model, ref_model)]
    return [(None, loss(m, variables, x)[1]) for m in (model, ref_model)]

  (got_grad, (got, got_vars)), (want_grad, (want, want_vars)) = both(
      variables, x)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
  jax.tree.map(close, got_vars, want_vars)
  if with_grad:
    jax.tree.map(close, got_grad["params"], want_grad["params"])


def test_batchnorm_train_updates_stats_eval_keeps_them():
  model = models.get("cnn_fednnnn_cifar", 10, input_shape=(8, 8, 3))
  variables = _random_variables(model, 0)
  x = 3.0 + jax.random.normal(jax.random.key(1), (5, 8, 8, 3))
  apply = jax.jit(model.apply, static_argnums=2)
  _, after_eval = apply(variables, x, False)
  jax.tree.map(np.testing.assert_array_equal, after_eval, variables)
  _, after_train = apply(variables, x, True)
  assert jax.tree.structure(after_train) == jax.tree.structure(variables)
  # Params are untouched; the first BN's running mean moves 10% of the way
  # (PyTorch's momentum 0.1) towards the batch mean of conv11's output.
  jax.tree.map(np.testing.assert_array_equal, after_train["params"],
               variables["params"])
  conv = variables["params"]["conv11"]
  pre = _numpy_conv_same(np.asarray(x), np.asarray(conv["kernel"]))
  pre = pre + np.asarray(conv["bias"])
  np.testing.assert_allclose(after_train["batch_stats"]["bn11"]["mean"],
                             0.9 * variables["batch_stats"]["bn11"]["mean"]
                             + 0.1 * pre.mean((0, 1, 2)),
                             rtol=1e-4, atol=1e-6)


def _numpy_conv_same(x, kernel):
  """Independent NHWC 'SAME' stride-1 convolution in numpy."""
  kh, kw = kernel.shape[:2]
  pad = np.pad(x, ((0, 0), ((kh - 1) // 2, kh // 2), ((kw - 1) // 2, kw // 2),
                   (0, 0)))
  out = np.zeros(x.shape[:3] + (kernel.shape[-1],))
  for i in range(kh):
    for j in range(kw):
      window = pad[:, i:i + x.shape[1], j:j + x.shape[2], :]
      out += np.einsum("bhwc,cf->bhwf", window, kernel[i, j])
  return out
