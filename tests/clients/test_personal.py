"""The default head of the personalised models: the last Dense layer."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_agg import models
from fedjax_agg import tree_math
from fedjax_agg.clients._personal import last_dense_layer
from tests.test_engine import tiny_model


class _Deep(nn.Module):
  @nn.compact
  def __call__(self, x):
    for _ in range(12):  # Dense_0 ... Dense_11
      x = nn.Dense(2)(x)
    return x


def _head_paths(shapes):
  is_local = last_dense_layer(shapes)
  return [p for p in tree_math.leaf_paths(shapes) if is_local(p)]


def test_default_head_is_the_last_dense_layer():
  tiny = jax.eval_shape(tiny_model().init, jax.random.key(0))
  assert _head_paths(tiny) == ["params/Dense_1/bias", "params/Dense_1/kernel"]
  # Numbers in names compare as numbers: Dense_11, not Dense_9.
  deep = jax.eval_shape(_Deep().init, jax.random.key(0), jnp.zeros((1, 3)))
  assert _head_paths(deep) == ["params/Dense_11/bias",
                               "params/Dense_11/kernel"]
  # Convolutions (4-D kernels) and BatchNorm are not Dense layers.
  cnn = models.get("cnn_fednnnn_cifar", input_shape=(8, 8, 3))
  shapes = jax.eval_shape(cnn.init, jax.random.key(0))
  assert _head_paths(shapes) == ["params/fc3/bias", "params/fc3/kernel"]
