"""Tiny LoRA models and adapter cohorts for the LoRA tests."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import models
from fedjax_agg import testing
from fedjax_agg.models import lora

WIDTH = 8  # the tiny transformer's width (its attention layers are square)
VOCAB = 7
LENGTH = 5


def transformer():
  """A one-block transformer_lm of width 8 on 5 tokens."""
  return models.get("transformer_lm", num_classes=VOCAB,
                    input_shape=(LENGTH,), width=WIDTH, depth=1, heads=2,
                    max_length=LENGTH)


def mlp(batch_norm=False):
  """mlp2 on 4 features: fc1 4 -> 4 (square), fc2 4 -> 3."""
  return models.get("mlp2", num_classes=3, input_shape=(4,), hidden=4,
                    batch_norm=batch_norm)


def lora_mlp(rank=2, seed=0, **kwargs):
  """(base model, its variables, the LoRA model) on ``mlp``."""
  base = mlp(kwargs.pop("batch_norm", False))
  variables = base.init(jax.random.key(seed))
  return base, variables, lora.lora(base, variables, rank=rank,
                                    key=jax.random.key(seed + 1), **kwargs)


def random_adapters(model, seed, scale=0.5):
  """The model's adapters tree filled with N(0, scale^2) values."""
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(
      scale * rng.standard_normal(s.shape), jnp.float32), shapes)


def cohort(model, num, seed=0, ranks=None, garbage=()):
  """(global adapters, [num, ...] client adapters, info): clients near the
  global; a client of rank ``ranks[k]`` has its components past it zero;
  rows in ``garbage`` are padding (mask 0) full of NaN and 1e30."""
  global_params = random_adapters(model, seed)
  rng = np.random.default_rng(seed + 100)
  clients = jax.tree.map(lambda g: jnp.asarray(
      np.asarray(g)[None] + 0.3 * rng.standard_normal((num,) + g.shape),
      jnp.float32), global_params)
  if ranks is not None:
    clients = jax.vmap(lora.truncate)(clients, jnp.asarray(ranks))
  mask = np.ones(num)
  for i, row in enumerate(garbage):
    mask[row] = 0
    value = np.nan if i % 2 == 0 else 1e30
    clients = jax.tree.map(lambda x, row=row, value=value: x.at[row].set(
        value), clients)
  counts = rng.integers(1, 30, size=num).astype(np.float32)
  info = testing.make_info(np.arange(num) % 7, counts, mask)
  return global_params, clients, info


def np_nodes(tree):
  """path -> {leaf: float64 array} of an adapters tree."""
  return {path: {k: np.asarray(v, np.float64) for k, v in node.items()}
          for path, node in tree[lora.ADAPTERS].items()}


def np_weights(info, kind="num_examples"):
  """FedAvg's p_k in float64 (0 on padding rows)."""
  mask = np.asarray(info.mask) > 0
  raw = (np.asarray(info.num_examples, np.float64) if kind == "num_examples"
         else np.ones(mask.shape))
  raw = np.where(mask, raw, 0.0)
  return raw / raw.sum()
