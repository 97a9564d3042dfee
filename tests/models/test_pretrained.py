"""``models.pretrained.load_pretrained`` against transformers' own forward:
the logits of tiny random checkpoints of each architecture, saved by
transformers beside them (``pretrained_fixtures/make_fixtures.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import types
from fedjax_agg.models import pretrained
from fedjax_agg.models.pretrained import _config
from fedjax_agg.models.pretrained import _llama
from tests.models import _pretrained_util as util

TOLERANCE = 1e-4


@pytest.mark.parametrize("name", util.FLOAT32)
def test_logits_equal_transformers(name):
  model, variables = pretrained.load_pretrained(util.folder(name))
  tokens, want = util.golden(name)
  logits, returned = jax.jit(model.apply)(variables, tokens)
  assert logits.shape == want.shape and logits.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(logits), want, rtol=0,
                             atol=TOLERANCE)
  assert returned is variables or jax.tree.structure(
      returned) == jax.tree.structure(variables)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", jnp.bfloat16])
def test_bfloat16_checkpoint_equals_transformers_float32_forward(dtype):
  # The file holds bfloat16 weights; the golden is transformers' float32
  # forward of those same weights. Stored in either dtype, the library
  # computes in float32, so both agree to float32 rounding.
  model, variables = pretrained.load_pretrained(
      util.folder("llama_bf16"), dtype=dtype)
  assert {leaf.dtype for leaf in jax.tree.leaves(variables)} == {
      jnp.dtype(dtype)}
  tokens, want = util.golden("llama_bf16")
  logits, _ = model.apply(variables, tokens)
  np.testing.assert_allclose(np.asarray(logits), want, rtol=0,
                             atol=TOLERANCE)


def test_bfloat16_storage_of_a_float32_checkpoint_is_its_rounding():
  _, full = pretrained.load_pretrained(util.folder("llama_gqa"))
  model, half = pretrained.load_pretrained(util.folder("llama_gqa"),
                                           dtype=jnp.bfloat16)
  for got, want in zip(jax.tree.leaves(half), jax.tree.leaves(full),
                       strict=True):
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got),
                                  np.asarray(want).astype(jnp.bfloat16))
  tokens, want = util.golden("llama_gqa")
  logits, _ = model.apply(half, tokens)
  assert np.all(np.isfinite(logits))
  # bfloat16 weights move the logits by bf16 rounding, no more.
  assert 1e-4 < np.max(np.abs(np.asarray(logits) - want)) < 0.2


def test_tied_and_untied_output_layers():
  _, untied = pretrained.load_pretrained(util.folder("llama_gqa"))
  _, tied = pretrained.load_pretrained(util.folder("llama_tied"))
  _, gpt2 = pretrained.load_pretrained(util.folder("gpt2"))
  assert untied["params"]["lm_head"]["kernel"].shape == (16, 64)
  assert "lm_head" not in tied["params"] and "lm_head" not in gpt2["params"]


def test_grouped_query_attention_shapes():
  _, variables = pretrained.load_pretrained(util.folder("llama_gqa"))
  attention = variables["params"]["model"]["layers_0"]["self_attn"]
  # hidden 16, 4 query heads and 2 key/value heads of head_dim 8.
  assert attention["q_proj"]["kernel"].shape == (16, 32)
  assert attention["k_proj"]["kernel"].shape == (16, 16)
  assert attention["v_proj"]["kernel"].shape == (16, 16)
  assert attention["o_proj"]["kernel"].shape == (32, 16)
  _, qwen = pretrained.load_pretrained(util.folder("qwen2"))
  attention = qwen["params"]["model"]["layers_1"]["self_attn"]
  assert {"q_proj", "k_proj", "v_proj"} == {
      name for name in attention if "bias" in attention[name]}


def test_the_llama3_fixture_exercises_every_frequency_band():
  # The fixture's rope_theta 100, head_dim 8, original 64, factors 1 and 4:
  # one frequency kept, two blended, one slowed by the factor 8.
  config = _config.read_config(str(util.folder("llama_gqa")))
  scaled = _llama.inverse_frequencies(config)
  plain = 100.0 ** (-np.arange(0, 8, 2) / 8)
  ratio = scaled / plain
  np.testing.assert_allclose(ratio[0], 1.0, rtol=1e-6)
  np.testing.assert_allclose(ratio[3], 1 / 8, rtol=1e-6)
  assert np.all((ratio[1:3] > 1 / 8 + 1e-3) & (ratio[1:3] < 1 - 1e-3))


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
def test_loss_is_the_next_token_cross_entropy(name):
  # The library's convention (as transformer_lm's): targets are the next
  # tokens, the logits at t score the token at t + 1.
  model, variables = pretrained.load_pretrained(util.folder(name))
  tokens, golden_logits = util.golden(name)
  x, y = tokens[:, :-1], tokens[:, 1:]
  logits, _ = model.apply(variables, x)
  loss = np.asarray(model.loss(logits, y))
  shifted = golden_logits[:, :-1].astype(np.float64)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  want = -np.take_along_axis(log_probs, y[..., None], -1)[..., 0].mean(-1)
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  assert model.loss is types.sequence_cross_entropy


def test_init_draws_the_checkpoint_tree():
  model, variables = pretrained.load_pretrained(util.folder("qwen2"),
                                                dtype="bfloat16")
  fresh = model.init(jax.random.key(0))
  assert jax.tree.structure(fresh) == jax.tree.structure(variables)
  for got, want in zip(jax.tree.leaves(fresh), jax.tree.leaves(variables),
                       strict=True):
    assert got.shape == want.shape and got.dtype == want.dtype


def test_remat_gives_the_same_logits_and_gradients():
  for name in ("gpt2", "llama_gqa"):
    plain, variables = pretrained.load_pretrained(util.folder(name))
    remat, _ = pretrained.load_pretrained(util.folder(name), remat=True)
    tokens, _ = util.golden(name)
    x, y = tokens[:, :-1], tokens[:, 1:]

    def loss(params, model, x, y):
      logits, _ = model.apply(params, x, True)
      return jnp.mean(model.loss(logits, y))

    for model in (plain, remat):
      value, grads = jax.jit(jax.value_and_grad(loss), static_argnums=1)(
          variables, model, x, y)
      if model is plain:
        want_value, want_grads = value, grads
    np.testing.assert_allclose(value, want_value, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads),
                         strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert np.any(jax.tree.leaves(grads)[0])
