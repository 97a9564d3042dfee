"""HetLoRA's server: the sparsity-weighted zero-padded average against
NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import testing
from tests.lora import _util


@pytest.mark.parametrize("weighting", ["sparsity", "num_examples"])
def test_padded_average_equals_numpy(weighting):
  _, _, model = _util.lora_mlp(rank=3)
  ranks = [3, 1, 2, 2, 3]
  global_params, clients, info = _util.cohort(model, 5, seed=3, ranks=ranks,
                                              garbage=(1,))
  rule = aggregators.hetlora(weighting)
  out, _, metrics = jax.jit(rule.aggregate)(global_params, clients, info,
                                            rule.init(global_params))
  live = np.asarray(info.mask) > 0
  nodes = _util.np_nodes(clients)
  # Eq. (2): S_k, the Frobenius norm of the whole reconstructed update.
  norms = np.sqrt(sum(
      np.sum((np.where(live[:, None, None], n["b"], 0.0)
              @ np.where(live[:, None, None], n["a"], 0.0)) ** 2, axis=(1, 2))
      for n in nodes.values()))
  if weighting == "sparsity":
    weights = np.where(live, norms, 0.0) / norms[live].sum()
  else:
    weights = _util.np_weights(info)
  np.testing.assert_allclose(metrics["update_norms"], norms, rtol=1e-5)
  np.testing.assert_allclose(metrics["client_weights"], weights, rtol=1e-5)
  for path, node in nodes.items():
    for leaf in ("a", "b"):
      values = np.where(live[:, None, None], node[leaf], 0.0)
      np.testing.assert_allclose(
          out["lora"][path][leaf], np.einsum("k,k...->...", weights, values),
          rtol=1e-5, atol=1e-6)
  # Components past every real client's rank stay zero-padded: only the
  # rank-3 clients fill the third one.
  third = np.asarray(out["lora"]["fc1"]["a"])[2]
  want = sum(weights[k] * nodes["fc1"]["a"][k, 2] for k in (0, 4))
  np.testing.assert_allclose(third, want, rtol=1e-5, atol=1e-6)


def test_refuses_what_is_not_trained_adapters_naming_hetlora():
  _, _, model = _util.lora_mlp(rank=2, freeze_a=True)
  params = model.init(jax.random.key(0))
  stacked = jax.tree.map(lambda x: jnp.stack([x, x]), params)
  info = testing.make_info([0, 1], [1.0, 2.0])
  with pytest.raises(ValueError, match="hetlora"):
    aggregators.hetlora().aggregate(params, stacked, info, ())
  with pytest.raises(ValueError, match="weighting"):
    aggregators.hetlora("norm")
