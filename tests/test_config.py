"""Configuration objects: ``client_optimizer`` (SGD / Adam with weight decay
that never touches BatchNorm statistics) and the fields each object
refuses by name.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import config
from fedjax_agg import loop
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.config import NonFinite
from fedjax_agg.config import Privacy


def _tree():
  return {"params": {"w": jnp.array([1.0, -2.0])},
          "batch_stats": {"mean": jnp.array([3.0])}}


def _step(factory, lr=0.1):
  opt = optax.inject_hyperparams(factory)(learning_rate=lr)
  params = _tree()
  grads = {"params": {"w": jnp.array([0.5, 0.5])},
           "batch_stats": {"mean": jnp.array([0.0])}}
  updates, _ = jax.jit(opt.update)(grads, opt.init(params), params)
  return optax.apply_updates(params, updates)


def test_sgd_weight_decay_is_coupled_and_skips_statistics():
  got = _step(config.client_optimizer("sgd", weight_decay=0.01))
  # w - lr (g + wd w)
  np.testing.assert_allclose(got["params"]["w"],
                             [1.0 - 0.1 * (0.5 + 0.01), -2.0 - 0.1 * (
                                 0.5 - 0.02)], rtol=1e-6)
  np.testing.assert_array_equal(got["batch_stats"]["mean"], [3.0])


def test_plain_choices_equal_optax():
  for factory, reference in (
      (config.client_optimizer("sgd"), optax.sgd),
      (config.client_optimizer("adam"), optax.adam),
      (config.client_optimizer("sgd", momentum=0.9),
       lambda learning_rate: optax.sgd(learning_rate, momentum=0.9))):
    # (inject_hyperparams turns Adam's eps into a float32 array: rounding)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5),
                 _step(factory), _step(reference))


@pytest.mark.parametrize("kwargs,name", [
    (dict(name="rmsprop"), "name"),
    (dict(momentum=1.0), "momentum"),
    (dict(weight_decay=-1e-4), "weight_decay"),
    (dict(weight_decay=float("nan")), "weight_decay"),
    (dict(name="adam", momentum=0.5), "momentum"),
])
def test_bad_arguments_are_named(kwargs, name):
  with pytest.raises(ValueError, match=name):
    config.client_optimizer(**kwargs)


@pytest.mark.parametrize("kwargs,name", [
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(noise_multiplier=float("nan")), "noise_multiplier"),
    (dict(noise_multiplier=1.0, delta=0.0), "delta"),
    (dict(noise_multiplier=1.0, accountant="moments"), "accountant"),
    (dict(noise_multiplier=1.0, sampling="shuffle"), "sampling"),
    (dict(noise_multiplier=1.0, accountant="pld"), "pld"),
    (dict(noise_multiplier=1.0, target_epsilon=0.0), "target_epsilon"),
])
def test_privacy_config_names_the_bad_field(kwargs, name):
  with pytest.raises(ValueError, match=name):
    Privacy(**kwargs)


def test_bad_configuration_values_are_named():
  for kwargs, name in (({"epochs": 0}, "epochs"),
                       ({"learning_rate": float("nan")}, "learning_rate"),
                       ({"batch_size": "16"}, "batch_size"),
                       ({"compute_losses": "yes"}, "compute_losses")):
    with pytest.raises((TypeError, ValueError), match=name):
      LocalTraining(**kwargs)
  with pytest.raises(ValueError, match="chunk_loop"):
    Execution(chunk_loop="loop")
  with pytest.raises(ValueError, match="clients"):
    NonFinite(clients="drop")
  with pytest.raises(ValueError, match="seed"):
    loop.seed_keys(-1)
