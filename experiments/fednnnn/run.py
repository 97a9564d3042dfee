"""Re-runs FedNNNN's Table 2 and Figs. 3, 8-9: FedAvg, FedProx, Norm-Norm,
Momentum and FedNNNN under IID/non-IID x balanced/unbalanced clients.

Nagura, Bian & Sato, "FedNNNN: Norm-Normalized Neural Network Aggregation
for Fast and Accurate Federated Learning", 2021, Sec. 5 and appendix.

  python experiments/fednnnn/run.py --config configs/noniid_ub_mnist.json
  python experiments/fednnnn/run.py --config configs/noniid_ub_mnist.json \\
      --full

Runs every algorithm x seed of the config with ``experiment.run_config``
(each algorithm's histories in the one layout of ``fedjax_agg.history``:
``<out>/<algorithm>/seed<k>/history.csv|json`` and
``<out>/<algorithm>/summary.csv``, or ``<out>/<algorithm>/history.csv|json``
for one seed; ``summary.json``, ``curves.png``, ``partition.png``), then
reads the norms of the weight-divergence analysis (NWDA) that the
FedNNNN-family aggregators report every round (whole model and per layer)
from the saved JSON and writes

* ``nwda.csv``: algorithm, seed, round, layer ("model" or a layer name),
  N (Eq. (4), the norm of the average client update), E (Eq. (5), the
  average norm of the client updates) and the server update norm
  |w_{t+1} - w_t| (Eq. (24), the "N" of the paper's figures);
* ``nwda.png``: server update norm and E per round, mean over seeds, for
  the whole model and each layer (convolutional and fully connected).

Algorithms without these metrics (a plain ``fedavg`` aggregator) are left
out of the NWDA outputs; the configs therefore run FedAvg and FedProx
through ``momentum`` with gamma = 0, which is FedAvg's Eq. (3) exactly.
``--tables-only`` rebuilds the NWDA outputs from the saved runs.
"""

import csv
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import matplotlib  # pylint: disable=g-import-not-at-top,wrong-import-position
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from fedjax_agg import experiment  # pylint: disable=wrong-import-position
from fedjax_agg import history as history_lib
from fedjax_agg import models  # pylint: disable=wrong-import-position
from fedjax_agg import tree_math  # pylint: disable=wrong-import-position

# (column in the saved rows, per-layer array in the saved client rows).
NORMS = {"N": ("N", "layer_N"), "E": ("E", "layer_E"),
         "server_update_norm": ("server_update_norm",
                                "layer_server_update_norm")}


def layer_names(config: dict) -> tuple[str, ...]:
  """Names of the layers the aggregators' per-layer metrics refer to."""
  import jax  # pylint: disable=g-import-not-at-top
  mcfg = config["model"]
  model = models.get(mcfg["name"], **mcfg.get("args", {}))
  params = model.init(jax.random.key(0))
  return tree_math.layer_structure(params, "layer").names


def nwda_records(config: dict, out_dir: str) -> list[dict]:
  """One record per algorithm, seed, round and layer (``model`` = all)."""
  names = layer_names(config)
  records = []
  seeds = config.get("seeds", [0])
  for algorithm in config["algorithms"]:
    for seed in seeds:
      saved = history_lib.load_saved(os.path.join(out_dir, algorithm),
                                     f"seed{seed}", len(seeds))
      rows = {row["round"]: row for row in saved["rows"]}
      for client_row in saved["clients"]:
        r = client_row["round"]
        if "layer_E" not in client_row:
          break  # this aggregator reports no NWDA norms
        records.append({"algorithm": algorithm, "seed": seed, "round": r,
                        "layer": "model",
                        **{k: rows[r][col] for k, (col, _) in
                           NORMS.items()}})
        for i, name in enumerate(names):
          records.append({"algorithm": algorithm, "seed": seed, "round": r,
                          "layer": name,
                          **{k: client_row[arr][i] for k, (_, arr) in
                             NORMS.items()}})
  return records


def write_csv(records: list[dict], path: str) -> str:
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(records[0]))
    writer.writeheader()
    writer.writerows(records)
  return path


def plot_nwda(records: list[dict], path: str, title: str = "") -> str:
  """Rows: server update norm (N of the figures) and E; columns: the whole
  model, then each layer; one line per algorithm (mean over seeds)."""
  layers = list(dict.fromkeys(r["layer"] for r in records))
  algorithms = list(dict.fromkeys(r["algorithm"] for r in records))
  fig, axes = plt.subplots(2, len(layers), figsize=(3.4 * len(layers), 6),
                           squeeze=False)
  for col, layer in enumerate(layers):
    for row, (key, label) in enumerate(
        (("server_update_norm", "N = |w_{t+1} - w_t|"),
         ("E", "E = mean_k |dw_k|"))):
      ax = axes[row, col]
      for algorithm in algorithms:
        mine = [r for r in records
                if r["layer"] == layer and r["algorithm"] == algorithm]
        rounds = sorted({r["round"] for r in mine})
        mean = [np.mean([r[key] for r in mine if r["round"] == t])
                for t in rounds]
        ax.plot(rounds, mean, label=algorithm)
      kind = ("whole model" if layer == "model" else
              ("conv" if "conv" in layer.lower() else "fc") + " "
              + layer.split("/")[-1])
      ax.set_title(f"{label}\n{kind}", fontsize=9)
      ax.set_xlabel("round")
      ax.set_yscale("log")
      ax.grid(alpha=0.3)
  axes[0, 0].legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def main(argv=None) -> None:
  parser = experiment.script_parser(__doc__.splitlines()[0])
  parser.add_argument("--tables-only", action="store_true",
                      help="rebuild nwda.csv/png from saved runs")
  args = parser.parse_args(argv)
  config, out_dir, names = experiment.script_config(args, HERE)
  if names:
    config["algorithms"] = {n: config["algorithms"][n] for n in names}
  if args.tables_only:
    with open(os.path.join(out_dir, "summary.json")) as f:
      summary = json.load(f)["algorithms"]
  else:
    summary = experiment.run_config(config, out_dir, algorithms=names)
  records = nwda_records(config, out_dir)
  if records:
    write_csv(records, os.path.join(out_dir, "nwda.csv"))
    plot_nwda(records, os.path.join(out_dir, "nwda.png"),
              config.get("name", ""))
  for name, entry in summary.items():
    print(f"{name:>10}: final {entry['final_test_accuracy_mean']:.4f} ± "
          f"{entry['final_test_accuracy_std']:.4f}, best "
          f"{entry['best_test_accuracy_mean']:.4f} ± "
          f"{entry['best_test_accuracy_std']:.4f}", flush=True)


if __name__ == "__main__":
  main()
