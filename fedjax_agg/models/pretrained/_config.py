"""config.json of a Hugging Face checkpoint, read and checked.

Every key the networks use is read with its type and range checked; an
error names the file and the key. Sizes are bounded (``_MAX_SIZE``) so that
a hostile file cannot ask for an enormous model before any weight is read.
"""

import dataclasses
import math
import os
from typing import Any, Optional

from fedjax_agg.models.pretrained._files import read_json

GPT2 = "GPT2LMHeadModel"
LLAMA = "LlamaForCausalLM"
MISTRAL = "MistralForCausalLM"
QWEN2 = "Qwen2ForCausalLM"
ARCHITECTURES = (GPT2, LLAMA, MISTRAL, QWEN2)
"""The ``architectures`` entries of config.json that load."""

ROPE_TYPES = ("default", "linear", "llama3")
"""The ``rope_scaling`` types understood (others are refused by name)."""

GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu", "relu")
LLAMA_ACTIVATIONS = ("silu",)

_MAX_SIZE = 1 << 20  # widths, vocabularies, intermediate sizes
_MAX_LAYERS = 1024
_MAX_POSITIONS = 1 << 24


@dataclasses.dataclass(frozen=True)
class GPT2Config:
  """GPT-2's sizes and options (Hugging Face's key names)."""
  vocab_size: int
  n_positions: int
  n_embd: int
  n_layer: int
  n_head: int
  n_inner: int
  activation_function: str
  layer_norm_epsilon: float
  scale_attn_weights: bool
  scale_attn_by_inverse_layer_idx: bool
  tie_word_embeddings: bool
  architecture: str = GPT2


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
  """The Llama family's sizes and options (Llama, Mistral, Qwen2).

  ``rope_scaling`` is a tuple of sorted (key, value) pairs (hashable), or
  None for plain RoPE.
  """
  architecture: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_hidden_layers: int
  num_attention_heads: int
  num_key_value_heads: int
  head_dim: int
  max_position_embeddings: int
  rms_norm_eps: float
  rope_theta: float
  rope_scaling: Optional[tuple]
  tie_word_embeddings: bool
  qkv_bias: bool
  o_bias: bool
  mlp_bias: bool
  sliding_window: Optional[int]


class _Reader:
  """Typed reads of one config.json's keys, errors naming file and key."""

  def __init__(self, path: str, values: dict):
    self.path = path
    self.values = values

  def fail(self, key: str, message: str):
    raise ValueError(f"{self.path}: {key}: {message}")

  def get(self, key: str, default: Any) -> Any:
    """The key's value, ``default`` where it is absent or null.

    Hugging Face writes null for an option left at its default (head_dim,
    num_key_value_heads...), so null reads as absent; a key without a
    default (None) stays required either way.
    """
    value = self.values.get(key)
    return default if value is None else value

  def required(self, key: str, what: str):
    # "null" where the key is written as null: the file has the key, so
    # "missing" alone would send the reader looking for the wrong fault.
    state = "null" if key in self.values else "missing"
    self.fail(key, f"{state} ({what} is needed)")

  def int(self, key: str, default: Any = None, low: int = 1,
          high: int = _MAX_SIZE) -> int:
    value = self.get(key, default)
    if value is None:
      self.required(key, "an integer")
    # bool is an int subclass: true must not read as 1.
    if isinstance(value, bool) or not isinstance(value, int):
      self.fail(key, f"must be an integer, got {value!r}")
    if not low <= value <= high:
      self.fail(key, f"must be in [{low}, {high}], got {value}")
    return value

  def optional_int(self, key: str, high: int = _MAX_POSITIONS
                   ) -> Optional[int]:
    if self.values.get(key) is None:
      return None
    return self.int(key, high=high)

  def float(self, key: str, default: Any = None, low: float = 0.0,
            high: float = 1e30) -> float:
    value = self.get(key, default)
    if value is None:
      self.required(key, "a number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      self.fail(key, f"must be a number, got {value!r}")
    try:
      number = float(value)
    except OverflowError:
      # An integer past float's range (JSON allows any digits): refused
      # below as out of range, not raised as OverflowError.
      number = math.inf
    # low is exclusive: epsilons, theta and scaling factors must be positive.
    if not math.isfinite(number) or not low < number <= high:
      self.fail(key, f"must be a finite number in ({low}, {high}], got "
                f"{value!r}")
    return number

  def bool(self, key: str, default: bool) -> bool:
    value = self.get(key, default)
    if not isinstance(value, bool):
      self.fail(key, f"must be true or false, got {value!r}")
    return value

  def choice(self, key: str, default: str, choices) -> str:
    value = self.get(key, default)
    if not isinstance(value, str) or value not in choices:
      self.fail(key, f"must be one of {tuple(choices)}, got {value!r}")
    return value


def read_config(folder: str):
  """The checked configuration of the checkpoint in ``folder``:
  ``GPT2Config`` or ``LlamaConfig``."""
  path = os.path.join(folder, "config.json")
  return parse_config(read_json(path, "config.json"), path)


def parse_config(values: dict, path: str = "config.json"):
  """The checked configuration of config.json's ``values`` (read from
  ``path``, named in errors)."""
  if not isinstance(values, dict):
    raise ValueError(f"{path}: must be a JSON object, got "
                     f"{type(values).__name__}")
  reader = _Reader(path, values)
  architectures = values.get("architectures")
  if not (isinstance(architectures, list) and len(architectures) == 1
          and isinstance(architectures[0], str)):
    reader.fail("architectures", f"must be a list of one name, got "
                f"{architectures!r}; supported: {list(ARCHITECTURES)}")
  architecture = architectures[0]
  if architecture not in ARCHITECTURES:
    reader.fail("architectures", f"{architecture!r} is not supported; "
                f"supported: {list(ARCHITECTURES)}")
  if architecture == GPT2:
    return _gpt2(reader)
  return _llama(reader, architecture)


def _gpt2(reader: _Reader) -> GPT2Config:
  width = reader.int("n_embd")
  heads = reader.int("n_head", high=width)
  if width % heads:
    reader.fail("n_head", f"n_embd ({width}) is not a multiple of n_head "
                f"({heads})")
  # Hugging Face writes n_inner null for its default, 4 x n_embd.
  inner = reader.values.get("n_inner")
  return GPT2Config(
      vocab_size=reader.int("vocab_size"),
      n_positions=reader.int("n_positions", high=_MAX_POSITIONS),
      n_embd=width, n_layer=reader.int("n_layer", high=_MAX_LAYERS),
      n_head=heads,
      n_inner=4 * width if inner is None else reader.int("n_inner"),
      activation_function=reader.choice("activation_function", "gelu_new",
                                        GPT2_ACTIVATIONS),
      layer_norm_epsilon=reader.float("layer_norm_epsilon", 1e-5, high=1.0),
      scale_attn_weights=reader.bool("scale_attn_weights", True),
      scale_attn_by_inverse_layer_idx=reader.bool(
          "scale_attn_by_inverse_layer_idx", False),
      tie_word_embeddings=reader.bool("tie_word_embeddings", True))


def _rope(reader: _Reader) -> tuple[float, Optional[tuple]]:
  """(theta, scaling) from ``rope_theta``/``rope_scaling`` or the newer
  ``rope_parameters`` (one dict holding both)."""
  parameters = reader.values.get("rope_parameters")
  if parameters is not None:
    if not isinstance(parameters, dict):
      reader.fail("rope_parameters", f"must be an object, got "
                  f"{parameters!r}")
    theta = _Reader(reader.path, parameters).float(
        "rope_theta", reader.get("rope_theta", 10000.0))
    scaling = parameters
  else:
    theta = reader.float("rope_theta", 10000.0)
    scaling = reader.values.get("rope_scaling")
  if scaling is None:
    return theta, None
  key = "rope_parameters" if parameters is not None else "rope_scaling"
  if not isinstance(scaling, dict):
    reader.fail(key, f"must be an object or null, got {scaling!r}")
  sub = _Reader(f"{reader.path} ({key})", scaling)
  # Older configs name the type "type", newer ones "rope_type".
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  if kind not in ROPE_TYPES:
    sub.fail("rope_type", f"{kind!r} is not supported; supported: "
             f"{list(ROPE_TYPES)}")
  if kind == "default":
    return theta, None
  fields = {"rope_type": kind, "factor": sub.float("factor", high=1e6)}
  if kind == "llama3":
    fields["low_freq_factor"] = sub.float("low_freq_factor", high=1e6)
    fields["high_freq_factor"] = sub.float("high_freq_factor", high=1e6)
    fields["original_max_position_embeddings"] = sub.int(
        "original_max_position_embeddings", high=_MAX_POSITIONS)
    if fields["high_freq_factor"] <= fields["low_freq_factor"]:
      sub.fail("high_freq_factor", "must exceed low_freq_factor")
  # A sorted tuple, not a dict: the frozen config dataclass stays hashable
  # and compares by value.
  return theta, tuple(sorted(fields.items()))


def _llama(reader: _Reader, architecture: str) -> LlamaConfig:
  hidden = reader.int("hidden_size")
  heads = reader.int("num_attention_heads", high=hidden)
  kv_heads = reader.int("num_key_value_heads", heads, high=heads)
  if heads % kv_heads:
    reader.fail("num_key_value_heads", f"num_attention_heads ({heads}) is "
                f"not a multiple of num_key_value_heads ({kv_heads})")
  # An explicit head_dim may differ from hidden / heads, so divisibility
  # is required only where head_dim is derived.
  if reader.values.get("head_dim") is None and hidden % heads:
    reader.fail("num_attention_heads", f"hidden_size ({hidden}) is not a "
                f"multiple of num_attention_heads ({heads})")
  head_dim = reader.int("head_dim", hidden // heads)
  if head_dim % 2:
    reader.fail("head_dim", f"must be even (RoPE rotates pairs), got "
                f"{head_dim}")
  reader.choice("hidden_act", "silu", LLAMA_ACTIVATIONS)
  if reader.values.get("pretraining_tp", 1) not in (1, None):
    reader.fail("pretraining_tp", "only 1 is supported")
  theta, scaling = _rope(reader)
  window = None
  # Mistral always reads its window (null: none); Qwen2 only when
  # use_sliding_window says so.
  if architecture == MISTRAL or (architecture == QWEN2 and reader.bool(
      "use_sliding_window", False)):
    window = reader.optional_int("sliding_window")
  # Llama's attention_bias covers q, k, v and o; Qwen2 always has q, k,
  # v biases and never o's; Mistral has none.
  attention_bias = architecture == LLAMA and reader.bool("attention_bias",
                                                         False)
  return LlamaConfig(
      architecture=architecture,
      vocab_size=reader.int("vocab_size"),
      hidden_size=hidden,
      intermediate_size=reader.int("intermediate_size"),
      num_hidden_layers=reader.int("num_hidden_layers", high=_MAX_LAYERS),
      num_attention_heads=heads, num_key_value_heads=kv_heads,
      head_dim=head_dim,
      max_position_embeddings=reader.int("max_position_embeddings", 2048,
                                         high=_MAX_POSITIONS),
      rms_norm_eps=reader.float("rms_norm_eps", 1e-6, high=1.0),
      rope_theta=theta, rope_scaling=scaling,
      tie_word_embeddings=reader.bool("tie_word_embeddings", False),
      qkv_bias=architecture == QWEN2 or attention_bias,
      o_bias=attention_bias and architecture != QWEN2,
      mlp_bias=reader.bool("mlp_bias", False) and architecture == LLAMA,
      sliding_window=window)
