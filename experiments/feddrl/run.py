"""Re-runs FedDRL's Table 3, Fig. 6 and Fig. 10: FedDRL vs FedAvg vs FedProx.

Nguyen et al., "FedDRL: Deep Reinforcement Learning-based Adaptive
Aggregation for Non-IID Data in Federated Learning", ICPP 2022.

  python experiments/feddrl/run.py --config configs/table3_fmnist_ce.json
  python experiments/feddrl/run.py --config configs/table3_fmnist_ce.json \
      --full
  python experiments/feddrl/run.py --config configs/table3_fmnist_pa.json \
      --set train.rounds=3 --set seeds=[0]

Runs every algorithm x seed of the config with ``experiment.run_config``
(which writes each algorithm's histories in the one layout of
``fedjax_agg.history``: ``<out>/<algorithm>/seed<k>/history.csv|json`` and
``<out>/<algorithm>/summary.csv``, or ``<out>/<algorithm>/history.csv|json``
for one seed; ``summary.json``, ``curves.png`` and ``partition.png``), then
adds what the paper reports:

* ``table3.json``: per algorithm the best top-1 test accuracy during
  training (Table 3), mean ± std over seeds; the global model's inference
  loss on every client's training data, mean and variance over clients
  (Fig. 6), at the last round and averaged over the second half of the
  rounds, each also divided by FedDRL's (the paper's normalisation); and
  rounds to the target accuracy (Fig. 10), the target being, as in §5.2,
  the lowest of the algorithms' best accuracies (per seed).
* ``fig6.png``: client-loss mean and variance per round, normalised by
  FedDRL's, mean over seeds.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import matplotlib  # pylint: disable=g-import-not-at-top,wrong-import-position
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from fedjax_agg import experiment
from fedjax_agg import jsonio  # pylint: disable=wrong-import-position
from fedjax_agg import plotting  # pylint: disable=wrong-import-position
from fedjax_agg.aggregators._feddrl import agent as agent_lib  # pylint: disable=wrong-import-position
from fedjax_agg import drivers as two_stage  # pylint: disable=wrong-import-position
from fedjax_agg import rounds as rounds_lib
from fedjax_agg import history as history_lib

# Fig. 6 normalises by this algorithm's curves (config key "reference").
REFERENCE = "FedDRL"
COLUMNS = ("test_accuracy", "client_loss_mean", "client_loss_var")


def saved_path(config: dict, out_dir: str, name: str, seed: int) -> str:
  """Where algorithm ``name``'s run of ``seed`` keeps its ``history.json``
  (the one layout: a run per algorithm, a member per seed)."""
  seeds = config.get("seeds", [0])
  return os.path.join(history_lib.member_folder(
      experiment.saved_algorithm_dir(out_dir, name, list(
          config["algorithms"])), f"seed{seed}", len(seeds)), "history.json")


def load_saved(config: dict, out_dir: str, name: str, seed: int) -> dict:
  """Algorithm ``name``'s saved run of ``seed``: config, rows, clients."""
  return history_lib.load_saved(os.path.join(out_dir, name), f"seed{seed}",
                                len(config.get("seeds", [0])))


def load_columns(config: dict, out_dir: str, names) -> dict:
  """algorithm -> column -> [seeds, rounds + 1] array (round 0 first)."""
  out = {}
  for name in names:
    runs = []
    for seed in config.get("seeds", [0]):
      runs.append(load_saved(config, out_dir, name, seed)["rows"])
    out[name] = {c: np.array([[row.get(c, np.nan) for row in rows]
                              for rows in runs]) for c in COLUMNS}
  return out


def effective_clients(config: dict, out_dir: str, name: str):
  """Mean over rounds of 1 / sum_k alpha_k^2 (the number of equally
  weighted clients the impact factors amount to), per seed; None when the
  runs record no ``client_weights``."""
  out = []
  for seed in config.get("seeds", [0]):
    clients = load_saved(config, out_dir, name, seed)["clients"]
    if not clients or "client_weights" not in clients[0]:
      return None
    alpha = np.array([c["client_weights"] for c in clients])
    out.append(float(np.mean(1.0 / np.sum(alpha ** 2, axis=1))))
  return out


def _stat(values) -> dict:
  values = np.asarray(values, np.float64)
  return {"mean": float(np.mean(values)), "std": float(np.std(values)),
          "per_seed": [float(v) for v in values]}


def first_round(curve: np.ndarray, target: float):
  """First round (index) whose accuracy reaches ``target``, else None."""
  hits = np.nonzero(curve >= target)[0]
  return int(hits[0]) if hits.size else None


def table3(columns: dict, reference: str = REFERENCE) -> dict:
  """Best accuracy, client-loss statistics and rounds to target."""
  best = {n: np.nanmax(c["test_accuracy"], axis=1)
          for n, c in columns.items()}
  targets = np.min(np.stack(list(best.values())), axis=0)  # [seeds]
  out = {"target_accuracy": [float(t) for t in targets], "algorithms": {}}
  for name, cols in columns.items():
    rounds = cols["test_accuracy"].shape[1] - 1
    half = slice(rounds // 2 + 1, None)
    entry = {"seeds": len(best[name]), "rounds": rounds,
             "best_accuracy": _stat(best[name]),
             "final_accuracy": _stat(cols["test_accuracy"][:, -1])}
    for col in ("client_loss_mean", "client_loss_var"):
      entry[f"final_{col}"] = _stat(cols[col][:, -1])
      entry[f"late_{col}"] = _stat(np.nanmean(cols[col][:, half], axis=1))
      if reference in columns:
        ref = columns[reference][col]
        entry[f"late_{col}_over_{reference}"] = float(
            np.nanmean(cols[col][:, half]) / np.nanmean(ref[:, half]))
    reached = [first_round(c, t)
               for c, t in zip(cols["test_accuracy"], targets, strict=True)]
    hits = [r for r in reached if r is not None]
    entry["rounds_to_target"] = reached
    entry["rounds_to_target_mean"] = float(np.mean(hits)) if hits else None
    out["algorithms"][name] = entry
  return out


def plot_fig6(config: dict, columns: dict, path: str,
              reference: str = REFERENCE) -> str:
  """Client-loss mean / variance per round over FedDRL's (Fig. 6)."""
  fig, axes = plt.subplots(2, 1, figsize=(6, 6.5), sharex=True)
  for ax, col in zip(axes, ("client_loss_mean", "client_loss_var"),
                     strict=True):
    ref = np.nanmean(columns[reference][col], axis=0)
    for name, cols in columns.items():
      curve = np.nanmean(cols[col], axis=0) / ref
      ax.plot(np.arange(curve.size), curve, label=name)
    ax.set_ylabel(f"{col} / {reference}'s")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
  axes[0].set_title(f"{config.get('name', '')}: client inference loss, "
                    f"{len(config.get('seeds', [0]))} seeds", fontsize=10)
  axes[1].set_xlabel("round")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def two_stage_aggregator(config: dict, name: str, seed: int, prepared):
  """Trains FedDRL's main agent in two stages (§3.4.2) on the run's data;
  returns the aggregator it drives (no exploration, no further learning).

  The workers train as the algorithm's runs do: the model, data, client
  training and execution of ``experiment.build``. The algorithm's
  ``two_stage`` entry gives ``offline_calls``, ``num_workers`` (default 2,
  the paper's) and ``online_rounds`` (default: the run's rounds);
  ``aggregator_args`` are ``AgentConfig`` fields.
  """
  spec = config["algorithms"][name]
  stages = spec["two_stage"]
  built = experiment.build(config, name, prepared)
  options = built.options
  if options.local_update is not None:
    raise ValueError(f"{name}: two-stage FedDRL's workers train with the "
                     "engine's local training; a client side or an attack "
                     "would be left out of its online stage")
  cohort = rounds_lib.num_sampled(built.data.num_clients,
                                  options.participation)
  agent_config = agent_lib.AgentConfig()._replace(
      **spec.get("aggregator_args", {}))
  result = two_stage.two_stage(
      built.model, built.data, num_participants=cohort,
      online_rounds=stages.get("online_rounds", options.num_rounds),
      offline_calls=stages["offline_calls"],
      num_workers=stages.get("num_workers", 2), config=agent_config,
      seed=seed, training=options.training, execution=options.execution)
  return two_stage.decider(result, cohort, config=agent_config, seed=seed)


def run_two_stage(config: dict, names, out_dir: str) -> None:
  """Runs the two-stage FedDRL algorithms ``names`` over the seeds."""
  seeds = config.get("seeds", [0])
  for seed in seeds:
    prepared = experiment.prepare_data(config, seed)
    for name in names:
      rule = two_stage_aggregator(config, name, seed, prepared)
      result = experiment.run_algorithm(config, name, seed, prepared,
                                        progress=True, aggregator=rule)
      result.history.save(history_lib.member_folder(
          os.path.join(out_dir, name), f"seed{seed}", len(seeds)))
      print(f"{config.get('name')} {name} seed {seed}: final acc "
            f"{result.history.rows[-1].get('test_accuracy')}", flush=True)


def main(argv=None) -> None:
  parser = experiment.script_parser(__doc__.splitlines()[0])
  parser.add_argument("--tables-only", action="store_true",
                      help="only rebuild the tables and plots from the "
                           "saved runs")
  args = parser.parse_args(argv)
  config, out_dir, names = experiment.script_config(args, HERE)
  names = [] if args.tables_only else (
      names or list(config["algorithms"]))
  staged = [n for n in names if "two_stage" in config["algorithms"][n]]
  plain = [n for n in names if n not in staged]
  if plain:
    experiment.run_config(config, out_dir, algorithms=plain)
  if staged:
    experiment.check_config(config)
    os.makedirs(out_dir, exist_ok=True)
    run_two_stage(config, staged, out_dir)
  if not plain:  # run_config wrote the resolved config.json otherwise
    experiment.write_run_config(out_dir, config)
  # The tables cover every algorithm of the config that has saved runs
  # (a later ``--algorithms`` call adds to an earlier one).
  seeds = config.get("seeds", [0])
  done = [n for n in config["algorithms"]
          if all(os.path.exists(saved_path(config, out_dir, n, s))
                 for s in seeds)]
  histories = {}
  for name in done:
    histories[name] = []
    for seed in seeds:
      saved = load_saved(config, out_dir, name, seed)
      histories[name].append(
          history_lib.History(saved["rows"], [], saved["config"]))
  summary = experiment.summarize(histories, config.get("target_accuracy"))
  jsonio.dump_json({"name": config.get("name"), "algorithms": summary},
                   os.path.join(out_dir, "summary.json"))
  if len(seeds) > 1:  # the layout's per-run summary (run_config's for plain)
    for name in staged:
      experiment.write_summary_csv({name: summary[name]},
                                   os.path.join(out_dir, name, "summary.csv"))
  plotting.plot_mean_curves(histories, os.path.join(out_dir, "curves.png"),
                            title=config.get("name", ""))
  columns = load_columns(config, out_dir, done)
  reference = config.get("reference", REFERENCE)
  result = {"name": config.get("name"), **table3(columns, reference)}
  for name in done:
    eff = effective_clients(config, out_dir, name)
    if eff is not None:
      result["algorithms"][name]["effective_clients"] = _stat(eff)
  jsonio.dump_json(result, os.path.join(out_dir, "table3.json"))
  if reference in columns:
    plot_fig6(config, columns, os.path.join(out_dir, "fig6.png"), reference)
  print(f"target accuracy per seed (lowest best): "
        f"{result['target_accuracy']}")
  for name, e in result["algorithms"].items():
    print(f"{name:>8}: best {e['best_accuracy']['mean']:.4f} ± "
          f"{e['best_accuracy']['std']:.4f}, client loss mean "
          f"{e['late_client_loss_mean']['mean']:.4f} var "
          f"{e['late_client_loss_var']['mean']:.4f} (2nd half), rounds to "
          f"target {e['rounds_to_target']}", flush=True)


if __name__ == "__main__":
  main()
