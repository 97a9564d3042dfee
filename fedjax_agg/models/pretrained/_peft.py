"""LoRA adapters of a loaded checkpoint written in PEFT's format.

PEFT's adapter folder: ``adapter_config.json`` (``peft_type`` "LORA",
``r``, ``lora_alpha``, ``target_modules``, ``fan_in_fan_out`` ...) and
``adapter_model.safetensors`` with, per adapted module M (Hugging Face's
name), ``base_model.model.M.lora_A.weight`` [r, in] and
``base_model.model.M.lora_B.weight`` [out, r]; the update is
``(lora_alpha / r) B A x``, the library's ``(alpha / r) B A x``. GPT-2's
Conv1D layers store their weight [in, out]: PEFT marks them
``fan_in_fan_out`` (A and B keep the same shapes).
"""

import math
import os
from typing import Optional

import numpy as np
import safetensors.numpy

from fedjax_agg.models import lora
from fedjax_agg.models.pretrained import _common
from fedjax_agg.models.pretrained import _files
from fedjax_agg.models.pretrained import _save
from fedjax_agg.types import Model, Params

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."


def peft_state(base_model: Model, lora_model: Model, adapters: Params
               ) -> tuple[dict, dict[str, np.ndarray]]:
  """(adapter_config.json's fields, PEFT's tensors) of ``adapters``."""
  config = getattr(base_model.apply, "config", None)
  if config is None or not hasattr(base_model.apply, "lora_targets"):
    raise TypeError("base_model must be a model from load_pretrained")
  lora_spec = lora.spec(lora_model)
  nodes = lora.check_adapters(adapters, "save_peft_adapters", "adapters")
  tensors = {}
  for target in lora_spec.targets:
    node = nodes.get(target.path)
    if node is None:
      raise ValueError(f"adapters: no adapter of {target.path!r}")
    if "merged" in node and np.any(np.asarray(node["merged"]) != 0):
      raise ValueError(
          f"adapters: {target.path!r} holds a non-zero FLoRA 'merged' "
          "update, which PEFT's rank-r LoRA format cannot hold; save the "
          "merged weights (models.lora.merge) instead")
    a = (lora_spec.frozen_a[target.path] if lora_spec.frozen_a is not None
         else node["a"])
    name = PREFIX + _common.hf_module(target.path)
    for leaf, value in (("lora_A", a), ("lora_B", node["b"])):
      array = np.asarray(value, np.float32)
      if not np.all(np.isfinite(array)):
        raise ValueError(f"adapters: {target.path!r} {leaf} holds "
                         "non-finite values")
      tensors[f"{name}.{leaf}.weight"] = np.ascontiguousarray(array)
  modules = [_common.hf_module(t.path) for t in lora_spec.targets]
  alpha = lora_spec.scale * lora_spec.rank
  # alpha was stored as scale * rank: an integral value is written as an
  # int, as PEFT's own files hold it.
  fields = {
      "peft_type": "LORA", "task_type": "CAUSAL_LM",
      "r": lora_spec.rank,
      "lora_alpha": int(round(alpha)) if abs(alpha - round(alpha)) < 1e-6
                    else alpha,
      "target_modules": _target_modules(base_model, modules),
      "lora_dropout": lora_spec.dropout,
      "fan_in_fan_out": config.architecture == "GPT2LMHeadModel",
      "bias": "none", "use_rslora": False, "use_dora": False,
      "init_lora_weights": True, "inference_mode": True,
      "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {},
      "layers_to_transform": None, "layers_pattern": None,
      "revision": None}
  return fields, tensors


def _target_modules(base_model: Model, modules: list[str]):
  """PEFT's ``target_modules``: the modules' last names where every layer
  of those names is adapted (as PEFT lists them usually), else the full
  names (PEFT matches a name in the list exactly)."""
  # Every Dense layer of the base, to tell whether a short name (q_proj)
  # would adapt more layers than these adapters cover.
  every = [_common.hf_module(path)
           for path in lora.select_targets(base_model, [".*"])]
  leaves = sorted({module.rsplit(".", 1)[-1] for module in modules})
  covered = [m for m in every if m.rsplit(".", 1)[-1] in leaves]
  return leaves if sorted(covered) == sorted(modules) else sorted(modules)


def save_peft_adapters(folder, base_model: Model, lora_model: Model,
                       adapters: Params, *,
                       base_model_name_or_path: Optional[str] = None
                       ) -> str:
  """Writes ``adapters`` as a PEFT LoRA adapter folder.

  ``PeftModel.from_pretrained(hf_model, folder)`` over the checkpoint
  that ``load_pretrained`` read gives the logits of
  ``lora_model.apply(adapters, tokens)``.

  Args:
    folder: where to write ``adapter_config.json`` and
      ``adapter_model.safetensors`` (created if missing). The files are
      written atomically and recorded in the folder's manifest; a file of
      those names that the library did not write (or that changed since)
      is refused, never replaced.
    base_model: the model ``load_pretrained`` returned.
    lora_model: ``models.lora.lora(base_model, variables, ...)``.
    adapters: its adapters (``{"lora": ...}``, one model, not stacked).
      A frozen A (FFA-LoRA) is written from ``lora_model``; FLoRA's
      "merged" leaves must be zero (PEFT's format has no place for them).
    base_model_name_or_path: recorded in adapter_config.json (PEFT's
      field; None by default).

  Returns:
    ``folder``.

  Raises:
    ValueError: a file in the way, adapters of other layers or non-finite,
      a non-zero FLoRA "merged" leaf.
    TypeError: models not from ``load_pretrained`` and ``lora``.
  """
  folder = os.fspath(folder)
  if base_model_name_or_path is not None and not isinstance(
      base_model_name_or_path, str):
    raise TypeError(f"base_model_name_or_path must be a str or None, got "
                    f"{base_model_name_or_path!r}")
  fields, tensors = peft_state(base_model, lora_model, adapters)
  fields["base_model_name_or_path"] = base_model_name_or_path
  return _save.write(folder, fields, tensors, (CONFIG, WEIGHTS))


def read_peft_adapters(folder, lora_model: Model) -> Params:
  """The library's adapters tree from a PEFT adapter folder whose layers
  and rank are ``lora_model``'s (its A is kept in the tree even for
  FFA-LoRA's frozen A: compare, do not train, with such a tree).

  The scale is PEFT's: ``lora_alpha / r``, or ``lora_alpha / sqrt(r)``
  where ``use_rslora`` is true.

  Raises:
    ValueError: naming the file and the key or tensor: a missing,
      misshapen or non-finite tensor; ``r`` not a positive integer,
      ``lora_alpha`` not a finite number, ``peft_type`` other than
      "LORA", DoRA, per-module ranks or alphas (``rank_pattern``,
      ``alpha_pattern``); a rank or scale other than the model's.
  """
  folder = os.fspath(folder)
  config_path = os.path.join(folder, CONFIG)
  fields = _files.read_json(config_path, CONFIG)
  lora_spec = lora.spec(lora_model)
  rank, alpha, scale = _rank_and_scale(config_path, fields)
  if rank != lora_spec.rank or not np.isclose(scale, lora_spec.scale):
    raise ValueError(f"{config_path}: r={rank}, lora_alpha={alpha} "
                     f"(scale {scale:g}) differ from the model's rank "
                     f"{lora_spec.rank} and scale {lora_spec.scale}")
  path = os.path.join(folder, WEIGHTS)
  # The header is checked before safetensors reads the file (byte ranges
  # against the file's size).
  _files.read_header(path)
  stored = safetensors.numpy.load_file(path)
  nodes = {}
  for target in lora_spec.targets:
    name = PREFIX + _common.hf_module(target.path)
    node = {}
    for leaf, key, shape in (("a", "lora_A", (lora_spec.rank, target.d_in)),
                             ("b", "lora_B", (target.d_out, lora_spec.rank))):
      tensor = f"{name}.{key}.weight"
      if tensor not in stored or stored[tensor].shape != shape:
        raise ValueError(f"{path}: tensor {tensor!r} is missing or not of "
                         f"shape {list(shape)}")
      node[leaf] = np.asarray(stored[tensor], np.float32)
      # As the base weights at load: a NaN adapter would otherwise show up
      # as NaN losses in every client, far from its cause.
      if not np.all(np.isfinite(node[leaf])):
        raise ValueError(f"{path}: tensor {tensor!r} holds non-finite "
                         "values (NaN or inf)")
    nodes[target.path] = node
  unused = sorted(set(stored) - {
      f"{PREFIX}{_common.hf_module(path)}.{key}.weight"
      for path in nodes for key in ("lora_A", "lora_B")})
  if unused:
    raise ValueError(f"{path}: tensors of layers the model does not adapt: "
                     f"{unused[:4]}")
  return {lora.ADAPTERS: nodes}


def _rank_and_scale(path: str, fields: dict) -> tuple[int, float, float]:
  """(r, lora_alpha, PEFT's scale) of adapter_config.json's ``fields``,
  refused where they are not a plain LoRA's."""
  def fail(key, message):
    raise ValueError(f"{path}: {key}: {message}")

  # Absent: the tensor names alone say LoRA; any other PEFT method would be
  # read as LoRA with the wrong update.
  peft_type = fields.get("peft_type", "LORA")
  if peft_type != "LORA":
    fail("peft_type", f"must be \"LORA\", got {peft_type!r}")
  # PEFT's defaults (8 and 8) where a key is absent; null is no value PEFT
  # itself could load.
  rank = fields.get("r", 8)
  # bool is an int subclass: true must not read as rank 1.
  if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
    fail("r", f"must be a positive integer, got {rank!r}")
  alpha = fields.get("lora_alpha", 8)
  if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
    fail("lora_alpha", f"must be a finite number, got {alpha!r}")
  try:
    alpha = float(alpha)
  except OverflowError:
    # JSON allows an integer of any length; past float's range it is as
    # unusable as inf.
    alpha = math.inf
  # The parser reads 1e999 as inf; NaN and Infinity it refuses itself.
  if not math.isfinite(alpha):
    fail("lora_alpha", f"must be a finite number, got {fields['lora_alpha']!r}")
  flags = {}
  for key in ("use_rslora", "use_dora"):
    flags[key] = fields.get(key)
    # isinstance, not "in (True, False)": 1 == True would pass the latter.
    if flags[key] is not None and not isinstance(flags[key], bool):
      fail(key, f"must be true or false, got {flags[key]!r}")
  # DoRA rescales each output by a learnt magnitude the library's LoRA
  # does not have.
  if flags["use_dora"]:
    fail("use_dora", "DoRA adapters are not read (plain LoRA only)")
  # Per-module overrides would give some layers another rank or scale
  # than the one checked against the model.
  for key in ("rank_pattern", "alpha_pattern"):
    value = fields.get(key)
    if value is not None and value != {}:
      fail(key, f"per-module overrides are not read (must be empty), got "
           f"{value!r}")
  scale = alpha / (math.sqrt(rank) if flags["use_rslora"] else rank)
  return rank, alpha, scale
