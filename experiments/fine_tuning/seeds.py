"""Seeds, HetLoRA and DP-FedAvg on adapters: the rank-r methods on one
partition, each method's seeds run as ONE vmapped sweep.

  python experiments/fine_tuning/seeds.py             # the experiment
  python experiments/fine_tuning/seeds.py --partition iid \
      --out experiments/fine_tuning/results/seeds_iid \
      --only full,fedit-8,ffa_lora-8,flora-8,hetlora-8
  python experiments/fine_tuning/seeds.py --tiny --out /tmp/fts

On the setting of ``finetune.py`` (its base, federation, test rows,
learning rates and cohorts), for the partition ``--partition`` (natural,
the default, or iid), it runs every method below for each seed of
``--seeds``, the seeds of a method stacked and vmapped in one call a
round (``sweep.run_sweep``):

* ``full``, ``fedit-r``, ``ffa_lora-r``, ``flora-r``: as ``finetune.py``;
* ``hetlora-r``: HetLoRA (``aggregators.hetlora``) with clients of ranks
  r/4, r/2 and r in turn by client id (``clients.lora_ranks``, no
  self-pruning): a client trains and sends only its first r_k rows of A
  and columns of B;
* ``hetlora_pruned-r``: the same with HetLoRA's rank self-pruning
  (``self_pruning=--gamma``, strength ``--pruning-strength``): a client's
  rank only decreases, and the summary records the ranks the clients
  ended with;
* ``dp_fedit-r``, ``dp_ffa_lora-r``: DP-FedAvg (``aggregators.dp_fedavg``,
  adaptive clipping to the median update norm) on FedIT's and on
  FFA-LoRA's adapters, noise multiplier ``--noise``, the privacy of every
  member accounted (``config.Privacy``, delta ``--delta``);
* its two controls, which take DP-FedAvg's parts one at a time:
  ``uniform_fedit-r``, ``uniform_ffa_lora-r``: the rule with every client
  weighted the same (``weighting="uniform"``, as DP-FedAvg weights them),
  no clipping, no noise; ``clip_fedit-r``, ``clip_ffa_lora-r``: DP-FedAvg's
  adaptive clipping with noise multiplier 0 (no privacy).

The seed of a member draws its cohorts, its shuffles and its adapters'
initial A. FFA-LoRA's A is frozen in the model (``lora(freeze_a=True,
key=...)``), which the members of a sweep share, so each seed of an
FFA-LoRA method runs as its own sweep of one member, its model's A drawn
from ``jax.random.key(seed)``; its round time is then the sum of the
members' median round times.

Writes, under ``--out``: ``<method>/seed_<s>/history.csv|json`` (each
member's rows and its run's config), ``summary.json`` (the settings and,
per method, the final perplexity and accuracy of every seed, their mean
and standard deviation, the uplink, epsilon, the median round time of the
sweep, and for the clipping methods the share of clients clipped a
round), ``table.md`` (written from those files by ``--table-only``) and
``perplexity.png`` (mean and one standard deviation over the seeds).
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
from fedjax_agg import clients
from fedjax_agg import history as history_lib
from fedjax_agg import plotting
from fedjax_agg import sweep
from fedjax_agg.config import Evaluation, Execution, LocalTraining, Privacy
from fedjax_agg.models import lora
import finetune
# pylint: enable=wrong-import-position


class Method:
  """One method of the comparison: its model, rule and run fields.
  ``seed_model``: seed -> the model of that seed's member, for a model
  that draws part of itself from a key (FFA-LoRA's frozen A); each seed
  then runs as a sweep of its own."""

  def __init__(self, model, rule, init=None, client_ranks=None,
               seed_model=None, **fields):
    self.model, self.rule, self.init, self.fields = model, rule, init, fields
    self.client_ranks = client_ranks  # HetLoRA: r_k by client id
    self.seed_model = seed_model


def methods(base, rank: int, num_clients: int, training: LocalTraining,
            args) -> dict:
  """name -> Method, for adapters of rank ``rank``."""
  key = jax.random.key(args.seed)
  plain = finetune.methods(base, [rank], key)
  out = {name: Method(*plain[name]) for name in
         ("full", f"fedit-{rank}", f"flora-{rank}")}
  # FFA-LoRA's A is frozen in the model: one model per seed, A drawn from
  # the seed's key, as FedIT's trained A is drawn from it by model.init.
  frozen = lambda seed: lora.lora(
      base.model, base.variables, rank=rank,
      targets=lora.TRANSFORMER_TARGETS, key=jax.random.key(seed),
      freeze_a=True)
  out[f"ffa_lora-{rank}"] = Method(plain[f"ffa_lora-{rank}"][0],
                                   aggregators.ffa_lora(), seed_model=frozen)
  out = {name: out[name] for name in ("full", f"fedit-{rank}",
                                      f"ffa_lora-{rank}", f"flora-{rank}")}
  # HetLoRA: ranks r/4, r/2, r by client id, on a rank-r model.
  model = lora.lora(base.model, base.variables, rank=rank,
                    targets=lora.TRANSFORMER_TARGETS, key=key)
  ranks = [max(1, rank // 4), max(1, rank // 2), rank]
  client_ranks = [ranks[i % 3] for i in range(num_clients)]
  out[f"hetlora-{rank}"] = Method(
      model, aggregators.hetlora(), client_ranks=client_ranks,
      local_update=clients.lora_ranks(model, client_ranks, training))
  out[f"hetlora_pruned-{rank}"] = Method(
      model, aggregators.hetlora(), client_ranks=client_ranks,
      local_update=clients.lora_ranks(
          model, client_ranks, training, self_pruning=args.gamma,
          pruning_strength=args.pruning_strength))
  # DP-FedAvg and its controls: equal weights (as DP-FedAvg's), then its
  # adaptive clipping without noise, then with noise.
  privacy = Privacy(args.noise, delta=args.delta)
  for name, factory in (("fedit", aggregators.fedit),
                        ("ffa_lora", aggregators.ffa_lora)):
    plain_method = out[f"{name}-{rank}"]
    model, seed_model = plain_method.model, plain_method.seed_model
    out[f"uniform_{name}-{rank}"] = Method(model, factory("uniform"),
                                           seed_model=seed_model)
    out[f"clip_{name}-{rank}"] = Method(
        model, aggregators.dp_fedavg(clip_norm=args.clip,
                                     noise_multiplier=0.0, adaptive=True),
        seed_model=seed_model)
    out[f"dp_{name}-{rank}"] = Method(
        model, aggregators.dp_fedavg(clip_norm=args.clip,
                                     noise_multiplier=args.noise,
                                     adaptive=True),
        seed_model=seed_model, privacy=privacy)
  return out


def run_method(method: Method, data, test, seeds, training, args):
  """The seeds of ``method`` as one vmapped sweep (a sweep per seed with
  ``method.seed_model``); -> (members, seconds of the whole run)."""
  start = time.perf_counter()
  run = lambda model, seeds: sweep.run_sweep(
      lambda hparams: method.rule, seeds=seeds, model=model,
      data=data, test_data=test, num_rounds=args.rounds,
      participation=args.clients_per_round / data.num_clients,
      training=training, init_params=method.init,
      execution=Execution(progress=False),
      evaluation=Evaluation(clients=False), **method.fields)
  if method.seed_model is None:
    members = run(method.model, seeds)
  else:
    members = [member for seed in seeds
               for member in run(method.seed_model(seed), [seed])]
  return members, time.perf_counter() - start


def _mean_sd(values) -> dict:
  values = np.asarray(values, np.float64)
  return {"mean": float(values.mean()),
          "sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0}


def _count_by_rank(ranks) -> dict:
  """{"r": how many of ``ranks`` are r}, by increasing r."""
  ranks = np.asarray(ranks)
  return {str(r): int(np.sum(ranks == r)) for r in sorted(set(ranks.tolist()))}


def summarise(name: str, members, seconds: float,
              client_ranks=None, apart: bool = False) -> dict:
  """The summary entry of one method's members. ``client_ranks``
  (HetLoRA): a client of rank r_k sends r_k of A's rows and B's columns,
  so the uplink is the mean over the federation's clients of r_k / r of
  the rank-r adapters' bytes. ``apart``: each member ran as its own sweep;
  the round time is then the sum of the members' medians."""
  finals = [m.history.rows[-1] for m in members]
  perplexity = [math.exp(row["test_loss"]) for row in finals]
  accuracy = [row["test_accuracy"] for row in finals]
  # After the compiling round.
  medians = [float(np.median(m.history.column("time_s")[2:]))
             if len(m.history.rows) > 2 else None for m in members]
  median = (sum(medians) if apart and None not in medians
            else medians[0])
  entry = {
      "seeds": [m.seed for m in members],
      "initial_perplexity": math.exp(members[0].history.rows[0]["test_loss"]),
      "final_perplexity": perplexity, "final_accuracy": accuracy,
      "perplexity": _mean_sd(perplexity), "accuracy": _mean_sd(accuracy),
      "uplink_bytes_per_client": finetune.uplink_per_client(
          name.removeprefix("dp_"), members[0].state.params),
      "median_round_s": median, "total_s": round(seconds, 1)}
  if apart:
    entry["seeds_run_apart"] = True
  if client_ranks is not None:
    full = entry["uplink_bytes_per_client"]
    rank = max(client_ranks)
    entry["uplink_bytes_per_client"] = int(round(
        full * float(np.mean(client_ranks)) / rank))
    entry["uplink_bytes_at_rank_r"] = full
    entry["client_ranks"] = _count_by_rank(client_ranks)
  pruned = [getattr(m.state.client_state, "ranks", None) for m in members]
  if client_ranks is not None and pruned[0] is not None:
    # The ranks the clients ended with (self-pruning lowers them), over
    # every member's federation; the uplink above is at the initial ranks.
    final = np.concatenate([np.asarray(r) for r in pruned])
    entry["final_client_ranks"] = _count_by_rank(final)
    entry["final_mean_rank"] = float(final.mean())
    # What the participants sent: their ranks after each round's pruning
    # (the client rows' ``client_ranks``), over every round and member.
    sent = [np.asarray(row["client_ranks"])[np.asarray(
        row.get("mask", np.ones(len(row["client_ranks"])))) > 0]
            for m in members for row in m.history.client_rows]
    entry["mean_sent_rank"] = float(np.concatenate(sent).mean())
  if "epsilon" in finals[0]:
    entry["epsilon"] = [float(row["epsilon"]) for row in finals]
  if "clip_norm" in finals[0]:
    entry["final_clip_norm"] = [float(row["clip_norm"]) for row in finals]
  if "fraction_clipped" in finals[0]:
    # The share of a round's participants whose update was clipped, over
    # every round of every member.
    clipped = np.concatenate([m.history.column("fraction_clipped")[1:]
                              for m in members])
    entry["fraction_clipped"] = {"mean": float(np.mean(clipped)),
                                 "min": float(np.min(clipped)),
                                 "max": float(np.max(clipped))}
  return entry


def results_table(out: str) -> str:
  """The Markdown table of ``<out>/summary.json``, written to
  ``<out>/table.md``."""
  with open(os.path.join(out, "summary.json")) as f:
    summary = json.load(f)
  lines = ["| method | seeds | uplink / client / round | perplexity, "
           "mean ± sd | next-char accuracy, mean ± sd | epsilon | "
           "clipped a round, mean (min-max) | "
           "round s (median, all seeds) |",
           "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
  for name, entry in summary["runs"].items():
    eps = (f"{np.mean(entry['epsilon']):.3g}" if "epsilon" in entry
           else "")
    clipped = entry.get("fraction_clipped")
    clipped = (f"{clipped['mean']:.0%} ({clipped['min']:.0%}-"
               f"{clipped['max']:.0%})" if clipped else "")
    apart = " (seeds apart)" if entry.get("seeds_run_apart") else ""
    lines.append(
        f"| {name} | {len(entry['seeds'])} | "
        f"{entry['uplink_bytes_per_client']:,} B | "
        f"{entry['perplexity']['mean']:.3f} ± {entry['perplexity']['sd']:.3f}"
        f" | {entry['accuracy']['mean']:.4f} ± {entry['accuracy']['sd']:.4f}"
        f" | {eps} | {clipped} | {entry['median_round_s']:.2f}{apart} |")
  return finetune.write_table(out, lines)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  finetune.setting_arguments(parser, os.path.join(HERE, "results", "seeds"),
                             test_rows=1000)
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--rank", type=int, default=8)
  parser.add_argument("--noise", type=float, default=0.05,
                      help="DP-FedAvg's noise multiplier z")
  parser.add_argument("--clip", type=float, default=1.0,
                      help="DP-FedAvg's initial clip norm (adaptive)")
  parser.add_argument("--delta", type=float, default=1e-4)
  parser.add_argument("--partition", default="natural",
                      choices=("natural", "iid"),
                      help="the federation the methods fine-tune on")
  parser.add_argument("--gamma", type=float, default=0.5,
                      help="HetLoRA's self-pruning: the fraction of its "
                      "components a pruning client keeps")
  parser.add_argument("--pruning-strength", type=float, default=1e-3,
                      help="lambda of HetLoRA's pruning regulariser")
  parser.add_argument("--only", default="",
                      help="comma-separated methods to run ('' for all)")
  parser.add_argument("--table-only", action="store_true")
  parser.add_argument("--tiny", action="store_true",
                      help="two plays, 2 rounds, rank 4, 2 seeds")
  args = parser.parse_args(argv)
  if args.table_only:
    print(results_table(args.out))
    return {}
  plays = None
  if args.tiny:
    args.rounds, args.clients_per_round, args.test_rows = 2, 2, 64
    args.rank, args.seeds, plays = 4, "0,1", ["hamlet", "macbeth"]
  seeds = [int(s) for s in args.seeds.split(",")]
  base, fed, rows, test = finetune.load_setting(args.base, plays, args.seed,
                                                args.test_rows)
  data = finetune.federations(fed, args.seed)[args.partition]
  adapters = LocalTraining(epochs=1, batch_size=args.batch_size,
                           learning_rate=args.lr)
  full = LocalTraining(epochs=1, batch_size=args.batch_size,
                       learning_rate=args.lr_full)
  # Folders inside the repository are recorded relative to it.
  summary = {"settings": {**vars(args), **finetune.shown_paths(args),
                          "seeds": seeds,
                          "partition": args.partition,
                          "clients": data.num_clients,
                          "test_rows": int(len(rows)),
                          "data": fed.provenance}, "runs": {}}
  chosen = [m for m in args.only.split(",") if m]
  curves = {}
  path = os.path.join(args.out, "summary.json")
  if chosen and os.path.exists(path):
    # A rerun of some methods keeps the others' entries and curves, when
    # they ran with the same settings.
    with open(path) as f:
      earlier = json.load(f)
    # Options added after a summary was written, used only by the methods
    # they name, may be missing from it: its methods did not read them.
    later = {"gamma", "pruning_strength"} - set(earlier["settings"])
    if later and any(m.startswith("hetlora_pruned") for m in earlier["runs"]):
      later = set()
    same = lambda a, b: {k: v for k, v in a.items()
                         if k != "only" and k not in later} == {
        k: v for k, v in b.items() if k != "only" and k not in later}
    if not same(earlier["settings"], json.loads(json.dumps(
        summary["settings"]))):
      raise SystemExit(f"{path} was written with other settings; rerun "
                       "every method (no --only) or choose another --out")
    summary["runs"] = {k: v for k, v in earlier["runs"].items()
                       if k not in chosen}
    for name in summary["runs"]:
      curves[name] = [history_lib.History.load(os.path.join(
          args.out, name, f"seed_{seed}")) for seed in seeds]
  every = methods(base, args.rank, data.num_clients, adapters, args)
  for name, method in every.items():
    if chosen and name not in chosen:
      continue
    training = full if method.init is not None else adapters
    members, seconds = run_method(method, data, test, seeds, training, args)
    for member in members:
      history_lib.save_run(
          os.path.join(args.out, name, f"seed_{member.seed}"),
          {"run": member.history}, overwrite=True)
    entry = summarise(name, members, seconds, method.client_ranks,
                      apart=method.seed_model is not None)
    summary["runs"][name] = entry
    print(json.dumps({"run": name, **entry}), flush=True)
    curves[name] = [m.history for m in members]
  # In the methods' order, whichever ran now.
  summary["runs"] = {k: summary["runs"][k] for k in every
                     if k in summary["runs"]}
  curves = {k: curves[k] for k in every if k in curves}
  os.makedirs(args.out, exist_ok=True)
  plotting.plot_mean_curves(
      curves, os.path.join(args.out, "perplexity.png"),
      metrics=("test_loss", "test_accuracy"),
      title=f"{args.partition} partition, rank {args.rank}")
  with open(path, "w") as f:
    json.dump(summary, f, indent=2)
  results_table(args.out)
  return summary


if __name__ == "__main__":
  main()
