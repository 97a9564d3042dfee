"""The adapters' gradients (the adapter product's own VJP) equal plain
autodiff through the merged network W0 + (alpha / r) B A, vmapped over
clients as the engine runs them, for every kind of adapters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg.models import lora
from tests.lora import _util


def _loss(apply, params, x):
  logits, _ = apply(params, x)
  return jnp.mean(jnp.sin(logits))  # any smooth scalar of every logit


@pytest.mark.parametrize("options", [{}, {"freeze_a": True},
                                     {"merged": True}])
def test_adapter_gradients_equal_autodiff_through_the_merged_network(
    options):
  base = _util.transformer()
  variables = base.init(jax.random.key(0))
  model = lora.lora(base, variables, rank=2, alpha=3.0,
                    targets=list(lora.TRANSFORMER_TARGETS),
                    key=jax.random.key(1), **options)
  clients = jax.tree.map(
      lambda *leaves: jnp.stack(leaves),
      *[_util.random_adapters(model, seed) for seed in (2, 3)])
  rng = np.random.default_rng(4)
  x = rng.integers(0, _util.VOCAB, size=(2, 3, _util.LENGTH))

  adapted = lambda params, x: model.apply(params, x, False)
  merged = lambda params, x: base.apply(lora.merge(model, params), x,
                                        False)
  got = jax.jit(jax.vmap(jax.grad(
      lambda p, x: _loss(adapted, p, x))))(clients, x)
  want = jax.jit(jax.vmap(jax.grad(
      lambda p, x: _loss(merged, p, x))))(clients, x)
  if options.get("merged"):
    # "merged" is frozen in the model (stop_gradient); through merge it
    # is not, so only A and B are compared.
    for tree in (got, want):
      for node in tree[lora.ADAPTERS].values():
        node.pop("merged")
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(w))) > 0  # a gradient that says something
