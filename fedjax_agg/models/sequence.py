"""Language models for next-token tasks: character and word LSTMs and a
small causal transformer. Each reads int32 tokens [B, T] and returns
logits [B, T, V] (V = ``num_classes``, the vocabulary, shared by inputs
and outputs); the task loss is ``types.sequence_cross_entropy`` over the
positions whose target is not padding.

* ``CharLSTM``: the Shakespeare model of McMahan et al., "Communication-
  Efficient Learning of Deep Networks from Decentralized Data" (AISTATS
  2017) and of LEAF (Caldas et al. 2018): an 8-dimensional character
  embedding, two LSTM layers of 256 units and a softmax over the
  characters. With LEAF's 80 characters it has 817,872 parameters; the
  FedAvg paper reports 866,578 for its own (unstated) character set.
* ``WordLSTM``: the Stack Overflow next-word model of Reddi et al.,
  "Adaptive Federated Optimization" (ICLR 2021): embedding 96, one LSTM
  layer of 670 units, a dense projection to 96 and a softmax over the
  vocabulary (10,000 words + 4 special tokens: 4,050,748 parameters).
* ``TransformerLM``: a pre-LayerNorm causal transformer (learned position
  embeddings, ``depth`` blocks of ``heads``-head self-attention and a
  4x-wide GELU MLP, a final LayerNorm and an untied output layer).

The LSTM cells are flax's ``OptimizedLSTMCell``: per gate an input kernel
without bias and a recurrent kernel with bias, i.e. ``4 (d h + h h + h)``
parameters per layer, the count of the papers' (Keras/TF) LSTMs.
"""

from typing import Optional

import flax.linen as nn
import jax.numpy as jnp


class CharLSTM(nn.Module):
  """Embedding, stacked LSTMs, an optional dense projection, and a
  per-position softmax layer."""
  num_classes: int
  embed_dim: int = 8
  hidden: int = 256
  num_layers: int = 2
  projection: Optional[int] = None

  @nn.compact
  def __call__(self, tokens, train: bool = False):
    del train  # no dropout or batch statistics
    x = nn.Embed(self.num_classes, self.embed_dim)(tokens)
    for _ in range(self.num_layers):
      x = nn.RNN(nn.OptimizedLSTMCell(self.hidden))(x)
    if self.projection is not None:
      x = nn.Dense(self.projection)(x)
    return nn.Dense(self.num_classes)(x)


class WordLSTM(CharLSTM):
  """``CharLSTM`` with Reddi et al.'s Stack Overflow sizes: embedding 96,
  one LSTM of 670 units, a projection to 96."""
  embed_dim: int = 96
  hidden: int = 670
  num_layers: int = 1
  projection: Optional[int] = 96


class _Block(nn.Module):
  """Pre-LayerNorm causal self-attention and MLP, each with a residual."""
  width: int
  heads: int

  @nn.compact
  def __call__(self, x, mask):
    attended = nn.MultiHeadDotProductAttention(
        num_heads=self.heads, qkv_features=self.width)(
            nn.LayerNorm()(x), mask=mask)
    x = x + attended
    hidden = nn.gelu(nn.Dense(4 * self.width)(nn.LayerNorm()(x)))
    return x + nn.Dense(self.width)(hidden)


class TransformerLM(nn.Module):
  """A small causal transformer language model."""
  num_classes: int
  width: int = 128
  depth: int = 2
  heads: int = 4
  max_length: int = 80

  @nn.compact
  def __call__(self, tokens, train: bool = False):
    del train
    # Checked at trace time (sizes are static): a bad size fails at init,
    # not inside the attention's reshape.
    if self.width % self.heads:
      raise ValueError(f"width ({self.width}) must be a multiple of heads "
                       f"({self.heads})")
    length = tokens.shape[-1]
    if length > self.max_length:
      raise ValueError(f"sequences of {length} tokens exceed max_length "
                       f"{self.max_length}")
    x = nn.Embed(self.num_classes, self.width)(tokens)
    positions = self.param("positions", nn.initializers.normal(0.02),
                           (self.max_length, self.width))
    # A table of max_length positions: a shorter sequence uses its first
    # ``length`` rows, so one set of parameters serves every T.
    x = x + positions[:length]
    # Causal mask only: padding sits at the end of a row, so no real position
    # attends to it, and the loss skips padded targets.
    mask = nn.make_causal_mask(jnp.ones(tokens.shape, jnp.int32))
    for _ in range(self.depth):
      x = _Block(self.width, self.heads)(x, mask)
    return nn.Dense(self.num_classes)(nn.LayerNorm()(x))
