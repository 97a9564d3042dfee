"""GPT-2 (Radford et al., "Language Models are Unsupervised Multitask
Learners", 2019) as Hugging Face's ``GPT2LMHeadModel`` lays it out.

Learned token and position embeddings; per block a pre-LayerNorm causal
self-attention whose query, key and value come from one fused projection
``c_attn`` [C, 3C] and an MLP ``c_fc`` -> activation -> ``c_proj``; a final
LayerNorm ``ln_f``; the output layer is the token embedding transposed
(tied) unless config.json unties it. Hugging Face's ``Conv1D`` layers store
their weight as [in, out], a flax kernel as it is.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg.models.pretrained import _common
from fedjax_agg.models.pretrained._config import GPT2Config

LORA_TARGETS = (r"transformer/h_\d+/attn/(c_attn|c_proj)",
                r"transformer/h_\d+/mlp/(c_fc|c_proj)")
"""GPT-2's attention and MLP projections (not the embeddings)."""

# Buffers of older checkpoints (causal masks) and a tied output layer's
# copy: present in some files, never read.
IGNORED = (r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)",
           r"lm_head\.weight")

# gelu_new and gelu_pytorch_tanh are both the tanh approximation; "gelu"
# is the exact erf form.
_ACTIVATIONS = {"gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
                "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x,
                                                           approximate=True),
                "gelu": lambda x: jax.nn.gelu(x, approximate=False),
                "relu": jax.nn.relu}


class _Attention(nn.Module):
  config: GPT2Config
  layer: int

  @nn.compact
  def __call__(self, x):
    config = self.config
    heads, width = config.n_head, config.n_embd
    qkv = nn.Dense(3 * width, dtype=jnp.float32, name="c_attn")(x)
    # c_attn's columns are [q | k | v], each heads x head_dim with the head
    # outer, the order in which Hugging Face splits them.
    q, k, v = (part.reshape(x.shape[:-1] + (heads, width // heads))
               for part in jnp.split(qkv, 3, axis=-1))
    scale = 1.0
    if config.scale_attn_weights:
      scale /= float(np.sqrt(width // heads))
    if config.scale_attn_by_inverse_layer_idx:
      # Hugging Face divides by the 1-based layer index.
      scale /= float(self.layer + 1)
    out = _common.causal_attention(q, k, v, scale)
    return nn.Dense(width, dtype=jnp.float32, name="c_proj")(out)


class _MLP(nn.Module):
  config: GPT2Config

  @nn.compact
  def __call__(self, x):
    hidden = nn.Dense(self.config.n_inner, dtype=jnp.float32, name="c_fc")(x)
    hidden = _ACTIVATIONS[self.config.activation_function](hidden)
    return nn.Dense(self.config.n_embd, dtype=jnp.float32, name="c_proj")(
        hidden)


class _Block(nn.Module):
  config: GPT2Config
  layer: int

  @nn.compact
  def __call__(self, x):
    epsilon = self.config.layer_norm_epsilon
    # The two-pass variance, as PyTorch's LayerNorm computes it; the fast
    # E[x^2] - E[x]^2 form drifts further from the checkpoint's own logits.
    norm = lambda name: nn.LayerNorm(epsilon, dtype=jnp.float32,  # noqa: E731
                                     use_fast_variance=False, name=name)
    x = x + _Attention(self.config, self.layer, name="attn")(norm("ln_1")(x))
    return x + _MLP(self.config, name="mlp")(norm("ln_2")(x))


class _Transformer(nn.Module):
  config: GPT2Config
  remat: bool

  @nn.compact
  def __call__(self, tokens):
    config = self.config
    embed = nn.Embed(config.vocab_size, config.n_embd, dtype=jnp.float32,
                     name="wte")
    positions = nn.Embed(config.n_positions, config.n_embd,
                         dtype=jnp.float32, name="wpe")
    x = embed(tokens) + positions(jnp.arange(tokens.shape[-1]))
    block = _common.block_class(_Block, self.remat)
    for layer in range(config.n_layer):
      x = block(config, layer, name=f"h_{layer}")(x)
    x = nn.LayerNorm(config.layer_norm_epsilon, dtype=jnp.float32,
                     use_fast_variance=False, name="ln_f")(x)
    return x, embed


def network(config: GPT2Config, remat: bool) -> nn.Module:
  """GPT-2: tokens [B, T] int -> logits [B, T, vocab_size]."""
  return _common.CausalLM(_Transformer, "transformer", config, remat,
                          ("n_positions", config.n_positions))


def expected_tensors(param_shapes, names):
  """``_common.expected_tensors`` for GPT-2, whose checkpoints come with
  the "transformer." prefix (``GPT2LMHeadModel``) or without it (the
  original files, saved from ``GPT2Model``); ``names`` are the file's."""
  # Conv1D layers keep [in, out]; only an untied output layer is a Linear.
  expected = _common.expected_tensors(
      param_shapes, linear=lambda path: path[0] == "lm_head")
  if "transformer.wte.weight" not in names and "wte.weight" in names:
    expected = {name.removeprefix("transformer."): entry
                for name, entry in expected.items()}
  return expected
