"""The Llama family as Hugging Face lays it out: ``LlamaForCausalLM``
(Touvron et al., "LLaMA: Open and Efficient Foundation Language Models",
2023; Llama 3's RoPE scaling from its 2024 report and Meta's release),
``MistralForCausalLM`` and ``Qwen2ForCausalLM``.

Per block: RMSNorm, causal self-attention with rotary position embeddings
(RoPE, Su et al. 2021, the "rotate half" pairing of dimension i with
i + D/2) and grouped-query heads (``num_key_value_heads``), a residual;
RMSNorm, the SwiGLU MLP ``down_proj(silu(gate_proj(x)) * up_proj(x))``, a
residual. A final RMSNorm ``norm``, and ``lm_head`` (or the token
embedding transposed where ``tie_word_embeddings``).

Biases: Llama's ``attention_bias`` (q, k, v, o) and ``mlp_bias``; Qwen2's
q, k, v always; Mistral none. Mistral's (and Qwen2's, when
``use_sliding_window``) sliding-window attention is not implemented: a
sequence longer than ``sliding_window`` is refused, and within it the
window changes nothing (every earlier position is inside it).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg.models.pretrained import _common
from fedjax_agg.models.pretrained._config import LlamaConfig

LORA_TARGETS = (r"model/layers_\d+/self_attn/(q_proj|k_proj|v_proj|o_proj)",
                r"model/layers_\d+/mlp/(gate_proj|up_proj|down_proj)")
"""The attention and MLP projections (not the embeddings, not lm_head)."""

# A tied output layer's copy and older checkpoints' RoPE buffers.
IGNORED = (r"lm_head\.weight", r"model\.layers\.\d+\.self_attn\.rotary_emb"
           r"\.inv_freq")


def inverse_frequencies(config: LlamaConfig) -> np.ndarray:
  """RoPE's [D/2] angular frequencies theta^(-2i/D), rescaled by the
  config's ``rope_scaling`` ("linear": divided by ``factor``; "llama3":
  low frequencies divided by ``factor``, high ones kept, a smooth blend
  between), in float32 as Hugging Face computes them."""
  dim = config.head_dim
  exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim
  inv_freq = (1.0 / (np.float32(config.rope_theta) ** exponents)).astype(
      np.float32)
  if config.rope_scaling is None:
    return inv_freq
  scaling = dict(config.rope_scaling)
  factor = scaling["factor"]
  if scaling["rope_type"] == "linear":
    return (inv_freq / factor).astype(np.float32)
  # llama3: wavelengths past original / low_freq_factor are slowed by
  # factor, those below original / high_freq_factor kept, in between
  # interpolated linearly in original / wavelength.
  original = scaling["original_max_position_embeddings"]
  low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
  wavelength = 2 * math.pi / inv_freq
  scaled = np.where(wavelength > original / low, inv_freq / factor, inv_freq)
  smooth = (original / wavelength - low) / (high - low)
  blended = (1 - smooth) * scaled / factor + smooth * scaled
  medium = ~(wavelength < original / high) & ~(wavelength > original / low)
  return np.where(medium, blended, scaled).astype(np.float32)


def _rotate(x, cos, sin):
  """RoPE on [B, T, H, D]: x cos + rotate_half(x) sin."""
  half = x.shape[-1] // 2
  # Dimension i pairs with i + D/2 (Hugging Face's rotate_half), not with
  # i + 1 as in the RoPE paper: the checkpoints' q and k projections are
  # laid out for this pairing.
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos[:, None, :] + rotated * sin[:, None, :]


class RMSNorm(nn.Module):
  """x / sqrt(mean(x^2) + eps) * weight, in float32."""
  epsilon: float

  @nn.compact
  def __call__(self, x):
    weight = self.param("scale", nn.initializers.ones, (x.shape[-1],))
    # In float32 whatever the input, as Hugging Face normalises: a mean of
    # squares in bfloat16 loses precision. The weight is "scale" in flax,
    # "weight" in the file (``hf_name``).
    x = x.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True)
                          + self.epsilon)
    return x * weight.astype(jnp.float32)


class _Attention(nn.Module):
  config: LlamaConfig

  @nn.compact
  def __call__(self, x, cos, sin):
    config = self.config
    dim = config.head_dim

    def project(name, heads, bias):
      out = nn.Dense(heads * dim, use_bias=bias, dtype=jnp.float32,
                     name=name)(x)
      return out.reshape(x.shape[:-1] + (heads, dim))

    q = _rotate(project("q_proj", config.num_attention_heads,
                        config.qkv_bias), cos, sin)
    k = _rotate(project("k_proj", config.num_key_value_heads,
                        config.qkv_bias), cos, sin)
    v = project("v_proj", config.num_key_value_heads, config.qkv_bias)
    out = _common.causal_attention(q, k, v, dim ** -0.5)
    return nn.Dense(config.hidden_size, use_bias=config.o_bias,
                    dtype=jnp.float32, name="o_proj")(out)


class _MLP(nn.Module):
  config: LlamaConfig

  @nn.compact
  def __call__(self, x):
    config = self.config
    dense = lambda size, name: nn.Dense(  # noqa: E731
        size, use_bias=config.mlp_bias, dtype=jnp.float32, name=name)
    hidden = jax.nn.silu(dense(config.intermediate_size, "gate_proj")(x)) * (
        dense(config.intermediate_size, "up_proj")(x))
    return dense(config.hidden_size, "down_proj")(hidden)


class _Block(nn.Module):
  config: LlamaConfig

  @nn.compact
  def __call__(self, x, cos, sin):
    epsilon = self.config.rms_norm_eps
    x = x + _Attention(self.config, name="self_attn")(
        RMSNorm(epsilon, name="input_layernorm")(x), cos, sin)
    return x + _MLP(self.config, name="mlp")(
        RMSNorm(epsilon, name="post_attention_layernorm")(x))


class _Decoder(nn.Module):
  config: LlamaConfig
  remat: bool

  @nn.compact
  def __call__(self, tokens):
    config = self.config
    embed = nn.Embed(config.vocab_size, config.hidden_size,
                     dtype=jnp.float32, name="embed_tokens")
    x = embed(tokens)
    # T is static: the angles are numpy constants of the program, computed
    # once at trace time. Duplicated to D, since dimensions i and i + D/2
    # share angle i.
    angles = np.arange(tokens.shape[-1], dtype=np.float32)[:, None] * (
        inverse_frequencies(config)[None, :])
    angles = np.concatenate([angles, angles], axis=-1)
    cos, sin = jnp.asarray(np.cos(angles)), jnp.asarray(np.sin(angles))
    block = _common.block_class(_Block, self.remat)
    for layer in range(config.num_hidden_layers):
      x = block(config, name=f"layers_{layer}")(x, cos, sin)
    return RMSNorm(config.rms_norm_eps, name="norm")(x), embed


def network(config: LlamaConfig, remat: bool) -> nn.Module:
  """The Llama family: tokens [B, T] int -> logits [B, T, vocab_size]
  (sequences longer than a sliding window refused: it is not
  implemented)."""
  limit = None if config.sliding_window is None else (
      "sliding_window (not implemented)", config.sliding_window)
  return _common.CausalLM(_Decoder, "model", config, remat, limit)


def expected_tensors(param_shapes, names):
  """``_common.expected_tensors`` for the Llama family (every kernel a
  torch Linear)."""
  # One naming for the whole family; only GPT-2's files vary.
  del names
  return _common.expected_tensors(param_shapes)
