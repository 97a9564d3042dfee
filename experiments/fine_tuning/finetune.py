"""Federated fine-tuning of the pre-trained base: full model vs LoRA rules.

  python experiments/fine_tuning/finetune.py            # the experiment
  python experiments/fine_tuning/finetune.py --tiny --out /tmp/ft

Adapts the base of ``pretrain.py`` (``base/``) on the roles of the 32
plays it never saw (``data.shakespeare(exclude_plays=HELD_OUT_PLAYS)``)
with, for each partition (``natural``: one client per role; ``iid``: the
same rows pooled and dealt at random to as many clients):

* ``full``: FedAvg of the whole model, initialised at the base;
* ``fedit-r``: LoRA adapters of rank r on every attention projection and
  MLP layer (``lora.TRANSFORMER_TARGETS``), A and B averaged (FedIT);
* ``ffa_lora-r``: A frozen at its random start, B averaged (FFA-LoRA);
* ``flora-r``: the adapters stacked so that the aggregate is the mean of
  the products B A, merged into the frozen part every round (FLoRA).

It also reads, from XLA's compiled program, what one call of local
training for 10, 100 and 1,000 clients side by side holds (``--memory``),
for the full model and for the adapters.

Every run: the same cohorts (seed), one local epoch of SGD (learning
rate ``--lr`` for the adapters, ``--lr-full`` for the whole model, each
the best of a short probe); the test set is a fixed random subset of the
federation's test rows. Writes, under ``--out``, one history folder
per run (``<partition>/<method>/history.csv|json``, the run's config
beside its rows), ``summary.json`` (final perplexity and next-character
accuracy, uplink bytes per client and round, trainable parameters, the
median round time), and ``perplexity_<partition>.png``.
"""

import argparse
import json
import math
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
from fedjax_agg import engine
from fedjax_agg import data as data_lib
from fedjax_agg import federated
from fedjax_agg import history as history_lib
from fedjax_agg import plotting
from fedjax_agg import simulation
from fedjax_agg.config import Evaluation, Execution, LocalTraining
from fedjax_agg.models import lora
import pretrain
# pylint: enable=wrong-import-position

RULES = ("fedit", "ffa_lora", "flora")
"""The LoRA methods compared: registered rules, whose registry lines
declare the adapters each needs (``capabilities(name).model_options``)."""


def federations(fed, seed: int) -> dict:
  """{"natural": the roles as clients, "iid": their rows dealt at random
  to as many clients of the same sizes}."""
  natural = federated.from_partition(fed.train_x, fed.train_y,
                                     list(fed.train_clients))
  sizes = [len(c) for c in fed.train_clients]
  order = np.random.default_rng(seed).permutation(len(fed.train_x))
  iid = np.split(order, np.cumsum(sizes)[:-1])
  return {"natural": natural,
          "iid": federated.from_partition(fed.train_x, fed.train_y, iid)}


def methods(base, ranks, key) -> dict:
  """name -> (model, rule, initial params or None)."""
  out = {"full": (base.model, aggregators.fedavg(), base.variables)}
  for rank in ranks:
    for name in RULES:
      options = aggregators.REGISTRY.capabilities(name).model_options
      model = lora.lora(base.model, base.variables, rank=rank,
                        targets=lora.TRANSFORMER_TARGETS, key=key,
                        **options)
      out[f"{name}-{rank}"] = (model, aggregators.get(name), None)
  return out


def uplink_per_client(name: str, params) -> int:
  """Bytes one client sends up per round: its trainable float32 leaves
  (all of the model for "full"; A and B for the adapters)."""
  if name == "full":
    return 4 * sum(int(np.size(a)) for a in jax.tree.leaves(params))
  return lora.uplink_bytes(params)


def cohort_call(model, params, data, width: int, batch_size: int,
                num_steps=None):
  """One call of local training for ``width`` clients side by side,
  compiled as the rounds run it (FedAvg and the LoRA rules read no client
  losses); -> (compiled call, its arguments). ``num_steps`` [width]: each
  client's local steps (default: one epoch); the steps are a loop, so
  they do not change the program or its memory."""
  train = engine.make_local_trainer(
      model, LocalTraining(epochs=1, batch_size=batch_size,
                           compute_losses=False), clients_per_step=width)
  ids = np.arange(width, dtype=np.int32) % data.num_clients
  if num_steps is None:
    num_steps = engine.full_steps(data, ids, batch_size, 1)
  args = (params, data, ids, np.full((width,), 0.1, np.float32), num_steps,
          jax.random.key(0))
  return jax.jit(train).lower(*args).compile(), args


def cohort_memory(model, params, data, width: int, batch_size: int) -> dict:
  """What one call of local training for ``width`` clients side by side
  holds, from XLA's compiled program (``memory_analysis``): its arguments
  (the params it starts from, the pooled data) and its working memory
  (temporaries, every client's trained params). No client model is
  allocated to measure it."""
  compiled, _ = cohort_call(model, params, data, width, batch_size)
  analysis = compiled.memory_analysis()
  return {"clients": width,
          "argument_bytes": int(analysis.argument_size_in_bytes),
          "output_bytes": int(analysis.output_size_in_bytes),
          "temp_bytes": int(analysis.temp_size_in_bytes)}


def run_one(model, rule, init, data, test, args):
  """One run; -> (history, final params)."""
  result = simulation.run(
      model, data, test, rule, num_rounds=args.rounds,
      participation=args.clients_per_round / data.num_clients, seed=args.seed,
      training=LocalTraining(epochs=1, batch_size=args.batch_size,
                             learning_rate=(args.lr_full if init is not None
                                            else args.lr)),
      execution=Execution(progress=False), init_params=init,
      # The test rows every round; no pass over every client's data.
      evaluation=Evaluation(clients=False))
  return result.history, result.state.params


def load_setting(base_dir: str, plays, seed: int, test_rows: int):
  """The experiment's setting: (the base of ``base_dir``, the federation
  of the plays it never saw (``plays`` among them, None: all), the test
  rows drawn with ``seed`` (sorted indices), the test (x, y))."""
  base = pretrain.load_base(base_dir)
  fed = data_lib.shakespeare(plays=plays,
                             exclude_plays=pretrain.HELD_OUT_PLAYS)
  rows = np.random.default_rng(seed).permutation(len(fed.test_x))
  rows = np.sort(rows[:test_rows])
  return base, fed, rows, (fed.test_x[rows], fed.test_y[rows])


def shown_paths(args) -> dict:
  """``args.base`` and ``args.out`` as a record shows them: relative to
  the repository when inside it."""
  inside = lambda path: os.path.commonpath([os.path.abspath(path),
                                            ROOT]) == ROOT
  return {key: os.path.relpath(os.path.abspath(getattr(args, key)), ROOT)
          if inside(getattr(args, key)) else getattr(args, key)
          for key in ("base", "out")}


def setting_arguments(parser, out: str, test_rows: int) -> None:
  """The options of the setting (base, cohorts, learning rates, test rows,
  seed) this script and ``seeds.py`` share, with their defaults; ``out``
  and ``test_rows`` are each script's own defaults."""
  parser.add_argument("--base", default=os.path.join(HERE, "base"))
  parser.add_argument("--out", default=out)
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--clients-per-round", type=int, default=10)
  parser.add_argument("--batch-size", type=int, default=16)
  parser.add_argument("--lr", type=float, default=3.0,
                      help="client SGD learning rate of the adapters")
  parser.add_argument("--lr-full", type=float, default=0.05,
                      help="client SGD learning rate of full fine-tuning")
  parser.add_argument("--test-rows", type=int, default=test_rows)
  parser.add_argument("--seed", type=int, default=0,
                      help="the test rows' and the adapters' seed")


def write_table(out: str, lines) -> str:
  """The Markdown ``lines`` as one text, written to ``<out>/table.md``."""
  table = "\n".join(lines) + "\n"
  with open(os.path.join(out, "table.md"), "w") as f:
    f.write(table)
  return table


def _mean_of_rounds(history, metric: str, with_max: bool = False) -> str:
  """The mean of ``metric`` over the rounds (and its largest value), as a
  table cell; empty when the history has none."""
  values = history.column(metric)[1:]
  if not len(values) or np.isnan(values).all():
    return ""
  cell = f"{np.nanmean(values):.4f}"
  return f"{cell} ({np.nanmax(values):.4f})" if with_max else cell


def results_table(out: str) -> str:
  """The Markdown table of ``<out>/summary.json`` and the histories beside
  it (FedIT's gap over the product and over the round's update, means
  over the rounds, included), written to ``<out>/table.md``."""
  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  lines = ["| partition | method | trainable | uplink / client / round | "
           "perplexity start -> end | next-char accuracy | FedIT gap / "
           "product (mean) | FedIT gap / update (mean (max)) | "
           "round s (median) |",
           "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
  for run, entry in summary["runs"].items():
    partition, method = run.split("/")
    history = history_lib.History.load(os.path.join(out, partition,
                                                    method))
    lines.append(
        f"| {partition} | {method} | {entry['trainable_params']:,} | "
        f"{entry['uplink_bytes_per_client']:,} B | "
        f"{entry['initial_perplexity']:.3f} -> "
        f"{entry['final_perplexity']:.3f} | {entry['final_accuracy']:.4f} | "
        f"{_mean_of_rounds(history, 'inexact_aggregation')} | "
        f"{_mean_of_rounds(history, 'inexact_aggregation_of_update', True)}"
        f" | {entry['median_round_s']:.2f} |")
  return write_table(out, lines)


RERUN_FREE = ("only", "memory", "table_only")
"""Options a rerun of some methods (``--only``) may change: they choose
what runs, not how."""


def earlier_summary(path: str, settings: dict) -> dict:
  """The summary at ``path``, which a rerun of some methods extends; it
  must have been written with ``settings`` (but for ``RERUN_FREE``), else
  SystemExit naming it."""
  with open(path) as f:
    earlier = json.load(f)
  strip = lambda given: {k: v for k, v in given.items()
                         if k not in RERUN_FREE}
  if strip(earlier["settings"]) != strip(json.loads(json.dumps(settings))):
    raise SystemExit(f"{path} was written with other settings; rerun "
                     "every method (no --only) or choose another --out")
  return earlier


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  setting_arguments(parser, os.path.join(HERE, "results"), test_rows=2000)
  parser.add_argument("--ranks", default="2,8")
  parser.add_argument("--partitions", default="natural,iid")
  parser.add_argument("--memory", default="10,100,1000",
                      help="cohort sizes whose one-call memory is read from "
                      "the compiled program ('' to skip)")
  parser.add_argument("--only", default="",
                      help="comma-separated methods to rerun on every "
                      "partition of --partitions, keeping the other runs "
                      "of --out's summary ('' for all); with --memory '' "
                      "its memory figures are kept too")
  parser.add_argument("--table-only", action="store_true",
                      help="only write <out>/table.md from a finished run")
  parser.add_argument("--tiny", action="store_true",
                      help="two plays, 2 rounds, rank 2 (a smoke run)")
  args = parser.parse_args(argv)
  if args.table_only:
    print(results_table(args.out))
    return {}
  ranks = [int(r) for r in args.ranks.split(",")]
  plays = None
  if args.tiny:
    args.rounds, args.clients_per_round, args.test_rows = 2, 2, 64
    ranks, plays = [2], ["hamlet", "macbeth"]
    args.memory = "2,4"
  base, fed, rows, test = load_setting(args.base, plays, args.seed,
                                       args.test_rows)
  summary = {"settings": {**vars(args), **shown_paths(args), "ranks": ranks,
                          "clients": len(fed.train_clients),
                          "train_rows": int(len(fed.train_x)),
                          "test_rows": int(len(rows)),
                          "base_perplexity": base.record.get(
                              "perplexity_after"),
                          "data": fed.provenance}, "runs": {}}
  all_methods = methods(base, ranks, jax.random.key(args.seed))
  chosen = [m for m in args.only.split(",") if m]
  unknown = sorted(set(chosen) - set(all_methods))
  if unknown:
    raise SystemExit(f"--only: no method {unknown}; the methods are "
                     f"{sorted(all_methods)}")
  path = os.path.join(args.out, "summary.json")
  if chosen and os.path.exists(path):
    # A rerun of some methods keeps the other runs (and, with --memory '',
    # the memory figures) of a summary written with the same settings.
    earlier = earlier_summary(path, summary["settings"])
    summary["runs"] = {run: entry for run, entry in earlier["runs"].items()
                       if run.split("/")[1] not in chosen
                       or run.split("/")[0] not in args.partitions.split(
                           ",")}
    if not args.memory:
      summary["memory"] = earlier.get("memory", {})
  feds = federations(fed, args.seed)
  if not (chosen and not args.memory and "memory" in summary):
    summary["memory"] = {}
    for name in ("full", f"fedit-{max(ranks)}"):
      model, _, init = all_methods[name]
      params = init if init is not None else model.init(jax.random.key(0))
      summary["memory"][name] = [
          cohort_memory(model, params, feds["natural"], int(width),
                        args.batch_size)
          for width in filter(None, args.memory.split(","))]
      print(json.dumps({"memory": name,
                        "by_cohort": summary["memory"][name]}), flush=True)
  for partition, data in feds.items():
    if partition not in args.partitions.split(","):
      continue
    curves = {}
    for name, (model, rule, init) in all_methods.items():
      if chosen and name not in chosen:
        if f"{partition}/{name}" in summary["runs"]:
          curves[name] = history_lib.History.load(os.path.join(
              args.out, partition, name))
        continue
      start = time.perf_counter()
      history, params = run_one(model, rule, init, data, test, args)
      seconds = time.perf_counter() - start
      history_lib.save_run(os.path.join(args.out, partition, name),
                           {"run": history}, overwrite=True)
      uplink = uplink_per_client(name, params)
      losses = history.column("test_loss")
      times = history.column("time_s")[2:]  # after the compiling round
      entry = {"final_perplexity": float(math.exp(losses[-1])),
               "initial_perplexity": float(math.exp(losses[0])),
               "final_accuracy": float(history.column("test_accuracy")[-1]),
               "uplink_bytes_per_client": uplink,
               "trainable_params": uplink // 4,  # float32
               "median_round_s": (float(np.median(times)) if len(times)
                                  else None),
               "total_s": round(seconds, 1)}
      summary["runs"][f"{partition}/{name}"] = entry
      print(json.dumps({"run": f"{partition}/{name}", **entry}), flush=True)
      curves[name] = history
    plotting.plot_history(curves, os.path.join(
        args.out, f"perplexity_{partition}.png"), metrics=("test_loss",
                                                           "test_accuracy"),
        title=f"fine-tuning, {partition} partition")
  # In the partitions' and the methods' order, whichever ran now.
  summary["runs"] = {f"{p}/{m}": summary["runs"][f"{p}/{m}"]
                     for p in feds for m in all_methods
                     if f"{p}/{m}" in summary["runs"]}
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  results_table(args.out)
  return summary


if __name__ == "__main__":
  main()
