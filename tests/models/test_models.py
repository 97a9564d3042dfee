"""``models.get``: the ``Model`` contract (vmapped over clients, seeded
init, variables of networks without BatchNorm returned as they are) and
its argument checks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import models
from tests.models._util import _random_variables


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="name"):
    models.get("resnet", 10)
  with pytest.raises(ValueError, match="num_classes"):
    models.get("mlp2", 1)
  with pytest.raises(TypeError, match="hidden"):
    models.get("cnn_mcmahan", 10, hidden=3)


def test_vmap_over_stacked_client_params():
  model = models.get("cnn_fednnnn_cifar", 10, input_shape=(8, 8, 3))
  stacked = jax.tree.map(lambda a, b: np.stack([a, b]),
                         _random_variables(model, 0),
                         _random_variables(model, 1))
  x = jax.random.normal(jax.random.key(1), (2, 4, 8, 8, 3))

  @jax.jit
  def run(stacked, x):
    vmapped = jax.vmap(lambda v, xb: model.apply(v, xb, True))(stacked, x)
    one_by_one = [model.apply(jax.tree.map(lambda a, k=k: a[k], stacked),
                              x[k], True) for k in range(2)]
    return vmapped, one_by_one

  (logits, new_vars), one_by_one = run(stacked, x)
  assert logits.shape == (2, 4, 10)
  for k, (want, want_vars) in enumerate(one_by_one):
    np.testing.assert_allclose(logits[k], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        new_vars["batch_stats"]["bn11"]["mean"][k],
        want_vars["batch_stats"]["bn11"]["mean"], rtol=1e-5, atol=1e-6)


def test_init_is_vmappable_and_seeded():
  model = models.get("mlp2", 10, input_shape=(6,), hidden=4)

  @jax.jit
  def run(keys):
    return jax.vmap(model.init)(keys), model.init(keys[1])

  stacked, second = run(jax.random.split(jax.random.key(0), 3))
  kernel = stacked["params"]["fc1"]["kernel"]
  assert kernel.shape == (3, 6, 4)
  np.testing.assert_allclose(kernel[1], second["params"]["fc1"]["kernel"],
                             rtol=1e-6)
  assert not np.allclose(kernel[0], kernel[1])


def test_models_without_batchnorm_return_params_unchanged():
  model = models.get("cnn_fedlayerwise", 10, input_shape=(16, 16, 1))
  variables = _random_variables(model, 0)
  assert set(variables) == {"params"}
  logits, new_vars = model.apply(variables, jnp.zeros((2, 16, 16, 1)), True)
  assert logits.shape == (2, 10) and new_vars is variables


def test_equal_options_give_one_model_and_one_compiled_evaluation():
  from fedjax_agg import evaluation  # pylint: disable=g-import-not-at-top
  first = models.get("mlp2", num_classes=10, input_shape=[6], hidden=4)
  again = models.get("mlp2", num_classes=10.0, input_shape=(6,), hidden=4)
  assert again is first
  fn = evaluation.per_example_fn(first)
  assert evaluation.per_example_fn(again) is fn
  x, y = jnp.ones((3, 6)), jnp.array([0, 1, 2])
  fn(first.init(jax.random.key(0)), x, y)
  traced = fn._cache_size()
  fn(again.init(jax.random.key(1)), x + 1, y)
  assert fn._cache_size() == traced  # the second run compiles nothing
  for other in (models.get("mlp2", num_classes=10, input_shape=(6,),
                           hidden=5),
                models.get("mlp2", num_classes=9, input_shape=(6,), hidden=4),
                models.get("mlp2", num_classes=10, input_shape=(7,),
                           hidden=4)):
    assert other is not first
