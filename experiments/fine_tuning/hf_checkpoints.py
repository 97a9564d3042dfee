"""Federated fine-tuning of checkpoints in Hugging Face's format: a GPT-2
and a Llama architecture, pre-trained here, then fine-tuned from a config.

  python experiments/fine_tuning/hf_checkpoints.py             # the experiment
  python experiments/fine_tuning/hf_checkpoints.py --tiny --out /tmp/hf

1. **Pre-training** (``--pretrain-seconds`` each): a ``GPT2LMHeadModel`` and
   a ``LlamaForCausalLM`` (``CONFIGS``: width 64, 2 blocks, 4 heads, the
   Llama with 2 key-value heads, over LEAF's 80 characters, 80 positions)
   drawn by ``models.pretrained.init_pretrained`` and trained with Adam on
   the six held-out plays of ``pretrain.py`` (the federation never holds
   them), then written by ``save_pretrained`` as Hugging Face checkpoint
   folders (``<out>/bases/<architecture>/``, with ``record.json``).
2. **Fine-tuning**, through the description's path a user takes with a
   downloaded checkpoint (``"model": {"name": "pretrained", "base":
   FOLDER}``, ``experiment.run_config``): the roles of the other 32 plays,
   one client per role, 10 clients a round, one local epoch of SGD at
   batch 16, scored on the federation's whole test set; ``full`` (FedAvg of
   every weight, learning rate ``--lr-full``), ``fedit`` and ``ffa_lora``
   (rank 8 on the attention and MLP projections, the checkpoint's default
   targets, learning rate ``--lr``), each over ``--seeds``.

Writes ``<out>/summary.json`` (per architecture: the pre-training record,
and per method the final test perplexity and accuracy per seed, their
mean and spread, the trainable parameters and the wall time) beside each
run's folder (``<out>/runs/<architecture>/``: config.json, histories).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

# pylint: disable=wrong-import-position
import jax
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import data as data_lib
from fedjax_agg import experiment
from fedjax_agg import jsonio
from fedjax_agg import models
from fedjax_agg.models import lora
from fedjax_agg.models import pretrained
import pretrain
# pylint: enable=wrong-import-position

CONFIGS = {
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "vocab_size": 80,
             "n_positions": 80, "n_embd": 64, "n_layer": 2, "n_head": 4},
    "llama": {"architectures": ["LlamaForCausalLM"], "vocab_size": 80,
              "hidden_size": 64, "intermediate_size": 176,
              "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 80,
              "rope_theta": 10000.0},
}
"""The two architectures, as config.json's values."""
TINY_WIDTH = {"gpt2": {"n_embd": 16, "n_layer": 1, "n_head": 2},
              "llama": {"hidden_size": 16, "intermediate_size": 24,
                        "num_hidden_layers": 1, "num_attention_heads": 2,
                        "num_key_value_heads": 1}}


def pretrain_base(name: str, config: dict, folder: str, args) -> dict:
  """Pre-trains ``config`` on the held-out plays; writes the checkpoint
  to ``folder``; -> its record."""
  plays = data_lib.shakespeare(plays=pretrain.HELD_OUT_PLAYS)
  model, variables = pretrained.init_pretrained(config, jax.random.key(0))
  test_x, test_y = plays.test_x[:args.test_rows], plays.test_y[:args.test_rows]
  before = pretrain.perplexity(model, variables, test_x, test_y)
  variables, steps, seconds, _ = pretrain.train(
      model, variables, plays.train_x, plays.train_y, steps=args.steps,
      seconds=args.pretrain_seconds, batch_size=32, learning_rate=3e-3,
      seed=0)
  after = pretrain.perplexity(model, variables, test_x, test_y)
  pretrained.save_pretrained(folder, model, variables)
  record = {"architecture": config["architectures"][0], "config": config,
            "num_params": models.count_params(variables),
            "plays": list(pretrain.HELD_OUT_PLAYS), "steps": steps,
            "seconds": round(seconds, 1), "batch_size": 32,
            "learning_rate": 3e-3, "eval_rows": int(test_x.shape[0]),
            "perplexity_before": before, "perplexity_after": after}
  jsonio.dump_json(record, os.path.join(folder, "record.json"))
  print(json.dumps({"base": name, **{k: record[k] for k in (
      "num_params", "steps", "perplexity_before", "perplexity_after")}}),
        flush=True)
  return record


def description(base: str, args) -> dict:
  """The fine-tuning runs of one checkpoint, as a config."""
  federation = data_lib.shakespeare(exclude_plays=pretrain.HELD_OUT_PLAYS)
  clients = federation.num_clients
  adapters = {"rank": args.rank}
  return {
      "name": "hf_checkpoint",
      "dataset": {"name": "shakespeare",
                  "args": {"exclude_plays": list(pretrain.HELD_OUT_PLAYS)}},
      "partition": {"name": "natural", "num_clients": clients},
      "model": {"name": "pretrained", "base": base},
      "train": {"rounds": args.rounds, "participation": 10 / clients,
                "batch_size": 16, "learning_rate": args.lr,
                "eval_every": args.rounds, "eval_clients": False},
      "algorithms": {
          "full": {"aggregator": "fedavg",
                   "train": {"learning_rate": args.lr_full}},
          "fedit": {"aggregator": "fedit", "adapters": adapters},
          "ffa_lora": {"aggregator": "ffa_lora", "adapters": adapters}},
      "seeds": list(args.seeds),
  }


def _trainable(base: str, adapters, aggregator: str) -> int:
  """The parameters a method trains (the rule's own model options: A
  frozen for FFA-LoRA)."""
  model, variables = pretrained.load_pretrained(base)
  if adapters is None:
    return models.count_params(variables)
  adapted = lora.lora(model, variables, rank=adapters["rank"],
                      key=jax.random.key(0),
                      **aggregators.REGISTRY.capabilities(
                          aggregator).model_options)
  return lora.num_trainable(adapted)


def fine_tune(name: str, base: str, args) -> dict:
  """Runs the methods over the seeds; -> per method its results."""
  config = description(base, args)
  out = os.path.join(args.out, "runs", name)
  start = time.perf_counter()
  experiment.run_config(config, out, progress=False, overwrite=True)
  seconds = time.perf_counter() - start
  results = {}
  for method, spec in config["algorithms"].items():
    # One seed writes in the method's folder, several one folder each.
    members = ([f"seed{seed}" for seed in config["seeds"]]
               if len(config["seeds"]) > 1 else [""])
    rows = [jsonio.load_json(os.path.join(out, method, member,
                                          "history.json"))["rows"]
            for member in members]
    final = [r[-1] for r in rows]
    perplexity = [row["test_perplexity"] for row in final]
    accuracy = [row["test_accuracy"] for row in final]
    results[method] = {
        "perplexity_start": rows[0][0]["test_perplexity"],
        "perplexity": perplexity, "accuracy": accuracy,
        "perplexity_mean": float(np.mean(perplexity)),
        "perplexity_sd": float(np.std(perplexity)),
        "accuracy_mean": float(np.mean(accuracy)),
        "trainable": _trainable(base, spec.get("adapters"),
                                spec["aggregator"])}
    print(json.dumps({"base": name, "method": method,
                      **{k: results[method][k] for k in (
                          "perplexity_start", "perplexity_mean",
                          "perplexity_sd", "accuracy_mean")}}), flush=True)
  return {"methods": results, "seconds": round(seconds, 1)}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(HERE, "results",
                                                    "hf_checkpoints"))
  parser.add_argument("--pretrain-seconds", type=float, default=180.0)
  parser.add_argument("--steps", type=int, default=100_000)
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--seeds", type=lambda s: [int(x) for x in
                                                  s.split(",")],
                      default=[0, 1, 2])
  parser.add_argument("--rank", type=int, default=8)
  parser.add_argument("--lr", type=float, default=3.0)
  parser.add_argument("--lr-full", type=float, default=0.05)
  parser.add_argument("--test-rows", type=int, default=1000,
                      help="held-out rows scoring the pre-training")
  parser.add_argument("--architectures", default="gpt2,llama",
                      help="comma-separated names of CONFIGS")
  parser.add_argument("--tiny", action="store_true",
                      help="one-block width-16 networks, 20 steps, at most 2 "
                      "rounds, one seed (the smoke test)")
  args = parser.parse_args(argv)
  names = [name for name in args.architectures.split(",") if name]
  unknown = [name for name in names if name not in CONFIGS]
  if unknown or not names:
    parser.error(f"--architectures: {unknown or names} not in "
                 f"{sorted(CONFIGS)}")
  configs = {name: dict(CONFIGS[name]) for name in names}
  if args.tiny:
    for name in configs:
      configs[name].update(TINY_WIDTH[name])
    args.steps, args.rounds, args.seeds = 20, min(args.rounds, 2), [0]
    args.test_rows, args.rank = 64, 2
  summary = {"arguments": {k: v for k, v in vars(args).items()
                           if k != "out"}}
  for name, config in configs.items():
    folder = os.path.join(args.out, "bases", name)
    summary[name] = {"base": pretrain_base(name, config, folder, args),
                     **fine_tune(name, folder, args)}
  jsonio.dump_json(summary, os.path.join(args.out, "summary.json"))
  return summary


if __name__ == "__main__":
  main()
