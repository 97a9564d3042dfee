"""Pre-trained language models from Hugging Face checkpoint folders.

``load_pretrained(folder)`` reads a LOCAL folder in Hugging Face's format
(``config.json``; ``model.safetensors``, or shards listed by
``model.safetensors.index.json``), through the ``safetensors`` package's
numpy API (no PyTorch), and returns ``(model, variables)``: a
``types.Model`` whose ``apply(variables, tokens [B, T] int32, train)``
gives the logits [B, T, V] of the checkpoint's own forward pass, and its
variables ``{"params": ...}``. Nothing is ever downloaded.

Architectures (config.json's ``architectures``): ``ARCHITECTURES``, i.e.
GPT-2 (``GPT2LMHeadModel``) and the Llama family (``LlamaForCausalLM``,
``MistralForCausalLM``, ``Qwen2ForCausalLM``; RoPE scaling types
``ROPE_TYPES``). Mistral's sliding window is not implemented: sequences
longer than ``sliding_window`` are refused. The networks are flax modules
whose Dense layers carry Hugging Face's module names (``q_proj`` ...
``down_proj``; GPT-2's ``c_attn``, ``c_proj``, ``c_fc``), a layer index
joined by "_" ("model/layers_0/self_attn/q_proj").

Loss and targets: the model's ``loss`` is ``types.sequence_cross_entropy``
and the logits at position t score the token at t + 1, as for
``transformer_lm``: a task gives tokens x [B, T] and targets y [B, T] =
the next tokens (``types.PAD_TARGET`` where not scored), as
``fedjax_agg.data`` builds them.

LoRA: ``models.lora.lora(model, variables, rank=r)`` on a loaded model
adapts, by default, the attention and MLP projections (``LORA_TARGETS``;
PEFT's ``target_modules="all-linear"`` less the output layer), never the
embeddings or ``lm_head``. ``save_peft_adapters`` writes the trained
adapters in PEFT's format (``adapter_config.json`` and
``adapter_model.safetensors``).

Precision: the variables are stored in ``dtype`` (float32 or bfloat16)
and the network computes in float32. ``remat=True`` recomputes each
block's activations in the backward pass (``nn.remat``) instead of
keeping them: the same logits and gradients, less memory. On CPU the
saving needs XLA's memory-ordering scheduler, set before JAX starts
(``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false``):
the default scheduler runs the recomputations early and holds their
activations, so a 100M-parameter Llama's cohort measured the same with
and without ``remat`` (experiments/fine_tuning/RESULTS.md).

As a run's base (a description's ``model.name`` "pretrained" with
``model.base`` the folder): ``is_checkpoint`` recognises such a folder,
``check_checkpoint`` checks config.json and every weight file's header
without reading a tensor, and ``checkpoint_files`` gives the SHA-256 of
each file the network is read from (recorded in the run's config and its
checkpoints' fingerprint).

Every file is checked before use, and an error names the file and the key
or tensor at fault: config.json (JSON, types, finite numbers, bounded
sizes), the index (shard names plain file names in the folder), each
safetensors header (its length and tensors' byte ranges against the
file's size), every tensor's presence and shape against config.json, and
finite weights.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_agg.models.pretrained import _common
from fedjax_agg.models.pretrained import _config
from fedjax_agg.models.pretrained import _files
from fedjax_agg.models.pretrained._folder import check_checkpoint
from fedjax_agg.models.pretrained._folder import checkpoint_files
from fedjax_agg.models.pretrained._folder import is_checkpoint
from fedjax_agg.models.pretrained import _gpt2
from fedjax_agg.models.pretrained import _llama
from fedjax_agg.models.pretrained import _save
from fedjax_agg.models.pretrained._peft import read_peft_adapters
from fedjax_agg.models.pretrained._peft import save_peft_adapters
from fedjax_agg.types import Model, Params, sequence_cross_entropy

__all__ = ["ARCHITECTURES", "DTYPES", "LORA_TARGETS", "ROPE_TYPES",
           "PretrainedApply", "check_checkpoint", "checkpoint_files",
           "init_pretrained", "is_checkpoint", "load_pretrained",
           "read_peft_adapters", "save_peft_adapters", "save_pretrained"]

ARCHITECTURES = _config.ARCHITECTURES
"""The config.json ``architectures`` that load."""
ROPE_TYPES = _config.ROPE_TYPES
"""The RoPE scaling types understood ("default" is plain RoPE)."""
DTYPES = ("float32", "bfloat16")
"""The storage dtypes of the loaded variables."""
LORA_TARGETS = {
    _config.GPT2: _gpt2.LORA_TARGETS, _config.LLAMA: _llama.LORA_TARGETS,
    _config.MISTRAL: _llama.LORA_TARGETS, _config.QWEN2: _llama.LORA_TARGETS}
"""Architecture -> the regular expressions of the layers ``lora`` adapts
by default on a loaded model (attention and MLP projections)."""


@dataclasses.dataclass(frozen=True, eq=False)
class PretrainedApply:
  """``apply(variables, tokens [B, T], train) -> (logits [B, T, V],
  variables)`` of a loaded checkpoint.

  Attributes:
    network: the flax module.
    config: the checked config.json (``architecture`` names it).
    lora_targets: the layers ``models.lora.lora`` adapts when given no
      ``targets``.
  """
  network: nn.Module
  config: Any
  lora_targets: tuple[str, ...]

  def __call__(self, variables: Params, tokens, train: bool = False):
    if not jnp.issubdtype(jnp.result_type(tokens), jnp.integer) or (
        jnp.ndim(tokens) != 2):
      raise TypeError(f"tokens must be integer token ids [B, T], got "
                      f"{jnp.result_type(tokens)} {jnp.shape(tokens)}")
    return self.network.apply(variables, tokens, train=train), variables


def _check_dtype(dtype) -> jnp.dtype:
  try:
    name = jnp.dtype(dtype).name
  except TypeError:
    name = None
  if name not in DTYPES:
    raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
  return jnp.dtype(name)


def _network(config, remat: bool):
  family = _gpt2 if isinstance(config, _config.GPT2Config) else _llama
  return family.network(config, remat), family


def load_pretrained(path, dtype=jnp.float32, *, remat: bool = False
                    ) -> tuple[Model, Params]:
  """The checkpoint in the folder ``path`` as ``(model, variables)``.

  Args:
    path: a local folder in Hugging Face's format (str or os.PathLike).
    dtype: the variables' storage, float32 or bfloat16 (``DTYPES``); the
      network computes in float32 either way.
    remat: rematerialise each block in the backward pass (less memory,
      the same values).

  Returns:
    ``(model, variables)``: ``model.apply(variables, tokens [B, T] int32,
    train) -> (logits [B, T, vocab_size], variables)``, ``model.loss`` the
    next-token ``types.sequence_cross_entropy``; ``model.init(key)``
    draws fresh variables of the same tree (random, for shapes and tests);
    ``variables = {"params": ...}`` the checkpoint's.

  Raises:
    ValueError: naming the file and the key or tensor at fault (see the
      module's docstring), or an unsupported architecture naming
      ``architectures`` and the supported ones.
    TypeError: ``path`` or ``remat`` of the wrong type.
  """
  folder = _files.check_folder(path)
  model = _model(_config.read_config(folder), dtype, remat)
  network, family = _network(model.apply.config, remat)
  # config.json fixes every tensor's shape: an abstract init gives them
  # before any weight is read, and allocates nothing.
  shapes = jax.eval_shape(model.init, jax.random.key(0))["params"]
  chosen = {}

  # load_tensors calls this once with the names it found, so the file
  # settles what depends on naming (GPT-2's optional "transformer." prefix).
  def expect(names):
    chosen.update(family.expected_tensors(shapes, names))
    return {name: shape for name, (_, shape, _) in chosen.items()}

  arrays = _files.load_tensors(folder, expect, family.IGNORED)
  params = _common.to_params(arrays, chosen, _check_dtype(dtype))
  return model, {"params": params}


def _model(config, dtype, remat: bool) -> Model:
  """The ``Model`` of a checked configuration (its init draws fresh
  variables in ``dtype``)."""
  dtype = _check_dtype(dtype)
  if not isinstance(remat, bool):
    raise TypeError(f"remat must be a bool, got {remat!r}")
  network, _ = _network(config, remat)
  # One token creates every parameter: no parameter's shape depends on T.
  example = jnp.zeros((1, 1), jnp.int32)
  apply = PretrainedApply(network, config,
                          LORA_TARGETS[config.architecture])

  def init(key):
    fresh = network.init(key, example)
    return {"params": jax.tree.map(lambda x: x.astype(dtype),
                                   fresh["params"])}

  return Model(init, apply, sequence_cross_entropy)


def init_pretrained(config: dict, key, dtype=jnp.float32, *,
                    remat: bool = False) -> tuple[Model, Params]:
  """A fresh network of a Hugging Face ``config`` (config.json's values)
  with random variables drawn with ``key``: to pre-train a checkpoint
  here (then ``save_pretrained``), or for tests.

  Raises:
    ValueError: naming the key of ``config`` at fault, as
      ``load_pretrained`` does for a config.json.
  """
  model = _model(_config.parse_config(config, "config"), dtype, remat)
  return model, model.init(key)


def save_pretrained(folder, model: Model, variables: Params) -> str:
  """Writes ``model`` (from ``load_pretrained`` or ``init_pretrained``)
  and its ``variables`` as a Hugging Face checkpoint folder: config.json
  (the keys ``load_pretrained`` reads) and model.safetensors (float32,
  Hugging Face's tensor names and layout), which ``load_pretrained`` and
  transformers' ``from_pretrained`` read back.

  Adapters are merged first (``models.lora.merge``) to export a
  fine-tuned model as a plain checkpoint.

  Args:
    folder: where to write (created if missing). The files are written
      atomically and recorded in the folder's manifest; a file of those
      names that the library did not write is refused, never replaced.
    model: a model of this package.
    variables: its ``{"params": ...}``.

  Returns:
    ``folder``.

  Raises:
    TypeError: a model not of this package.
    ValueError: non-finite params (nothing written), a file in the way.
  """
  if not isinstance(getattr(model, "apply", None), PretrainedApply):
    raise TypeError("model must come from load_pretrained or "
                    "init_pretrained (a lora model: merge it first with "
                    f"models.lora.merge), got {type(model).__name__}")
  config = model.apply.config
  _, family = _network(config, False)
  params = variables["params"]
  shapes = jax.eval_shape(lambda p: p, params)
  # Naming the prefixed embedding keeps GPT-2's "transformer." prefix, as
  # GPT2LMHeadModel saves its tensors.
  expected = family.expected_tensors(shapes, {"transformer.wte.weight"})
  tensors = _save.tensors_of(params, expected)
  return _save.write(folder, _save.config_values(config), tensors)
