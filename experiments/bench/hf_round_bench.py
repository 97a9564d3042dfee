"""One FedIT round on a checkpoint in Hugging Face's format: the engine's
one call against transformers + PEFT, client by client.

  python experiments/bench/hf_round_bench.py --base FOLDER --clients 10 100

The workload of ``finetune_bench.py`` (K clients of 40 rows of 80
characters of the plays the base never saw, one local epoch of batch 16,
3 SGD steps at 3.0, FedIT's mean of A and B, rank-8 adapters with alpha
8), on the checkpoint ``--base`` (e.g. the GPT-2 or Llama architecture
that ``experiments/fine_tuning/hf_checkpoints.py`` pre-trains over the
80 characters): the engine adapts the checkpoint's default targets
(attention and MLP projections); the loop loads the same folder with
transformers' ``AutoModelForCausalLM.from_pretrained`` (its logits checked
against the engine's base to 1e-4 first) and puts PEFT's ``LoraConfig``
on the same modules, the way FlowerTune's clients train, at torch's 1 and
2 threads. One JSON line per variant, as ``finetune_bench.py`` prints.
Needs transformers, torch and PEFT for the loop (none is a dependency; it
is skipped by name where they do not import).
"""

import argparse
import collections
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# pylint: disable=wrong-import-position
import numpy as np

import finetune_bench
from fedjax_agg import distributed
from fedjax_agg.models import pretrained
# pylint: enable=wrong-import-position

# PEFT's module names of the layers the engine adapts by default.
PEFT_TARGETS = {
    "GPT2LMHeadModel": ["c_attn", "c_proj", "c_fc"],
    "LlamaForCausalLM": ["q_proj", "k_proj", "v_proj", "o_proj",
                         "gate_proj", "up_proj", "down_proj"]}
Base = collections.namedtuple("Base", ["model", "variables"])


def loop_round(folder: str, base: Base, x, y, rounds: int, threads):
  """transformers + PEFT, client by client (``finetune_torch``)."""
  import finetune_torch  # pylint: disable=g-import-not-at-top
  import peft  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  default_threads = torch.get_num_threads()
  torch.set_num_threads(threads or default_threads)
  hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
  logits, _ = base.model.apply(base.variables, x[0, :4], False)
  with torch.no_grad():
    theirs = hf(torch.tensor(x[0, :4], dtype=torch.long)).logits.numpy()
  gap = float(np.max(np.abs(theirs - np.asarray(logits))))
  if gap > 1e-4:
    raise AssertionError(f"transformers' model differs from the engine's "
                         f"base by {gap}")
  architecture = base.model.apply.config.architecture
  config = peft.LoraConfig(
      r=finetune_bench.RANK, lora_alpha=finetune_bench.RANK,
      lora_dropout=0.0, target_modules=PEFT_TARGETS[architecture],
      bias="none", fan_in_fan_out=architecture == "GPT2LMHeadModel")
  hf.train()
  result = finetune_torch.timed_rounds(
      peft.get_peft_model(hf, config), x, y, rounds,
      batch=finetune_bench.BATCH,
      learning_rate=finetune_bench.LEARNING_RATE)
  torch.set_num_threads(default_threads)
  return {**result, "threads": threads or default_threads,
          "logit_gap": gap, "transformers": transformers.__version__}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--base", required=True,
                      help="a Hugging Face checkpoint folder over LEAF's 80 "
                      "characters")
  parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--no-loop", action="store_true")
  args = parser.parse_args(argv)
  distributed.use_all_cores()
  model, variables = pretrained.load_pretrained(args.base)
  base = Base(model, variables)
  architecture = model.apply.config.architecture
  for k in args.clients:
    _, x, y, fed = finetune_bench.workload(k)
    test = (np.asarray(fed.test_x)[:64], np.asarray(fed.test_y)[:64])
    print(json.dumps({**finetune_bench.engine_round(
        base, x, y, test, args.rounds, targets=None),
                      "architecture": architecture,
                      **finetune_bench.stamp()}), flush=True)
    if args.no_loop:
      continue
    missing = [name for name in ("torch", "transformers", "peft")
               if importlib.util.find_spec(name) is None]
    if missing:
      print(json.dumps({"variant": "loop", "skipped":
                        f"not installed: {', '.join(missing)}"}))
      continue
    for threads in (1, None):
      print(json.dumps({**loop_round(args.base, base, x, y, args.rounds,
                                     threads),
                        "architecture": architecture,
                        **finetune_bench.stamp()}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
