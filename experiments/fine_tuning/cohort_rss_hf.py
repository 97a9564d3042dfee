"""The largest cohort one call trains on a ~100M-parameter checkpoint of
Llama's architecture, measured by running the call.

  python experiments/fine_tuning/cohort_rss_hf.py --widths 2,4 --confirm 0.8
  python experiments/fine_tuning/cohort_rss_hf.py --tiny --out /tmp/rss

``cohort_rss.py`` measures the library's own 115k-parameter base; this
script measures a ``LlamaForCausalLM`` of about 100M parameters
(``CONFIGS["llama100m"]``: width 768, 12 blocks, 12 query and 4 key-value
heads, SwiGLU width 2048, a 32,000-token vocabulary with tied embeddings;
the shape of the small published Llama-family checkpoints), drawn with
random weights by ``models.pretrained.init_pretrained`` (the memory of a
call does not depend on the weights' values) and adapted by
``models.lora.lora`` at ``--rank`` on its default targets (q/k/v/o and
gate/up/down projections), as FedIT trains it. Each client holds
``--batch-size`` rows of ``--seq-len`` random tokens, one local step.

For each variant (``fedit``: the base as loaded; ``fedit-remat``: each
block rematerialised in the backward pass, ``load_pretrained(...,
remat=True)``; ``fedit-remat-sched``: the same with XLA's CPU scheduler
ordering for memory, ``MEMORY_SCHEDULER``) and each cohort size W, a
fresh process builds the model, compiles the engine's local trainer for
W clients side by side (``cohort_rss.timed_call``) and runs the call; it
reports its resident memory before the call and its peak after
(``ru_maxrss``). The line
through (W, call memory), the budget (``--budget-gib``, default
``MemTotal``) and the memory held before the call give the largest
cohort (``cohort_rss.fit``); ``--confirm F`` runs each variant once more
at F times it. Writes ``<out>/cohort_rss_hf.json`` and prints a table.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

# pylint: disable=wrong-import-position
import jax
import numpy as np

import cohort_rss
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg.models import lora
from fedjax_agg.models import pretrained
# pylint: enable=wrong-import-position

CONFIGS = {
    "llama100m": {"architectures": ["LlamaForCausalLM"], "vocab_size": 32000,
                  "hidden_size": 768, "intermediate_size": 2048,
                  "num_hidden_layers": 12, "num_attention_heads": 12,
                  "num_key_value_heads": 4, "max_position_embeddings": 2048,
                  "tie_word_embeddings": True},
    "tiny": {"architectures": ["LlamaForCausalLM"], "vocab_size": 64,
             "hidden_size": 16, "intermediate_size": 24,
             "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1, "max_position_embeddings": 32},
}
"""The checkpoints measured, as config.json's values."""
MEMORY_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
"""XLA's CPU flag that orders the program for memory instead of
concurrency (without it the recomputations of rematerialised blocks run
early and their activations are held as if they were stored)."""
VARIANTS = {"fedit": (False, ""), "fedit-remat": (True, ""),
            "fedit-remat-sched": (True, MEMORY_SCHEDULER)}
"""Variant -> (whether each block is rematerialised, the XLA flags its
process adds)."""


def cohort_data(vocab_size: int, width: int, batch_size: int,
                seq_len: int) -> federated.FederatedData:
  """``width`` clients of ``batch_size`` rows of random tokens each
  (targets: the next token, the last one padded)."""
  tokens = np.random.default_rng(0).integers(
      0, vocab_size, (width * batch_size, seq_len + 1), dtype=np.int32)
  x, y = tokens[:, :-1], tokens[:, 1:].copy()
  return federated.from_partition(
      x, y, list(np.arange(width * batch_size).reshape(width, batch_size)))


def measure(config_name: str, variant: str, width: int, batch_size: int,
            seq_len: int, rank: int) -> dict:
  """Runs one call of local training (one step) for ``width`` clients
  side by side in this process; -> its record (bytes and seconds)."""
  config = CONFIGS[config_name]
  model, variables = pretrained.init_pretrained(
      config, jax.random.key(0), remat=VARIANTS[variant][0])
  adapted = lora.lora(model, variables, rank=rank, key=jax.random.key(1))
  params = adapted.init(jax.random.key(2))
  data = cohort_data(config["vocab_size"], width, batch_size, seq_len)
  return {"method": variant, "clients": width,
          "base_params": models.count_params(variables),
          "trainable": lora.num_trainable(adapted),
          "xla_flags": os.environ.get("XLA_FLAGS", ""),
          **cohort_rss.timed_call(adapted, params, data, width,
                                  batch_size)}


def run_child(args, variant: str, width: int):
  """``measure`` in a fresh process; -> (return code, record or None)."""
  command = [sys.executable, os.path.abspath(__file__), "--one",
             f"{variant}:{width}", "--config", args.config, "--batch-size",
             str(args.batch_size), "--seq-len", str(args.seq_len),
             "--rank", str(args.rank)]
  flags = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""),
                               VARIANTS[variant][1]) if f)
  return cohort_rss.child_record(command,
                                 env={**os.environ, "XLA_FLAGS": flags})


def _arguments(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="llama100m", choices=CONFIGS)
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  parser.add_argument("--widths", default="2,4")
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--batch-size", type=int, default=8)
  parser.add_argument("--seq-len", type=int, default=256)
  parser.add_argument("--rank", type=int, default=8)
  parser.add_argument("--budget-gib", type=float, default=None,
                      help="memory a cohort may use (default: MemTotal)")
  parser.add_argument("--confirm", type=float, default=0.0,
                      help="run each variant at this fraction of its "
                      "largest cohort (0: not)")
  parser.add_argument("--tiny", action="store_true",
                      help="the tiny config, W = 1 and 2, 8 tokens a row "
                      "(a smoke run)")
  parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.tiny:
    args.config, args.widths, args.seq_len = "tiny", "1,2", 8
    args.batch_size, args.rank = 2, 2
  args.widths = [int(w) for w in args.widths.split(",") if w]
  if len(args.widths) < 2 or min(args.widths) < 1:
    parser.error(f"--widths must name two or more positive cohort sizes, "
                 f"got {args.widths!r}")
  args.variants = [v for v in args.variants.split(",") if v]
  unknown = [v for v in args.variants if v not in VARIANTS]
  if unknown or not args.variants:
    parser.error(f"--variants: {unknown or args.variants} not in "
                 f"{sorted(VARIANTS)}")
  if not 0 <= args.confirm < 1:
    parser.error(f"--confirm must be in [0, 1), got {args.confirm}")
  if args.budget_gib is None:
    args.budget_gib = round(cohort_rss.mem_total_bytes() / 2**30, 2)
  return args


def main(argv=None) -> dict:
  args = _arguments(argv)
  if args.one:  # the child: one variant and width, a JSON line
    variant, width = args.one.split(":")
    print(json.dumps(measure(args.config, variant, int(width),
                             args.batch_size, args.seq_len, args.rank)),
          flush=True)
    return {}
  settings = {k: v for k, v in vars(args).items() if k not in (
      "one", "out")}
  summary = {"settings": {**settings, "model": CONFIGS[args.config]},
             "runs": [], "fits": {}}
  return cohort_rss.measure_each(
      summary, args.variants, args.widths,
      lambda variant, width: run_child(args, variant, width),
      args.budget_gib, args.confirm,
      os.path.join(args.out, "cohort_rss_hf.json"))


if __name__ == "__main__":
  main()
