"""Re-runs FedLap's figures: FedLap vs FedProx vs FedAvg, with stragglers.

Charteros, Koutsopoulos, "Lay Importance on the Layer: Federated Learning for
Non-IID data with Layer-based Regularization", 2023, Figs. 1-4.

  python experiments/fedlap/run.py --config configs/fig1b_fmnist.json
  python experiments/fedlap/run.py --config configs/fig1b_fmnist.json --full
  python experiments/fedlap/run.py --config configs/fig2_mnist.json \
      --set train.rounds=5 --set seeds=[0]

Runs every algorithm x seed of the config with ``experiment.run_config``
(which writes each algorithm's histories in the one layout of
``fedjax_agg.history``: ``<out>/<algorithm>/seed<k>/history.csv|json`` and
``<out>/<algorithm>/summary.csv``, or ``<out>/<algorithm>/history.csv|json``
for one seed; ``summary.json``, ``curves.png`` and ``partition.png``), then
adds what the paper's claims are about: ``early.json`` (per algorithm, test
accuracy at the config's ``report_rounds`` and its mean over rounds
1..``early_rounds``, mean ± std over seeds) and ``panels.png`` (one panel
per straggler level, as the paper's Figs. 2-4). ``--full`` runs
``<name>_full.json``, the paper's scale.
"""

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import matplotlib  # pylint: disable=g-import-not-at-top,wrong-import-position
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from fedjax_agg import experiment
from fedjax_agg import history as history_lib
from fedjax_agg import jsonio  # pylint: disable=wrong-import-position


def load_histories(config: dict, out_dir: str) -> dict:
  """algorithm -> list over seeds of the ``[rounds + 1]`` accuracy curve."""
  curves = {}
  seeds = config.get("seeds", [0])
  for name in config["algorithms"]:
    runs = []
    for seed in seeds:
      rows = history_lib.load_saved(os.path.join(out_dir, name),
                                    f"seed{seed}", len(seeds))["rows"]
      runs.append(np.array([row.get("test_accuracy", np.nan)
                            for row in rows]))
    curves[name] = runs
  return curves


def early_summary(config: dict, curves: dict) -> dict:
  """Accuracy at ``report_rounds`` and mean accuracy over the first rounds."""
  rounds = config["train"]["rounds"]
  report = [r for r in config.get("report_rounds", [rounds]) if r <= rounds]
  early = min(config.get("early_rounds", rounds), rounds)
  out = {}
  for name, runs in curves.items():
    acc = np.stack(runs)  # [seeds, rounds + 1], column 0 = initial model
    entry = {"seeds": len(runs), "early_rounds": early,
             "early_mean_accuracy_mean": float(np.mean(acc[:, 1:early + 1])),
             "early_mean_accuracy_std": float(
                 np.std(np.mean(acc[:, 1:early + 1], axis=1)))}
    for r in report:
      entry[f"accuracy_round{r}_mean"] = float(np.mean(acc[:, r]))
      entry[f"accuracy_round{r}_std"] = float(np.std(acc[:, r]))
    out[name] = entry
  return out


def straggler_level(config: dict, name: str) -> float:
  spec = config["algorithms"][name]
  return spec.get("train", {}).get(
      "stragglers", config.get("train", {}).get("stragglers", 0.0))


def plot_panels(config: dict, curves: dict, path: str) -> str:
  """One panel per straggler level; mean ± std over seeds per algorithm."""
  levels = sorted({straggler_level(config, n) for n in curves})
  fig, axes = plt.subplots(len(levels), 1, figsize=(6, 3.4 * len(levels)),
                           squeeze=False)
  for ax, level in zip(axes[:, 0], levels, strict=True):
    for name, runs in curves.items():
      if straggler_level(config, name) != level:
        continue
      acc = np.stack(runs)
      mean, std = acc.mean(0), acc.std(0)
      rounds = np.arange(acc.shape[1])
      ax.plot(rounds, mean, label=name)
      ax.fill_between(rounds, mean - std, mean + std, alpha=0.2)
    ax.set_title(f"{config.get('name', '')}: {level:.0%} stragglers, "
                 f"{len(runs)} seeds")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def main(argv=None) -> None:
  parser = experiment.script_parser(__doc__.splitlines()[0])
  config, out_dir, names = experiment.script_config(
      parser.parse_args(argv), HERE)
  # "report_rounds" and "early_rounds" are read here; the runner ignores them.
  summary = experiment.run_config(config, out_dir, algorithms=names)
  if names:
    config["algorithms"] = {n: config["algorithms"][n] for n in names}
  curves = load_histories(config, out_dir)
  early = early_summary(config, curves)
  with open(os.path.join(out_dir, "early.json"), "w") as f:
    f.write(json.dumps(jsonio.jsonable(
        {"name": config.get("name"), "algorithms": early}), indent=2))
  plot_panels(config, curves, os.path.join(out_dir, "panels.png"))
  for name in curves:
    entry, late = early[name], summary[name]
    line = (f"{name:>22}: final {late['final_test_accuracy_mean']:.4f} ± "
            f"{late['final_test_accuracy_std']:.4f}, mean over first "
            f"{entry['early_rounds']} rounds "
            f"{entry['early_mean_accuracy_mean']:.4f} ± "
            f"{entry['early_mean_accuracy_std']:.4f}")
    if "rounds_to_target" in late:
      line += (f", rounds to {late['target']:.0%}: "
               f"{late['rounds_to_target']}")
    print(line, flush=True)


if __name__ == "__main__":
  main()
