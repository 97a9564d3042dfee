"""``load_pretrained`` refuses what it cannot load faithfully, naming the
file and the key or tensor: spoilt copies of the fixture checkpoints."""

import json
import struct

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from fedjax_agg.models import pretrained
from fedjax_agg.models.pretrained import _config
from tests.models import _pretrained_util as util


def _edit_config(folder, **changes):
  path = folder / "config.json"
  config = json.loads(path.read_text())
  config.update(changes)
  path.write_text(json.dumps(config))


def _rewrite_weights(folder, edit, name="model.safetensors"):
  path = folder / name
  tensors = safetensors.numpy.load_file(str(path))
  edit(tensors)
  safetensors.numpy.save_file(tensors, str(path))


def test_a_path_that_is_not_a_folder(tmp_path):
  with pytest.raises(ValueError, match="not a folder"):
    pretrained.load_pretrained(util.folder("gpt2") / "config.json")
  with pytest.raises(ValueError, match="not a folder"):
    pretrained.load_pretrained(tmp_path / "missing")
  with pytest.raises(TypeError, match="path"):
    pretrained.load_pretrained(3)
  with pytest.raises(ValueError, match="config.json is missing"):
    pretrained.load_pretrained(tmp_path)


def test_unknown_architecture_lists_the_supported_ones(tmp_path):
  folder = util.copy("gpt2", tmp_path)
  _edit_config(folder, architectures=["BertForMaskedLM"])
  with pytest.raises(ValueError) as error:
    pretrained.load_pretrained(folder)
  message = str(error.value)
  assert "architectures" in message and "BertForMaskedLM" in message
  assert all(name in message for name in pretrained.ARCHITECTURES)


@pytest.mark.parametrize("text,match", [
    ("{not json", "not valid JSON"),
    ('{"architectures": ["GPT2LMHeadModel"], "n_embd": NaN}', "not valid"),
    ("[1, 2]", "JSON object"),
    ('{"a": 1, "a": 2}', "given twice"),
])
def test_config_that_is_not_a_json_object(tmp_path, text, match):
  folder = util.copy("gpt2", tmp_path)
  (folder / "config.json").write_text(text)
  with pytest.raises(ValueError, match=match) as error:
    pretrained.load_pretrained(folder)
  assert "config.json" in str(error.value)


@pytest.mark.parametrize("name,key,value,match", [
    ("gpt2", "n_embd", "16", "must be an integer"),
    ("gpt2", "n_layer", True, "must be an integer"),
    ("gpt2", "vocab_size", 10 ** 12, "must be in"),
    ("gpt2", "n_head", 3, "not a multiple"),
    ("gpt2", "layer_norm_epsilon", -1.0, "finite number"),
    ("gpt2", "activation_function", "swish", "must be one of"),
    ("llama_gqa", "num_key_value_heads", 3, "not a multiple"),
    ("llama_gqa", "hidden_size", 1 << 40, "must be in"),
    ("llama_gqa", "rms_norm_eps", 0.0, "finite number in"),
    ("llama_gqa", "rms_norm_eps", 1e400, "Infinity is not a JSON number"),
    ("llama_gqa", "tie_word_embeddings", "yes", "true or false"),
    ("llama_gqa", "hidden_act", "gelu", "must be one of"),
    ("llama_gqa", "rope_parameters", {"rope_type": "yarn", "factor": 4.0},
     "'yarn' is not supported"),
    ("llama_tied", "rope_scaling", {"type": "dynamic", "factor": 2.0},
     "'dynamic' is not supported"),
    ("llama_tied", "rope_scaling", {"rope_type": "linear"}, "factor"),
])
def test_config_values_of_the_wrong_type_or_size(tmp_path, name, key, value,
                                                 match):
  folder = util.copy(name, tmp_path)
  _edit_config(folder, **{key: value})
  with pytest.raises(ValueError, match=match) as error:
    pretrained.load_pretrained(folder)
  assert "config.json" in str(error.value)


def test_an_integer_past_floats_range_is_refused_naming_the_key(tmp_path):
  # JSON allows any number of digits; float() of it overflows.
  folder = util.copy("llama_gqa", tmp_path)
  _edit_config(folder, rms_norm_eps=10 ** 400)
  with pytest.raises(ValueError, match="config.json: rms_norm_eps: must be "
                     "a finite number in"):
    pretrained.load_pretrained(folder)


def _without(folder, key):
  path = folder / "config.json"
  config = json.loads(path.read_text())
  del config[key]
  path.write_text(json.dumps(config))


@pytest.mark.parametrize("key", ["head_dim", "num_key_value_heads"])
def test_a_null_optional_size_loads_as_if_omitted(tmp_path, key):
  # Hugging Face writes null for a size left at its default; the tied
  # fixture's head_dim and num_key_value_heads (4 and 4) are the defaults
  # (hidden_size / heads, heads), so both spellings are that checkpoint.
  nulled = util.copy("llama_tied", tmp_path / "null")
  _edit_config(nulled, **{key: None})
  omitted = util.copy("llama_tied", tmp_path / "omitted")
  _without(omitted, key)
  tokens, want = util.golden("llama_tied")
  logits = []
  for folder in (nulled, omitted):
    model, variables = pretrained.load_pretrained(folder)
    logits.append(np.asarray(model.apply(variables, tokens)[0]))
  np.testing.assert_array_equal(logits[0], logits[1])
  np.testing.assert_allclose(logits[0], want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name,key", [
    ("llama_tied", "head_dim"), ("llama_tied", "num_key_value_heads"),
    ("llama_tied", "rope_theta"), ("llama_tied", "rms_norm_eps"),
    ("llama_tied", "max_position_embeddings"), ("llama_tied", "hidden_act"),
    ("llama_tied", "tie_word_embeddings"), ("gpt2", "activation_function"),
    ("gpt2", "layer_norm_epsilon"), ("gpt2", "scale_attn_weights"),
])
def test_null_reads_as_absent_wherever_a_key_has_a_default(name, key):
  values = json.loads((util.folder(name) / "config.json").read_text())
  omitted = {k: v for k, v in values.items() if k != key}
  assert _config.parse_config({**values, key: None}) == (
      _config.parse_config(omitted))


def test_a_null_top_level_rope_theta_under_rope_parameters():
  # rope_parameters without its own rope_theta falls back to the top-level
  # key, and to the default where that is null.
  values = json.loads((util.folder("llama_gqa") / "config.json").read_text())
  parameters = {k: v for k, v in values["rope_parameters"].items()
                if k != "rope_theta"}
  nulled = _config.parse_config({**values, "rope_parameters": parameters,
                                 "rope_theta": None})
  omitted = _config.parse_config({**values, "rope_parameters": parameters})
  assert nulled == omitted and nulled.rope_theta == 10000.0


@pytest.mark.parametrize("name,key", [
    ("llama_gqa", "hidden_size"), ("llama_gqa", "vocab_size"),
    ("llama_gqa", "num_attention_heads"), ("llama_gqa", "intermediate_size"),
    ("gpt2", "n_embd"), ("gpt2", "n_positions"),
])
def test_null_for_a_required_key_is_refused_naming_it(tmp_path, name, key):
  folder = util.copy(name, tmp_path)
  _edit_config(folder, **{key: None})
  with pytest.raises(ValueError, match=f"config.json: {key}: null "
                     r"\(an integer is needed\)"):
    pretrained.load_pretrained(folder)


def test_null_for_a_required_rope_scaling_key_is_refused(tmp_path):
  # factor has no default: null is refused as its absence is.
  folder = util.copy("llama_tied", tmp_path)
  _edit_config(folder, rope_scaling={"rope_type": "linear", "factor": None})
  with pytest.raises(ValueError, match=r"config.json \(rope_scaling\): "
                     "factor: null"):
    pretrained.load_pretrained(folder)


def test_a_tensor_whose_shape_disagrees_with_the_config(tmp_path):
  folder = util.copy("llama_gqa", tmp_path)
  _edit_config(folder, intermediate_size=32)
  with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.down_proj"
                     r"\.weight' has shape \[16, 24\], config.json implies "
                     r"\[16, 32\]") as error:
    pretrained.load_pretrained(folder)
  assert "model.safetensors" in str(error.value)


def test_a_missing_and_an_unexpected_tensor(tmp_path):
  folder = util.copy("llama_gqa", tmp_path)
  _rewrite_weights(folder, lambda t: t.pop("model.norm.weight"))
  with pytest.raises(ValueError, match="'model.norm.weight' is missing"):
    pretrained.load_pretrained(folder)
  folder = util.copy("gpt2", tmp_path / "other")
  _rewrite_weights(folder, lambda t: t.update(
      {"transformer.extra.weight": np.zeros(3, np.float32)}))
  with pytest.raises(ValueError, match="unexpected.*transformer.extra"):
    pretrained.load_pretrained(folder)


def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path):
  folder = util.copy("gpt2", tmp_path)

  def spoil(tensors):
    tensors["transformer.h.1.mlp.c_fc.weight"][3, 4] = np.nan
  _rewrite_weights(folder, spoil)
  with pytest.raises(ValueError, match=r"'transformer\.h\.1\.mlp\.c_fc\."
                     "weight' holds non-finite"):
    pretrained.load_pretrained(folder)


def test_integer_tensors_are_refused(tmp_path):
  folder = util.copy("gpt2", tmp_path)
  _rewrite_weights(folder, lambda t: t.update(
      {"transformer.ln_f.bias": np.zeros(16, np.int32)}))
  with pytest.raises(ValueError, match="ln_f.bias' is stored as I32"):
    pretrained.load_pretrained(folder)


def _header(path):
  data = path.read_bytes()
  (length,) = struct.unpack("<Q", data[:8])
  return json.loads(data[8:8 + length]), data[8 + length:]


def _write(path, header, body):
  raw = json.dumps(header).encode()
  path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


@pytest.mark.parametrize("spoil,match", [
    (lambda path: path.write_text("this is not safetensors"), "claims"),
    (lambda path: path.write_bytes(b"\x01\x02"), "shorter than"),
    (lambda path: path.write_bytes(path.read_bytes()[:-100]),
     "do not hold"),
    (lambda path: path.write_bytes(struct.pack("<Q", 1 << 60)
                                   + path.read_bytes()[8:]), "claims"),
    (lambda path: path.write_bytes(struct.pack("<Q", 50) + b"{" * 60),
     "not JSON"),
])
def test_files_that_are_not_safetensors(tmp_path, spoil, match):
  folder = util.copy("gpt2", tmp_path)
  path = folder / "model.safetensors"
  spoil(path)
  with pytest.raises(ValueError, match=match) as error:
    pretrained.load_pretrained(folder)
  assert "model.safetensors" in str(error.value)
  assert "not a valid safetensors file" in str(error.value)


def test_a_header_claiming_huge_tensors(tmp_path):
  folder = util.copy("gpt2", tmp_path)
  path = folder / "model.safetensors"
  header, body = _header(path)
  entry = header["transformer.wte.weight"]
  entry["shape"] = [1 << 30, 1 << 30]
  entry["data_offsets"] = [entry["data_offsets"][0], 1 << 62]
  _write(path, header, body)
  with pytest.raises(ValueError, match="'transformer.wte.weight': bytes"):
    pretrained.load_pretrained(folder)


def test_a_missing_shard(tmp_path):
  folder = util.copy("llama_sharded", tmp_path)
  (folder / "model-00002-of-00002.safetensors").unlink()
  with pytest.raises(ValueError, match="shard model-00002-of-00002."
                     "safetensors .* is missing") as error:
    pretrained.load_pretrained(folder)
  assert "model.safetensors.index.json" in str(error.value)


@pytest.mark.parametrize("shard", [
    "../model-00001-of-00002.safetensors", "sub/model.safetensors",
    "..\\model.safetensors", "/etc/model.safetensors", ".hidden.safetensors",
    "model.safetensors\x00.txt", 7])
def test_an_index_pointing_outside_the_folder(tmp_path, shard):
  folder = util.copy("llama_sharded", tmp_path / "inner")
  # The file it names exists outside the folder: only the name refuses it.
  (tmp_path / "inner" / "model-00001-of-00002.safetensors").write_bytes(
      (folder / "model-00001-of-00002.safetensors").read_bytes())
  path = folder / "model.safetensors.index.json"
  index = json.loads(path.read_text())
  first = next(iter(index["weight_map"]))
  index["weight_map"][first] = shard
  path.write_text(json.dumps(index))
  with pytest.raises(ValueError, match="not a plain .safetensors file name"):
    pretrained.load_pretrained(folder)


def test_an_index_placing_a_tensor_in_the_wrong_shard(tmp_path):
  folder = util.copy("llama_sharded", tmp_path)
  path = folder / "model.safetensors.index.json"
  index = json.loads(path.read_text())
  names = sorted(index["weight_map"], key=index["weight_map"].get)
  index["weight_map"][names[0]] = index["weight_map"][names[-1]]
  path.write_text(json.dumps(index))
  with pytest.raises(ValueError, match=f"places '{names[0]}' in"):
    pretrained.load_pretrained(folder)


def test_no_weights_at_all(tmp_path):
  folder = util.copy("gpt2", tmp_path)
  (folder / "model.safetensors").unlink()
  (folder / "pytorch_model.bin").write_bytes(b"pickle")
  with pytest.raises(ValueError, match="pytorch_model.bin is not read"):
    pretrained.load_pretrained(folder)


def test_bad_options_and_sequences_beyond_the_checkpoint():
  with pytest.raises(ValueError, match="dtype"):
    pretrained.load_pretrained(util.folder("gpt2"), dtype=jnp.float16)
  with pytest.raises(TypeError, match="remat"):
    pretrained.load_pretrained(util.folder("gpt2"), remat=1)
  model, variables = pretrained.load_pretrained(util.folder("gpt2"))
  with pytest.raises(ValueError, match="n_positions 16"):
    model.apply(variables, np.zeros((1, 17), np.int32))
  with pytest.raises(TypeError, match="integer token ids"):
    model.apply(variables, np.zeros((1, 4), np.float32))
  model, variables = pretrained.load_pretrained(util.folder("mistral"))
  with pytest.raises(ValueError, match="sliding_window"):
    model.apply(variables, np.zeros((1, 33), np.int32))


def test_base_hashes_are_read_once_and_again_when_a_file_changes(
    tmp_path, monkeypatch):
  # A run asks for the base's hashes once per algorithm and seed; the bytes
  # are read once while the files stay as they were, and read again as soon
  # as one is rewritten (a resume on other weights must see them).
  import hashlib  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from fedjax_agg.models.pretrained import _folder  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "gpt2"
  shutil.copytree(util.FIXTURES / "gpt2", folder)
  old = 1_600_000_000
  for name in ("config.json", "model.safetensors"):
    os.utime(folder / name, (old, old))
  reads = []
  real = hashlib.file_digest
  monkeypatch.setattr(hashlib, "file_digest",
                      lambda f, name: reads.append(f.name) or real(f, name))
  first = pretrained.checkpoint_files(folder)
  assert pretrained.checkpoint_files(folder) == first and len(reads) == 2
  weights = (folder / "model.safetensors").read_bytes()
  for name in ("config.json", "model.safetensors"):
    assert first[name] == hashlib.sha256(
        (folder / name).read_bytes()).hexdigest()
  # Same size, other bytes, written now: read again, not kept.
  (folder / "model.safetensors").write_bytes(
      weights[:-1] + bytes([weights[-1] ^ 1]))
  second = pretrained.checkpoint_files(folder)
  assert second["model.safetensors"] != first["model.safetensors"]
  assert pretrained.checkpoint_files(folder) == second
  assert len(reads) == 4 and len(_folder._DIGESTS) >= 2
