"""Systems study: time to accuracy, accuracy per uplink byte, secure sums.

Fashion-MNIST, Dirichlet(0.3) over 100 clients, 10 % participation
(m = K = 10), mlp2, batch 20, one local epoch, lr 0.05, seeds 0 and 1.
Three parts, each a set of configs that differ only in their "systems"
section (which applies to every algorithm of a config, hence one config per
setting):

  time     synchronous FedAvg, FedAvg with over-selection 0.3 and FedBuff
           (C = 20, polynomial staleness) at log-normal speed sigma 0.25,
           1.0 and 2.0 (bandwidth sigma 0.25): accuracy against simulated
           time (Nguyen et al., "Federated Learning with Buffered
           Asynchronous Aggregation", AISTATS 2022).
  codecs   uplink codecs with and without error feedback, constant
           profiles: accuracy against uplink bytes.
  secagg   simulated secure aggregation at 16, 20 and 32 bits and without.

  python experiments/systems/run.py --write-configs
  python experiments/systems/run.py --part time
  python experiments/systems/run.py --part codecs --part secagg
  python experiments/systems/run.py --report-only

Each config runs with ``experiment.run_config`` into ``results/runs/<name>``
(its plots are removed there to keep the folder small); ``--report-only``
(and every run) then reads all histories found and writes
``results/results.json``, ``results/*.csv`` and ``results/*.png``.
"""

import argparse
import glob
import json
import math
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import matplotlib  # pylint: disable=g-import-not-at-top,wrong-import-position
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from fedjax_agg import experiment  # pylint: disable=wrong-import-position
from fedjax_agg import history as history_lib

CONFIGS = os.path.join(HERE, "configs")
RESULTS = os.path.join(HERE, "results")
RUNS = os.path.join(RESULTS, "runs")
PARTS = ("time", "codecs", "secagg")

TARGET = 0.70
SIGMAS = {"s025": 0.25, "s100": 1.0, "s200": 2.0}
BANDWIDTH_SIGMA = 0.25
SYNC_ROUNDS = 30
# FedBuff server steps per speed sigma, so that its simulated time is of the
# order of the synchronous runs' (a step waits for K = 10 of C = 20 clients).
FEDBUFF_STEPS = {"s025": 60, "s100": 150, "s200": 240}
CONCURRENCY = 20
OVER_SELECTION = 0.3
CODEC_ROUNDS = 20
CODECS = {
    "none": (None, {}),
    "uniform2": ("uniform", {"bits": 2}),
    "qsgd4": ("qsgd", {"bits": 4}),
    "topk0.1": ("top_k", {"fraction": 0.1}),
    "sign": ("sign", {}),
    "hadamard_uniform2": ("hadamard", {"inner": "uniform", "bits": 2}),
}
SECAGG_ROUNDS = 20
SECAGG_BITS = (None, 16, 20, 32)
SECAGG_CLIP = 0.5
# (bits, clip) of extra runs with a clip tight enough to bind.
SECAGG_TIGHT = ((20, 0.01),)


def secagg_settings() -> list:
  """[(config name, bits or None, clip or None)] of part 3."""
  settings = [(f"secagg_{bits or 'none'}", bits,
               SECAGG_CLIP if bits else None) for bits in SECAGG_BITS]
  settings += [(f"secagg_{bits}_clip{clip}", bits, clip)
               for bits, clip in SECAGG_TIGHT]
  return settings


def base_config(name: str, rounds: int, algorithm: str) -> dict:
  """The setting every config shares; ``systems`` is added per config."""
  return {
      "name": name,
      "dataset": {"name": "fashion_mnist", "source": "auto"},
      "partition": {"name": "dirichlet", "num_clients": 100,
                    "args": {"alpha": 0.3}},
      "model": {"name": "mlp2", "args": {}},
      "train": {"rounds": rounds, "participation": 0.1, "local_epochs": 1,
                "batch_size": 20, "learning_rate": 0.05, "eval_every": 1,
                "eval_clients": False},
      "algorithms": {algorithm: {"aggregator": "fedavg",
                                 "aggregator_args": {"weighting": "uniform"}}},
      "seeds": [0, 1],
      "target_accuracy": TARGET,
  }


def build_configs() -> dict:
  """config name -> config dict, for all three parts."""
  configs = {}
  for tag, sigma in SIGMAS.items():
    profile_args = {"speed_median": 100.0, "speed_sigma": sigma,
                    "uplink_median": 1e6, "uplink_sigma": BANDWIDTH_SIGMA,
                    "downlink_median": 4e6,
                    "downlink_sigma": BANDWIDTH_SIGMA}
    modes = {
        "sync": ("FedAvg", SYNC_ROUNDS, {}),
        "oversel": ("FedAvg-OS0.3", SYNC_ROUNDS,
                    {"over_selection": OVER_SELECTION}),
        "fedbuff": ("FedBuff", FEDBUFF_STEPS[tag],
                    {"concurrency": CONCURRENCY,
                     "staleness": "polynomial"}),
    }
    for mode, (algorithm, rounds, extra) in modes.items():
      name = f"time_{tag}_{mode}"
      config = base_config(name, rounds, algorithm)
      config["systems"] = {"profiles": "lognormal",
                           "profile_args": profile_args,
                           "availability": "always", "seed": 0, **extra}
      configs[name] = config
  for tag, (codec, args) in CODECS.items():
    for feedback in ((False, True) if codec else (False,)):
      name = f"codecs_{tag}" + ("_ef" if feedback else "")
      config = base_config(name, CODEC_ROUNDS, "FedAvg")
      systems = {"profiles": "constant", "availability": "always"}
      if codec:
        systems.update(codec=codec, codec_args=args,
                       error_feedback=feedback)
      config["systems"] = systems
      configs[name] = config
  for name, bits, clip in secagg_settings():
    config = base_config(name, SECAGG_ROUNDS, "FedAvg")
    systems = {"profiles": "constant", "availability": "always"}
    if bits:
      systems.update(secagg_bits=bits, secagg_clip=clip)
    config["systems"] = systems
    configs[name] = config
  return configs


def write_configs() -> None:
  os.makedirs(CONFIGS, exist_ok=True)
  for name, config in build_configs().items():
    with open(os.path.join(CONFIGS, f"{name}.json"), "w") as f:
      f.write(json.dumps(config, indent=2) + "\n")


def run_part(part: str) -> None:
  """Runs every ``configs/<part>_*.json`` not yet in ``results/runs``."""
  for path in sorted(glob.glob(os.path.join(CONFIGS, f"{part}_*.json"))):
    name = os.path.splitext(os.path.basename(path))[0]
    out_dir = os.path.join(RUNS, name)
    if os.path.exists(os.path.join(out_dir, "summary.json")):
      print(f"{name}: done already", flush=True)
      continue
    if os.path.exists(out_dir):
      shutil.rmtree(out_dir)  # an unfinished run of ours: start it again
    config = experiment.load_config(path)  # a key given twice refused
    experiment.run_config(config, out_dir, progress=False)
    for png in glob.glob(os.path.join(out_dir, "*.png")):
      os.remove(png)
    seeds = experiment.check_config(config).seeds
    folder = experiment.RunFolder(out_dir, {
        algorithm: [f"seed{seed}" for seed in seeds]
        for algorithm in config["algorithms"]})
    for algorithm in config["algorithms"]:  # the histories' CSV copies
      for seed in seeds:
        os.remove(os.path.join(folder.member_dir(algorithm, f"seed{seed}"),
                               "history.csv"))
    print(f"{name}: finished", flush=True)


def load_runs(name: str) -> list:
  """[(algorithm, seed, rows)] of a config's saved histories (in the one
  layout of ``fedjax_agg.history``, seeds from the run's ``config.json``),
  [] if not run."""
  out_dir = os.path.join(RUNS, name)
  path = os.path.join(out_dir, "config.json")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    config = json.load(f)
  seeds = experiment.check_config(config).seeds
  runs = []
  for algorithm in sorted(config["algorithms"]):
    run_dir = experiment.saved_algorithm_dir(out_dir, algorithm,
                                             list(config["algorithms"]))
    for seed in sorted(seeds):
      member = f"seed{seed}"
      folder = history_lib.member_folder(run_dir, member, len(seeds))
      if os.path.exists(os.path.join(folder, "history.json")):
        rows = history_lib.load_saved(run_dir, member, len(seeds))["rows"]
        runs.append((algorithm, seed, rows))
  return runs


def column(rows: list, key: str, first: float = 0.0) -> np.ndarray:
  """A history column; round 0 (before any client ran) gets ``first``."""
  return np.array([row.get(key, first if row["round"] == 0 else np.nan)
                   for row in rows], dtype=float)


def first_reaching(x: np.ndarray, acc: np.ndarray, target: float) -> float:
  hits = np.flatnonzero(acc >= target)
  return float(x[hits[0]]) if hits.size else math.nan


def at_or_before(x: np.ndarray, acc: np.ndarray, limit: float) -> float:
  """Accuracy of the last evaluation at x <= limit."""
  ok = np.flatnonzero((x <= limit) & ~np.isnan(acc))
  return float(acc[ok[-1]]) if ok.size else math.nan


def stats(values: list) -> dict:
  """mean ± std over seeds of the values that exist, and how many."""
  good = [v for v in values if not math.isnan(v)]
  return {"mean": float(np.mean(good)) if good else None,
          "std": float(np.std(good)) if good else None,
          "n": len(good), "of": len(values)}


def report_time(results: dict) -> None:
  fig, axes = plt.subplots(1, len(SIGMAS), figsize=(5 * len(SIGMAS), 3.8),
                           squeeze=False)
  rows_out = []
  for ax, (tag, sigma) in zip(axes[0], SIGMAS.items(), strict=True):
    loaded = {mode: load_runs(f"time_{tag}_{mode}")
              for mode in ("sync", "oversel", "fedbuff")}
    loaded = {mode: runs for mode, runs in loaded.items() if runs}
    if not loaded:
      continue
    # The common simulated time: the shortest run of this sigma.
    common = min(column(rows, "sim_time_s")[-1]
                 for runs in loaded.values() for _, _, rows in runs)
    for mode, runs in loaded.items():
      algorithm = runs[0][0]
      entry = {"speed_sigma": sigma, "mode": mode, "algorithm": algorithm,
               "rounds": len(runs[0][2]) - 1, "common_time_s": common}
      ttt, acc_common, final, end, ends = [], [], [], [], []
      for i, (_, _, rows) in enumerate(runs):
        t = column(rows, "sim_time_s")
        acc = column(rows, "test_accuracy", np.nan)
        ttt.append(first_reaching(t, acc, TARGET))
        acc_common.append(at_or_before(t, acc, common))
        final.append(float(acc[-1]))
        end.append(float(t[-1]))
        ends.append(float(np.nanmean(column(rows, "staleness_mean",
                                            np.nan)))
                    if mode == "fedbuff" else math.nan)
        ax.plot(t, acc, color=f"C{list(loaded).index(mode)}", lw=1,
                alpha=0.8, label=algorithm if i == 0 else None)
      entry.update(time_to_target_s=stats(ttt),
                   accuracy_at_common_time=stats(acc_common),
                   final_accuracy=stats(final), final_sim_time_s=stats(end))
      if mode == "fedbuff":
        entry["staleness_mean"] = stats(ends)
      rows_out.append(entry)
    ax.axhline(TARGET, color="grey", lw=0.8, ls="--")
    ax.axvline(common, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_title(f"speed sigma {sigma} (bandwidth sigma {BANDWIDTH_SIGMA})")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0.3, 0.9)
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(RESULTS, "time_to_accuracy.png"), dpi=100)
  plt.close(fig)
  results["time"] = rows_out


def report_codecs(results: dict) -> None:
  fig, ax = plt.subplots(figsize=(7, 4.5))
  rows_out = []
  names = [f"codecs_{tag}" + ef for tag, (codec, _) in CODECS.items()
           for ef in (("", "_ef") if codec else ("",))]
  for name in names:
    runs = load_runs(name)
    if not runs:
      continue
    final, up, btt = [], [], []
    for i, (_, _, rows) in enumerate(runs):
      b = column(rows, "uplink_bytes")
      acc = column(rows, "test_accuracy", np.nan)
      final.append(float(acc[-1]))
      up.append(float(b[-1]))
      btt.append(first_reaching(b, acc, TARGET))
      tag = name[len("codecs_"):].removesuffix("_ef")
      ax.plot(np.maximum(b, 1.0), acc, color=f"C{list(CODECS).index(tag)}",
              ls="--" if name.endswith("_ef") else "-", lw=1,
              label=name[len("codecs_"):] if i == 0 else None)
    rows_out.append({"config": name, "rounds": len(runs[0][2]) - 1,
                     "final_accuracy": stats(final),
                     "final_uplink_bytes": stats(up),
                     "uplink_bytes_to_target": stats(btt)})
  ax.set_xscale("log")
  ax.set_xlim(left=1e5)
  ax.set_ylim(0.3, 0.9)
  ax.set_xlabel("cumulative uplink bytes")
  ax.set_ylabel("test accuracy")
  ax.set_title("accuracy per uplink byte (dashed: error feedback)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(os.path.join(RESULTS, "accuracy_per_uplink_byte.png"), dpi=100)
  plt.close(fig)
  results["codecs"] = rows_out


def report_secagg(results: dict) -> None:
  fig, ax = plt.subplots(figsize=(6, 4))
  rows_out = []
  for k, (name, bits, clip) in enumerate(secagg_settings()):
    runs = load_runs(name)
    if not runs:
      continue
    final, extra = [], {}
    for i, (_, _, rows) in enumerate(runs):
      acc = column(rows, "test_accuracy", np.nan)
      final.append(float(acc[-1]))
      keys = sorted({key for row in rows for key in row
                     if key.startswith("secagg")})
      for key in keys:
        values = column(rows, key, np.nan)[1:]
        extra.setdefault(f"{key}_total", []).append(float(np.nansum(values)))
        extra.setdefault(f"{key}_max", []).append(float(np.nanmax(values)))
      ax.plot(column(rows, "round"), acc, color=f"C{k}", lw=1,
              label=(f"{bits} bits, clip {clip}" if bits else "no secagg")
              if i == 0 else None)
    entry = {"config": name, "secagg_bits": bits,
             "secagg_clip": clip,
             "rounds": len(runs[0][2]) - 1, "final_accuracy": stats(final)}
    entry.update({key: stats(v) for key, v in extra.items()})
    rows_out.append(entry)
  ax.set_xlabel("round")
  ax.set_ylabel("test accuracy")
  ax.set_title("simulated secure aggregation")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(RESULTS, "secagg.png"), dpi=100)
  plt.close(fig)
  results["secagg"] = rows_out


def report() -> dict:
  os.makedirs(RESULTS, exist_ok=True)
  results = {"target_accuracy": TARGET}
  report_time(results)
  report_codecs(results)
  report_secagg(results)
  with open(os.path.join(RESULTS, "results.json"), "w") as f:
    f.write(json.dumps(results, indent=2) + "\n")
  return results


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--write-configs", action="store_true",
                      help="(re)write configs/*.json from this script")
  parser.add_argument("--part", action="append", choices=PARTS, default=[],
                      help="part to run (repeatable; default none)")
  parser.add_argument("--report-only", action="store_true",
                      help="only read results/runs and write the summary")
  args = parser.parse_args(argv)
  if args.write_configs:
    write_configs()
  if not args.report_only:
    for part in args.part:
      run_part(part)
  report()


if __name__ == "__main__":
  main()
