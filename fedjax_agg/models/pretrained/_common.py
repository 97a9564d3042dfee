"""What the GPT-2 and Llama networks share: causal attention, and the
correspondence between a flax parameter path and a Hugging Face tensor.

Flax module names are Hugging Face's, a layer index joined by "_" instead
of "." ("model/layers_0/self_attn/q_proj" holds "model.layers.0.
self_attn.q_proj.weight"), so that the LoRA targets and PEFT's key names
are the same names.
"""

import re
from typing import Any, Optional

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

_INDEXED = re.compile(r"^(h|layers)_(\d+)$")


def causal_attention(q, k, v, scale: float):
  """Causal softmax attention with grouped-query heads.

  Args:
    q: [B, T, H, D] queries.
    k: [B, T, H_kv, D] keys (H a multiple of H_kv; query head h reads key
      head h // (H / H_kv), as Hugging Face repeats the key heads).
    v: [B, T, H_kv, D] values.
    scale: the logits' factor (1 / sqrt(D) usually).

  Returns:
    [B, T, H * D] the heads' outputs, concatenated.
  """
  batch, length, heads, dim = q.shape
  groups = heads // k.shape[2]
  k = jnp.repeat(k, groups, axis=2)
  v = jnp.repeat(v, groups, axis=2)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
  causal = jnp.tril(jnp.ones((length, length), bool))
  # Masked with the dtype's lowest value and a float32 softmax, as Hugging
  # Face's eager attention does, so the logits match it closely.
  logits = jnp.where(causal, logits, jnp.finfo(logits.dtype).min)
  weights = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  out = jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v)
  return out.reshape(batch, length, heads * dim)


class CausalLM(nn.Module):
  """tokens [B, T] int -> logits [B, T, vocab_size]: the family's body
  (embeddings, blocks, final norm; it returns the normed states and the
  token embedding), then the output layer, the embedding transposed where
  the config ties them (``tie_word_embeddings``), else ``lm_head``.

  Attributes:
    body: the body's module class, built as ``body(config, remat)``.
    body_name: Hugging Face's name of the body ("transformer", "model").
    config: the checked config.json.
    remat: rematerialise each block in the backward pass.
    limit: (config key, length) where longer sequences are refused.
  """
  body: Any
  body_name: str
  config: Any
  remat: bool = False
  limit: Optional[tuple[str, int]] = None

  @nn.compact
  def __call__(self, tokens, train: bool = False):
    del train  # no dropout: the pre-trained network is run as evaluated
    if self.limit is not None and tokens.shape[-1] > self.limit[1]:
      raise ValueError(f"sequences of {tokens.shape[-1]} tokens exceed the "
                       f"checkpoint's {self.limit[0]} {self.limit[1]}")
    x, embed = self.body(self.config, self.remat, name=self.body_name)(
        tokens)
    if self.config.tie_word_embeddings:
      # Tied: the output layer is the token embedding transposed, and no
      # lm_head tensor is read (a file's copy is IGNORED).
      return embed.attend(x)
    return nn.Dense(self.config.vocab_size, use_bias=False,
                    dtype=jnp.float32, name="lm_head")(x)


def block_class(module_class, remat: bool):
  """``module_class``, rematerialised in the backward pass if ``remat``
  (``nn.remat``: activations recomputed instead of stored)."""
  return nn.remat(module_class) if remat else module_class


def hf_name(path: tuple[str, ...]) -> str:
  """The Hugging Face tensor name of a flax parameter path."""
  parts = []
  for part in path[:-1]:
    match = _INDEXED.match(part)
    parts.append(f"{match[1]}.{match[2]}" if match else part)
  leaf = path[-1]
  # Flax's kernel, embedding and scale are all "weight" in Hugging Face's
  # names.
  parts.append("bias" if leaf == "bias" else "weight")
  return ".".join(parts)


def hf_module(path: str) -> str:
  """The Hugging Face module name of a '/'-joined flax module path."""
  return hf_name(tuple(path.split("/")) + ("kernel",))[:-len(".weight")]


def expected_tensors(param_shapes, linear=lambda path: True
                     ) -> dict[str, tuple[tuple[str, ...], tuple[int, ...],
                                          bool]]:
  """Hugging Face name -> (flax path, the tensor's shape in the file,
  whether the file holds the kernel transposed) of every parameter.

  A torch Linear's weight is [out, in], the kernel transposed; GPT-2's
  Conv1D stores it [in, out], as it is (``linear(path)`` False).
  """
  expected = {}
  for path, shape in traverse_util.flatten_dict(param_shapes).items():
    shape = tuple(shape.shape)
    transpose = path[-1] == "kernel" and linear(path)
    # The shape as the file holds it ([out, in] for a torch Linear), so a
    # mismatch is reported in the file's terms.
    expected[hf_name(path)] = (path, shape[::-1] if transpose else shape,
                               transpose)
  return expected


def to_params(arrays, expected, dtype):
  """The flax params tree from the file's tensors (named as in
  ``expected_tensors``), stored in ``dtype``."""
  flat = {}
  for name, (path, _, transpose) in expected.items():
    array = arrays[name].T if transpose else arrays[name]
    flat[path] = jnp.asarray(np.ascontiguousarray(array), dtype)
  return traverse_util.unflatten_dict(flat)
