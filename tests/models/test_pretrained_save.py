"""Checkpoints written back in Hugging Face's format: every fixture read,
written with ``save_pretrained`` and read again gives the same config,
params and logits (so transformers' logits, which the fixtures hold);
a fresh network from a config (``init_pretrained``) round-trips; adapters
merged into the base and exported give the adapted model's logits;
non-finite params, a user's file in the way and foreign models are
refused, writing nothing."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg.models import lora
from fedjax_agg.models import pretrained
from tests.models import _pretrained_util as util


@pytest.mark.parametrize("name", util.FLOAT32)
def test_a_saved_checkpoint_reads_back_equal(name, tmp_path):
  model, variables = pretrained.load_pretrained(util.folder(name))
  pretrained.save_pretrained(tmp_path / "out", model, variables)
  again, read = pretrained.load_pretrained(tmp_path / "out")
  assert again.apply.config == model.apply.config
  jax.tree.map(np.testing.assert_array_equal, read, variables)
  tokens, logits = util.golden(name)
  out, _ = jax.jit(again.apply)(read, tokens)
  np.testing.assert_allclose(out, logits, atol=1e-4)


@pytest.mark.parametrize("config", [
    {"architectures": ["GPT2LMHeadModel"], "vocab_size": 40,
     "n_positions": 16, "n_embd": 16, "n_layer": 1, "n_head": 2},
    {"architectures": ["LlamaForCausalLM"], "vocab_size": 40,
     "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
     "num_attention_heads": 4, "num_key_value_heads": 2,
     "max_position_embeddings": 32, "tie_word_embeddings": True},
])
def test_a_fresh_network_round_trips(config, tmp_path):
  model, variables = pretrained.init_pretrained(config, jax.random.key(0))
  pretrained.save_pretrained(tmp_path / "fresh", model, variables)
  again, read = pretrained.load_pretrained(tmp_path / "fresh")
  tokens = jnp.arange(24, dtype=jnp.int32).reshape(2, 12) % 40
  np.testing.assert_allclose(again.apply(read, tokens)[0],
                             model.apply(variables, tokens)[0], atol=1e-6)
  written = json.loads((tmp_path / "fresh" / "config.json").read_text())
  assert written["architectures"] == config["architectures"]


def test_merged_adapters_export_as_a_plain_checkpoint(tmp_path):
  model, variables = pretrained.load_pretrained(util.folder("llama_gqa"))
  adapted = lora.lora(model, variables, rank=2, key=jax.random.key(1))
  adapters = jax.tree.map(lambda x: x + 0.05,
                          adapted.init(jax.random.key(2)))
  merged = lora.merge(adapted, adapters)
  pretrained.save_pretrained(tmp_path / "merged", model, merged)
  plain, read = pretrained.load_pretrained(tmp_path / "merged")
  tokens, _ = util.golden("llama_gqa")
  want, _ = adapted.apply(adapters, tokens)
  got, _ = plain.apply(read, tokens)
  assert float(jnp.max(jnp.abs(want - model.apply(variables, tokens)[0]))
               ) > 1e-2  # the adapters moved the logits
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_refusals_write_nothing(tmp_path):
  model, variables = pretrained.load_pretrained(util.folder("gpt2"))
  leaves, tree = jax.tree.flatten(variables)
  spoiled = jax.tree.unflatten(tree, [leaves[0].at[0].set(jnp.nan)]
                               + leaves[1:])
  with pytest.raises(ValueError, match="non-finite"):
    pretrained.save_pretrained(tmp_path / "nan", model, spoiled)
  assert not (tmp_path / "nan").exists()
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "config.json").write_text("{}")
  with pytest.raises(ValueError, match="config.json"):
    pretrained.save_pretrained(mine, model, variables)
  assert (mine / "config.json").read_text() == "{}"
  assert not (mine / "model.safetensors").exists()
  adapted = lora.lora(model, variables, rank=2, key=jax.random.key(0))
  with pytest.raises(TypeError, match="merge it first"):
    pretrained.save_pretrained(tmp_path / "lora", adapted, variables)
  with pytest.raises(ValueError, match="n_head"):
    pretrained.init_pretrained(
        {"architectures": ["GPT2LMHeadModel"], "vocab_size": 40,
         "n_positions": 16, "n_embd": 15, "n_layer": 1, "n_head": 2},
        jax.random.key(0))
