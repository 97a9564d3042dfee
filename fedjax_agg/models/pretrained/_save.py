"""A network of the package written back in Hugging Face's format.

``config_values`` is the config.json of a checked configuration (the keys
the loader reads, with their values, so loading it gives the same
configuration); ``save_tensors`` lays the params out as the loader reads
them (each tensor under its Hugging Face name, torch Linear kernels
transposed, GPT-2's Conv1D kernels as they are, always with GPT-2's
"transformer." prefix), in float32.
"""

import json
import os

import numpy as np
import safetensors.numpy
from flax import traverse_util

from fedjax_agg import jsonio
from fedjax_agg import manifest
from fedjax_agg.models.pretrained import _config

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
_MODEL_TYPES = {_config.GPT2: "gpt2", _config.LLAMA: "llama",
                _config.MISTRAL: "mistral", _config.QWEN2: "qwen2"}
_GPT2_KEYS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head",
              "n_inner", "activation_function", "layer_norm_epsilon",
              "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
              "tie_word_embeddings")
_LLAMA_KEYS = ("vocab_size", "hidden_size", "intermediate_size",
               "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings",
               "rms_norm_eps", "rope_theta", "tie_word_embeddings")


def config_values(config) -> dict:
  """config.json's values for a checked ``GPT2Config`` / ``LlamaConfig``."""
  architecture = config.architecture
  values = {"architectures": [architecture],
            "model_type": _MODEL_TYPES[architecture]}
  if isinstance(config, _config.GPT2Config):
    values.update({key: getattr(config, key) for key in _GPT2_KEYS})
    return values
  values.update({key: getattr(config, key) for key in _LLAMA_KEYS})
  values["hidden_act"] = "silu"
  if config.rope_scaling is not None:
    values["rope_scaling"] = dict(config.rope_scaling)
  if architecture == _config.LLAMA:
    # For Llama qkv_bias and o_bias are both attention_bias (parse_config).
    values["attention_bias"] = config.qkv_bias
    values["mlp_bias"] = config.mlp_bias
  if config.sliding_window is not None:
    values["sliding_window"] = config.sliding_window
    if architecture == _config.QWEN2:
      # Qwen2 reads sliding_window only together with use_sliding_window.
      values["use_sliding_window"] = True
  return values


def tensors_of(params, expected) -> dict[str, np.ndarray]:
  """The file's tensors of ``params`` (``expected``: the family's
  ``expected_tensors``), float32, refused where not finite."""
  flat = traverse_util.flatten_dict(params)
  tensors = {}
  for name, (path, _, transpose) in expected.items():
    array = np.asarray(flat[path], np.float32)
    if not np.all(np.isfinite(array)):
      raise ValueError(f"params {'/'.join(path)} (tensor {name!r}) hold "
                       "non-finite values; nothing was written")
    tensors[name] = np.ascontiguousarray(array.T if transpose else array)
  return tensors


def write(folder, values: dict, tensors: dict, names=(CONFIG, WEIGHTS)
          ) -> str:
  """Writes ``values`` as JSON and ``tensors`` as safetensors into
  ``folder`` (created if missing) under ``names`` (config.json and
  model.safetensors; PEFT's adapter files), atomically, recorded in its
  manifest; a file of those names the library did not write is refused,
  never replaced."""
  folder = os.fspath(folder)
  config, weights = names
  if os.path.lexists(folder) and not os.path.isdir(folder):
    raise ValueError(f"{folder}: exists and is not a folder")
  # Checked before anything is written: a refused file leaves the folder as
  # it was.
  manifest.check_replace(folder, [config, weights])
  with manifest.recording(folder, resume=True):
    # Weights first, config.json last: an interrupted save leaves no
    # config.json, so ``is_checkpoint`` does not take the folder for a
    # checkpoint. Format "pt" is the metadata transformers requires of a
    # safetensors file before it loads one.
    jsonio.write_file(os.path.join(folder, weights), lambda temporary: (
        safetensors.numpy.save_file(tensors, temporary,
                                    metadata={"format": "pt"})))
    jsonio.write_text(os.path.join(folder, config),
                      json.dumps(values, indent=2, sort_keys=True) + "\n")
  return folder
