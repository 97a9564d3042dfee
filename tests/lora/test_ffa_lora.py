"""FFA-LoRA: the mean of B against NumPy, exact aggregation with the frozen
A, half FedIT's uplink on square layers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clock
from fedjax_agg import testing
from fedjax_agg.models import lora
from tests.lora import _util


def test_mean_of_b_equals_numpy_and_aggregation_is_exact():
  _, _, model = _util.lora_mlp(rank=3, freeze_a=True)
  global_params, clients, info = _util.cohort(model, 6, seed=1,
                                              garbage=(0, 3))
  rule = aggregators.ffa_lora()
  out, _, metrics = jax.jit(rule.aggregate)(global_params, clients, info,
                                            rule.init(global_params))
  weights = _util.np_weights(info)
  np.testing.assert_allclose(metrics["client_weights"], weights, rtol=1e-6)
  frozen = lora.spec(model).frozen_a
  for path, node in _util.np_nodes(clients).items():
    b = np.where(weights[:, None, None] > 0, node["b"], 0.0)
    mean_b = np.einsum("k,kor->or", weights, b)
    got_b = np.asarray(out["lora"][path]["b"], np.float64)
    np.testing.assert_allclose(got_b, mean_b, rtol=1e-5, atol=1e-6)
    # Eq. (2): mean_k(B_k) A = mean_k(B_k A), A the model's frozen one.
    a = np.asarray(frozen[path], np.float64)
    np.testing.assert_allclose(
        got_b @ a, np.einsum("k,kor,ri->oi", weights, b, a), rtol=1e-5,
        atol=1e-6)
    assert set(out["lora"][path]) == {"b"}


def test_uplink_is_half_of_fedits_on_square_layers():
  base, variables, _ = _util.lora_mlp()
  fedit_model = lora.lora(base, variables, rank=2, targets=["fc1"],
                          key=jax.random.key(0))  # fc1 is 4 x 4
  ffa_model = lora.lora(base, variables, rank=2, targets=["fc1"],
                        freeze_a=True, key=jax.random.key(0))
  fedit_params = fedit_model.init(jax.random.key(1))
  ffa_params = ffa_model.init(jax.random.key(1))
  assert clock.model_bytes(fedit_params) == 4 * 2 * (4 + 4)
  assert clock.model_bytes(ffa_params) * 2 == clock.model_bytes(fedit_params)
  assert lora.uplink_bytes(ffa_params) == 4 * 2 * 4


def test_refuses_adapters_holding_a_naming_ffa_lora():
  _, _, model = _util.lora_mlp(rank=2)
  params = model.init(jax.random.key(0))
  stacked = jax.tree.map(lambda x: jnp.stack([x, x]), params)
  info = testing.make_info([0, 1], [1.0, 2.0])
  with pytest.raises(ValueError, match="ffa_lora"):
    aggregators.ffa_lora().aggregate(params, stacked, info, ())
  plain = testing.make_params(np.random.default_rng(0))
  with pytest.raises(ValueError, match="ffa_lora: global_params are not"):
    aggregators.ffa_lora().aggregate(
        plain, jax.tree.map(lambda x: jnp.stack([x, x]), plain), info, ())
