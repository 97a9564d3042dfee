"""FLoRA: the merged update equals the average of the clients' products B_k
A_k, heterogeneous ranks and padding rows included."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import testing
from fedjax_agg.models import lora
from tests.lora import _util


@pytest.mark.parametrize("weighting", ["num_examples", "uniform"])
def test_merged_update_is_the_average_of_the_products(weighting):
  base, variables, model = _util.lora_mlp(rank=3, merged=True)
  ranks = [3, 1, 2, 3, 2, 1]
  global_params, clients, info = _util.cohort(model, 6, seed=2, ranks=ranks,
                                              garbage=(2, 5))
  rule = aggregators.flora(weighting)
  out, _, metrics = jax.jit(rule.aggregate)(global_params, clients, info,
                                            rule.init(global_params))
  weights = _util.np_weights(info, weighting)
  live = weights > 0
  old = _util.np_nodes(global_params)
  for path, node in _util.np_nodes(clients).items():
    a = np.where(live[:, None, None], node["a"], 0.0)
    b = np.where(live[:, None, None], node["b"], 0.0)
    average = np.einsum("k,kor,kri->oi", weights, b, a)
    got = out["lora"][path]
    np.testing.assert_allclose(
        np.asarray(got["merged"], np.float64) - old[path]["merged"], average,
        rtol=1e-5, atol=1e-5)
    # Eq. (4): new adapters, B = 0 and A fresh.
    assert not np.any(got["b"]) and got["a"].shape == node["a"].shape[1:]
    assert not np.allclose(got["a"], old[path]["a"])
  np.testing.assert_array_equal(
      metrics["stacked_rank"], sum(np.asarray(ranks)[live]))
  # The network after the round: W0 + (alpha / r) merged.
  merged_kernel = lora.merge(model, out)["params"]["fc1"]["kernel"]
  scale = lora.spec(model).scale
  np.testing.assert_allclose(
      merged_kernel, np.asarray(variables["params"]["fc1"]["kernel"])
      + scale * np.asarray(out["lora"]["fc1"]["merged"]).T, rtol=1e-5,
      atol=1e-6)
  del base


def test_refuses_adapters_without_merged_naming_flora():
  _, _, model = _util.lora_mlp(rank=2)
  params = model.init(jax.random.key(0))
  stacked = jax.tree.map(lambda x: jnp.stack([x, x]), params)
  info = testing.make_info([0, 1], [1.0, 2.0])
  with pytest.raises(ValueError, match="flora: .* needs"):
    aggregators.flora().aggregate(params, stacked, info, ())
