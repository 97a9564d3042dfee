"""Makes the tiny Hugging Face checkpoints and golden logits of the tests.

NOT run by the tests, and not a dependency of the library: it needs
``torch``, ``transformers``, ``peft`` and ``safetensors`` in an environment
of their own (the fixtures were made with torch 2.13.0, transformers
5.24.0, peft 0.21.2)::

    python tests/models/pretrained_fixtures/make_fixtures.py

It writes, beside itself, one folder per checkpoint (config.json,
model.safetensors or two shards and their index, golden.npz holding the
``tokens`` [2, 12] and transformers' ``logits`` [2, 12, V] of its eager
float32 forward) and two PEFT adapter folders (PEFT's own
``save_pretrained`` output and the logits of the adapted model, with
non-zero adapters). Weights are drawn N(0, 0.2^2) (norm weights 1 +
N(0, 0.1^2)) so that the logits vary on O(1), not transformers' 0.02.

``--verify FOLDER`` loads adapters the library wrote (``save_peft_adapters``
over the tiny checkpoint the folder's ``peft_base.txt`` names) with
``PeftModel.from_pretrained`` and prints the largest logit difference
against the library's adapted logits saved there (``expected.npz``).
"""

import argparse
import json
import os
import shutil

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
LENGTH = 12
VOCAB = 64


def _tokens(seed=0):
  return np.random.default_rng(seed).integers(0, VOCAB, size=(2, LENGTH))


def _randomise(model, seed):
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, param in model.named_parameters():
      noise = torch.randn(param.shape, generator=generator)
      if "norm" in name or "ln_" in name:
        param.copy_(1 + 0.1 * noise if name.endswith("weight")
                    else 0.1 * noise)
      else:
        param.copy_(0.2 * noise)


def _logits(model, tokens):
  with torch.no_grad():
    return model(torch.tensor(tokens)).logits.float().numpy()


def _save(name, config, seed, *, bf16=False, shard=None, legacy_rope=None):
  """One checkpoint folder and its golden logits."""
  folder = os.path.join(HERE, name)
  shutil.rmtree(folder, ignore_errors=True)
  model = transformers.AutoModelForCausalLM.from_config(
      config, attn_implementation="eager")
  _randomise(model, seed)
  model.eval()
  tokens = _tokens(seed)
  if bf16:
    # Golden: transformers' float32 forward of the bfloat16 weights saved
    # (read back as float32; the RoPE buffers are computed afresh).
    model.to(torch.bfloat16).save_pretrained(folder)
    logits = _logits(transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32).eval(),
                     tokens)
  else:
    logits = _logits(model, tokens)
    model.save_pretrained(folder, **({} if shard is None else
                                     {"max_shard_size": shard}))
  np.savez(os.path.join(folder, "golden.npz"), tokens=tokens,
           logits=logits.astype(np.float32))
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    saved = json.load(f)
  if legacy_rope is not None:
    # The format of older transformers (and most checkpoints published):
    # rope_theta and rope_scaling at the top level.
    parameters = saved.pop("rope_parameters")
    saved["rope_theta"] = parameters.pop("rope_theta")
    saved["rope_scaling"] = parameters
  with open(path, "w") as f:
    json.dump(saved, f, indent=1, sort_keys=True)
  os.remove(os.path.join(folder, "generation_config.json")) if os.path.exists(
      os.path.join(folder, "generation_config.json")) else None
  return model, tokens


def _llama_sizes(**kwargs):
  sizes = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=24,
               num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
               rms_norm_eps=1e-5)
  sizes.update(kwargs)
  return sizes


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
          "rope_theta": 100.0}


def checkpoints():
  """Every checkpoint fixture; returns the models PEFT adapts."""
  gpt2 = transformers.GPT2Config(
      vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=2, n_head=2,
      activation_function="gelu_new", layer_norm_epsilon=1e-5,
      bos_token_id=0, eos_token_id=0)
  gpt2_model, _ = _save("gpt2", gpt2, 1)
  llama = transformers.LlamaConfig(**_llama_sizes(rope_parameters=LLAMA3))
  llama_model, _ = _save("llama_gqa", llama, 2)
  _save("llama_tied", transformers.LlamaConfig(**_llama_sizes(
      num_key_value_heads=4, head_dim=4, tie_word_embeddings=True,
      attention_bias=True, mlp_bias=True,
      rope_parameters={"rope_type": "linear", "factor": 2.0,
                       "rope_theta": 500.0})), 3, legacy_rope=True)
  _save("qwen2", transformers.Qwen2Config(**_llama_sizes(
      tie_word_embeddings=True, rope_parameters={
          "rope_type": "default", "rope_theta": 1000.0})), 4)
  _save("mistral", transformers.MistralConfig(**_llama_sizes(
      sliding_window=32, num_key_value_heads=1)), 5)
  _save("llama_sharded", llama, 6, shard="20KB")
  _save("llama_bf16", llama, 7, bf16=True)
  return gpt2_model, llama_model


def peft_fixtures(gpt2_model, llama_model):
  """PEFT's own adapter folders, with non-zero adapters and their logits."""
  import peft  # pylint: disable=g-import-not-at-top
  cases = (("peft_gpt2", "gpt2", gpt2_model, ["c_attn", "c_proj", "c_fc"],
            True),
           ("peft_llama", "llama_gqa", llama_model,
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
             "down_proj"], False))
  for name, base, model, targets, fan_in_fan_out in cases:
    folder = os.path.join(HERE, name)
    shutil.rmtree(folder, ignore_errors=True)
    config = peft.LoraConfig(r=2, lora_alpha=6, target_modules=targets,
                             lora_dropout=0.0, init_lora_weights=False,
                             task_type="CAUSAL_LM",
                             fan_in_fan_out=fan_in_fan_out)
    adapted = peft.get_peft_model(model, config)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
      for param_name, param in adapted.named_parameters():
        if "lora_" in param_name:
          param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    adapted.eval()
    tokens = _tokens(0)
    logits = _logits(adapted, tokens)
    adapted.save_pretrained(folder)
    os.remove(os.path.join(folder, "README.md")) if os.path.exists(
        os.path.join(folder, "README.md")) else None
    with open(os.path.join(folder, "peft_base.txt"), "w") as f:
      f.write(base + "\n")
    np.savez(os.path.join(folder, "golden.npz"), tokens=tokens,
             logits=logits)


def verify(folder):
  """PEFT reads the library's adapters: the largest logit difference."""
  import peft  # pylint: disable=g-import-not-at-top
  with open(os.path.join(folder, "peft_base.txt")) as f:
    base = os.path.join(HERE, f.read().strip())
  model = transformers.AutoModelForCausalLM.from_pretrained(
      base, attn_implementation="eager", dtype=torch.float32)
  adapted = peft.PeftModel.from_pretrained(model, folder)
  adapted.eval()
  expected = np.load(os.path.join(folder, "expected.npz"))
  logits = _logits(adapted, expected["tokens"])
  print(folder, "max |PEFT - library| =",
        float(np.max(np.abs(logits - expected["logits"]))))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--verify", nargs="*", default=None)
  args = parser.parse_args()
  torch.manual_seed(0)
  if args.verify is not None:
    for folder in args.verify:
      verify(folder)
    return
  peft_fixtures(*checkpoints())


if __name__ == "__main__":
  main()
