"""LoRA on loaded checkpoints: PEFT's usual targets by default, the base
unchanged at initialisation, PEFT's adapters read and written (against
PEFT's own folders and logits, ``pretrained_fixtures/peft_*``)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from fedjax_agg import manifest
from fedjax_agg.models import lora
from fedjax_agg.models import pretrained
from tests.models import _pretrained_util as util

GPT2_LAYERS = [f"transformer/h_{i}/{name}" for i in range(2) for name in (
    "attn/c_attn", "attn/c_proj", "mlp/c_fc", "mlp/c_proj")]
LLAMA_LAYERS = [f"model/layers_{i}/{name}" for i in range(2) for name in (
    "mlp/down_proj", "mlp/gate_proj", "mlp/up_proj", "self_attn/k_proj",
    "self_attn/o_proj", "self_attn/q_proj", "self_attn/v_proj")]


def _lora(name, **kwargs):
  model, variables = pretrained.load_pretrained(
      util.folder(name), dtype=kwargs.pop("dtype", "float32"),
      remat=kwargs.pop("remat", False))
  kwargs.setdefault("rank", 2)
  return model, variables, lora.lora(model, variables,
                                     key=jax.random.key(0), **kwargs)


@pytest.mark.parametrize("name,want", [("gpt2", GPT2_LAYERS),
                                       ("llama_gqa", LLAMA_LAYERS),
                                       ("qwen2", LLAMA_LAYERS)])
def test_default_targets_are_the_attention_and_mlp_projections(name, want):
  model, _, adapted = _lora(name)
  assert sorted(lora.select_targets(model, None)) == sorted(want)
  assert sorted(t.path for t in lora.spec(adapted).targets) == sorted(want)
  # Every Dense layer on request: the output layer too where it is one.
  every = lora.select_targets(model, [".*"])
  assert ("lm_head" in every) == (name == "llama_gqa")  # the untied one


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "llama_tied"])
def test_lora_at_initialisation_leaves_the_logits_unchanged(name):
  model, variables, adapted = _lora(name)
  adapters = adapted.init(jax.random.key(3))
  tokens, want = util.golden(name)
  logits, _ = jax.jit(adapted.apply)(adapters, tokens)
  base, _ = model.apply(variables, tokens)
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(base))
  np.testing.assert_allclose(np.asarray(logits), want, rtol=0, atol=1e-4)


def test_lora_with_remat_gives_the_same_logits_and_gradients():
  tokens, _ = util.golden("llama_gqa")
  x, y = tokens[:, :-1], tokens[:, 1:]
  results = []
  for remat in (False, True):
    _, _, adapted = _lora("llama_gqa", remat=remat)
    adapters = _random_adapters(adapted)

    def loss(params, model=adapted):
      logits, _ = model.apply(params, x, True)
      return jnp.mean(model.loss(logits, y))
    results.append(jax.jit(jax.value_and_grad(loss))(adapters))
  (value, grads), (remat_value, remat_grads) = results
  np.testing.assert_allclose(remat_value, value, rtol=1e-6)
  for got, want in zip(jax.tree.leaves(remat_grads), jax.tree.leaves(grads),
                       strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_bfloat16_base_storage_under_lora():
  tokens, want = util.golden("gpt2")
  _, variables, adapted = _lora("gpt2", dtype="bfloat16")
  assert {leaf.dtype for leaf in jax.tree.leaves(
      lora.spec(adapted).base_variables)} == {jnp.dtype(jnp.bfloat16)}
  logits, _ = adapted.apply(adapted.init(jax.random.key(1)), tokens)
  assert 0 < np.max(np.abs(np.asarray(logits) - want)) < 0.1
  del variables


def _random_adapters(adapted, seed=0):
  shapes = jax.eval_shape(adapted.init, jax.random.key(0))
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: jnp.asarray(
      0.3 * rng.standard_normal(s.shape), jnp.float32), shapes)


def _peft_case(name):
  folder = util.FIXTURES / name
  base = (folder / "peft_base.txt").read_text().strip()
  return folder, base


@pytest.mark.parametrize("name", ["peft_gpt2", "peft_llama"])
def test_peft_adapters_give_peft_logits(name):
  # PEFT's own folder (save_pretrained, r=2, lora_alpha=6, non-zero
  # adapters) read into the library gives the PEFT model's logits.
  folder, base = _peft_case(name)
  _, _, adapted = _lora(base, alpha=6.0)
  adapters = pretrained.read_peft_adapters(folder, adapted)
  saved = np.load(folder / "golden.npz")
  logits, _ = adapted.apply(adapters, saved["tokens"].astype(np.int32))
  np.testing.assert_allclose(np.asarray(logits), saved["logits"], rtol=0,
                             atol=1e-4)


@pytest.mark.parametrize("name", ["peft_gpt2", "peft_llama"])
def test_saved_adapters_have_peft_layout(name, tmp_path):
  folder, base = _peft_case(name)
  model, _, adapted = _lora(base, alpha=6.0)
  adapters = pretrained.read_peft_adapters(folder, adapted)
  out = tmp_path / "adapters"
  pretrained.save_peft_adapters(out, model, adapted, adapters)
  theirs = safetensors.numpy.load_file(str(folder /
                                           "adapter_model.safetensors"))
  ours = safetensors.numpy.load_file(str(out / "adapter_model.safetensors"))
  assert sorted(ours) == sorted(theirs)
  for key, value in theirs.items():
    assert ours[key].shape == value.shape and ours[key].dtype == np.float32
    np.testing.assert_array_equal(ours[key], value)
  their_config = json.loads((folder / "adapter_config.json").read_text())
  our_config = json.loads((out / "adapter_config.json").read_text())
  for field in ("peft_type", "task_type", "r", "lora_alpha",
                "fan_in_fan_out", "bias", "use_rslora", "use_dora",
                "lora_dropout", "modules_to_save"):
    assert our_config[field] == their_config[field], field
  assert sorted(our_config["target_modules"]) == sorted(
      their_config["target_modules"])
  # Both files are the library's, recorded in the folder's manifest.
  assert set(manifest.read(str(out))["files"]) == {
      "adapter_config.json", "adapter_model.safetensors"}


def test_a_subset_of_layers_is_named_in_full(tmp_path):
  model, _, adapted = _lora("llama_gqa", targets=[r"model/layers_0/.*"])
  pretrained.save_peft_adapters(tmp_path, model, adapted,
                                _random_adapters(adapted))
  config = json.loads((tmp_path / "adapter_config.json").read_text())
  assert sorted(config["target_modules"]) == sorted(
      "model." + path[len("model/"):].replace("layers_0", "layers.0").replace(
          "/", ".") for path in LLAMA_LAYERS if "layers_0" in path)


def test_saving_refuses_a_users_file_and_replaces_its_own(tmp_path):
  model, _, adapted = _lora("gpt2")
  adapters = _random_adapters(adapted)
  (tmp_path / "adapter_config.json").write_text("{\"mine\": 1}")
  with pytest.raises(ValueError, match="adapter_config.json"):
    pretrained.save_peft_adapters(tmp_path, model, adapted, adapters)
  assert (tmp_path / "adapter_config.json").read_text() == "{\"mine\": 1}"
  assert not (tmp_path / "adapter_model.safetensors").exists()
  out = tmp_path / "out"
  pretrained.save_peft_adapters(out, model, adapted, adapters)
  pretrained.save_peft_adapters(out, model, adapted,
                                _random_adapters(adapted, seed=1))
  written = pretrained.read_peft_adapters(out, adapted)
  for got, want in zip(jax.tree.leaves(written),
                       jax.tree.leaves(_random_adapters(adapted, seed=1)),
                       strict=True):
    np.testing.assert_array_equal(got, want)
  (out / "adapter_model.safetensors").write_bytes(b"changed by hand")
  with pytest.raises(ValueError, match="adapter_model.safetensors"):
    pretrained.save_peft_adapters(out, model, adapted, adapters)


def test_ffa_lora_writes_its_frozen_a_and_flora_merged_is_refused(tmp_path):
  model, _, adapted = _lora("llama_gqa", freeze_a=True)
  adapters = _random_adapters(adapted)
  pretrained.save_peft_adapters(tmp_path / "ffa", model, adapted, adapters)
  stored = safetensors.numpy.load_file(
      str(tmp_path / "ffa" / "adapter_model.safetensors"))
  frozen = lora.spec(adapted).frozen_a["model/layers_1/self_attn/q_proj"]
  np.testing.assert_array_equal(
      stored["base_model.model.model.layers.1.self_attn.q_proj.lora_A."
             "weight"], np.asarray(frozen))
  model, _, adapted = _lora("llama_gqa", merged=True)
  adapters = _random_adapters(adapted)
  with pytest.raises(ValueError, match="FLoRA 'merged'"):
    pretrained.save_peft_adapters(tmp_path / "flora", model, adapted,
                                  adapters)
  zero = jax.tree_util.tree_map_with_path(
      lambda path, leaf: jnp.zeros_like(leaf) if "merged" in str(path)
      else leaf, adapters)
  pretrained.save_peft_adapters(tmp_path / "flora", model, adapted, zero)


def test_saving_refuses_other_models_and_bad_adapters(tmp_path):
  model, _, adapted = _lora("gpt2")
  adapters = _random_adapters(adapted)
  with pytest.raises(TypeError, match="load_pretrained"):
    pretrained.save_peft_adapters(tmp_path, adapted, adapted, adapters)
  with pytest.raises(TypeError, match="lora"):
    pretrained.save_peft_adapters(tmp_path, model, model, adapters)
  spoilt = jax.tree.map(lambda leaf: leaf.at[0, 0].set(jnp.nan), adapters)
  with pytest.raises(ValueError, match="non-finite"):
    pretrained.save_peft_adapters(tmp_path, model, adapted, spoilt)
  assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def saved_adapters(tmp_path_factory):
  """(a folder written by save_peft_adapters, its lora model, adapters):
  rank 2, alpha 6 (scale 3), on the GQA Llama."""
  model, _, adapted = _lora("llama_gqa", alpha=6.0)
  adapters = _random_adapters(adapted)
  folder = tmp_path_factory.mktemp("peft") / "adapters"
  pretrained.save_peft_adapters(folder, model, adapted, adapters)
  return folder, adapted, adapters


def _spoilt(saved_adapters, tmp_path, text=None, **changes):
  """A copy of the saved folder, its adapter_config.json edited."""
  import shutil  # pylint: disable=g-import-not-at-top
  folder = tmp_path / "copy"
  shutil.copytree(saved_adapters[0], folder)
  path = folder / "adapter_config.json"
  config = json.loads(path.read_text())
  config.update(changes)
  path.write_text(text if text is not None else json.dumps(config))
  return folder


@pytest.mark.parametrize("key,value,match", [
    ("r", 0, "positive integer, got 0"),
    ("r", -2, "positive integer, got -2"),
    ("r", True, "positive integer, got True"),
    ("r", 2.0, "positive integer, got 2.0"),
    ("r", "2", "positive integer, got '2'"),
    ("r", None, "positive integer, got None"),
    ("lora_alpha", "6", "finite number, got '6'"),
    ("lora_alpha", False, "finite number, got False"),
    ("lora_alpha", None, "finite number, got None"),
    ("lora_alpha", [6], "finite number, got \\[6\\]"),
    pytest.param("lora_alpha", 10 ** 400, "finite number",
                 id="lora_alpha-past-float"),
    ("peft_type", "LOHA", "must be \"LORA\", got 'LOHA'"),
    ("use_dora", True, "DoRA"),
    ("use_rslora", 1, "true or false, got 1"),
    ("rank_pattern", {"q_proj": 4}, "per-module overrides"),
    ("alpha_pattern", {"q_proj": 16}, "per-module overrides"),
])
def test_peft_config_fields_are_checked_naming_file_and_key(
    saved_adapters, tmp_path, key, value, match):
  folder = _spoilt(saved_adapters, tmp_path, **{key: value})
  with pytest.raises(ValueError,
                     match=f"adapter_config.json: {key}: .*{match}"):
    pretrained.read_peft_adapters(folder, saved_adapters[1])


def test_an_infinite_lora_alpha_written_as_a_number(saved_adapters,
                                                    tmp_path):
  # Python's JSON parser reads 1e999 as inf (NaN and Infinity it refuses).
  text = (saved_adapters[0] / "adapter_config.json").read_text()
  text = text.replace('"lora_alpha": 6', '"lora_alpha": 1e999')
  assert "1e999" in text
  folder = _spoilt(saved_adapters, tmp_path, text=text)
  with pytest.raises(ValueError, match="adapter_config.json: lora_alpha: "
                     "must be a finite number"):
    pretrained.read_peft_adapters(folder, saved_adapters[1])


@pytest.mark.parametrize("changes", [{"r": 4}, {"lora_alpha": 8},
                                     {"use_rslora": True}])
def test_a_rank_or_scale_other_than_the_models_is_refused(
    saved_adapters, tmp_path, changes):
  # use_rslora makes PEFT's scale alpha / sqrt(r): 6 / sqrt(2), not 3.
  folder = _spoilt(saved_adapters, tmp_path, **changes)
  with pytest.raises(ValueError, match="adapter_config.json: r=.* differ "
                     "from the model's rank 2 and scale 3"):
    pretrained.read_peft_adapters(folder, saved_adapters[1])


def test_rslora_reads_with_alpha_over_the_root_of_r(saved_adapters,
                                                     tmp_path):
  # Scale 3 at rank 2 is lora_alpha 3 sqrt(2) under rsLoRA.
  folder = _spoilt(saved_adapters, tmp_path, use_rslora=True,
                   lora_alpha=3 * 2 ** 0.5)
  read = pretrained.read_peft_adapters(folder, saved_adapters[1])
  for got, want in zip(jax.tree.leaves(read),
                       jax.tree.leaves(saved_adapters[2]), strict=True):
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_adapter_tensors_are_refused_naming_them(
    saved_adapters, tmp_path, bad):
  folder = _spoilt(saved_adapters, tmp_path)
  path = folder / "adapter_model.safetensors"
  tensors = safetensors.numpy.load_file(str(path))
  name = ("base_model.model.model.layers.1.self_attn.v_proj.lora_B."
          "weight")
  tensors[name][3, 1] = bad
  safetensors.numpy.save_file(tensors, str(path))
  with pytest.raises(ValueError, match=f"adapter_model.safetensors: tensor "
                     f"'{name}' holds non-finite"):
    pretrained.read_peft_adapters(folder, saved_adapters[1])
