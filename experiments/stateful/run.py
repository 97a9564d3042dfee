"""Stateful clients under strong label skew: FedAvg, FedProx, SCAFFOLD,
FedBN, Ditto, FedDyn, FedNova (with and without stragglers), FedPer, FedRep
and APFL on Fashion-MNIST, Dirichlet alpha = 0.1 over 100 clients.

  python experiments/stateful/run.py                 # the committed run
  python experiments/stateful/run.py --rounds 5 --seeds 0 --out /tmp/s

Every client holds out 20 % of its examples (seeded). Recorded per
algorithm and seed: the global model's test accuracy, its mean accuracy on
the clients' held-out splits, the personalised accuracy (Ditto's personal
models, FedBN's global model with the client's BatchNorm leaves) and the
global model fine-tuned for ``--finetune-steps`` local steps on each
client, mean and spread across clients; the wall time of a round (median
over rounds after the first). Writes each algorithm's histories in the
one layout of ``fedjax_agg.history``, a run per algorithm whose members
are the seeds of the call: ``<out>/<algorithm>/seed<k>/history.csv|json``,
or ``<out>/<algorithm>/history.csv|json`` for one seed, beside
``<out>/<algorithm>/config.json`` (the algorithm's experiment config,
every default written out, and its provenance); then ``summary.csv`` and
``summary.json`` (one row per algorithm and seed). ``--tables-only``
prints the RESULTS.md table from ``summary.json``.

Every run is described by one experiment config (``study_config``) and
built by ``experiment.build``; ``build_run`` adds what the format cannot
say (SCAFFOLD's server rule, stragglers counted in local steps).
"""

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fedjax_agg import clients  # pylint: disable=wrong-import-position
from fedjax_agg import experiment  # pylint: disable=wrong-import-position
from fedjax_agg import history as history_lib  # pylint: disable=wrong-import-position
from fedjax_agg import jsonio  # pylint: disable=wrong-import-position
from fedjax_agg import simulation  # pylint: disable=wrong-import-position
from fedjax_agg import stragglers  # pylint: disable=wrong-import-position

ALGORITHMS = ("fedavg", "fedprox", "scaffold", "fedavg_bn", "fedbn",
              "ditto", "feddyn", "fednova", "fedavg_stragglers",
              "fednova_stragglers", "fedper", "fedrep", "apfl")
# Every client's held-out share (seeded by the run's seed).
HOLDOUT_FRACTION = 0.2
# The runs with stragglers: this share of each cohort stops after
# U{1..E s} of its E s local steps.
STRAGGLER_FRACTION = 0.5
# SCAFFOLD's server step (Eq. (c): x + eta_g (uniform mean of y_i - x)).
SCAFFOLD_SERVER_LR = 1.0


def algorithm_specs(args) -> dict:
  """``ALGORITHMS`` as entries of an experiment config's "algorithms"."""
  personal = {"train": {"personalized": True}}
  stragglers_train = {"train": {"local_epochs": args.straggler_epochs,
                                "stragglers": STRAGGLER_FRACTION}}
  return {
      "fedavg": {"aggregator": "fedavg"},
      "fedprox": {"aggregator": "fedavg", "objective": "fedprox",
                  "objective_args": {"mu": args.mu}},
      # The server rule is given ready (``build_run``): uniform FedAvg
      # then a server SGD step, which the format cannot compose.
      "scaffold": {"aggregator": "fedavg",
                   "aggregator_args": {"weighting": "uniform"},
                   "client": "scaffold"},
      "fedavg_bn": {"aggregator": "fedavg",
                    "model_args": {"batch_norm": True}},
      "fedbn": {"aggregator": "fedavg", "client": "fedbn",
                "model_args": {"batch_norm": True}, **personal},
      "ditto": {"aggregator": "fedavg", "client": "ditto",
                "client_args": {"lam": args.lam}, **personal},
      "feddyn": {"aggregator": "feddyn",
                 "aggregator_args": {"alpha": args.feddyn_alpha},
                 "client": "feddyn",
                 "client_args": {"alpha": args.feddyn_alpha}},
      "fednova": {"aggregator": "fednova"},
      "fedavg_stragglers": {"aggregator": "fedavg", **stragglers_train},
      "fednova_stragglers": {"aggregator": "fednova", **stragglers_train},
      "fedper": {"aggregator": "fedavg", "client": "fedper", **personal},
      "fedrep": {"aggregator": "fedavg", "client": "fedrep",
                 "client_args": {"head_epochs": args.head_epochs},
                 **personal},
      "apfl": {"aggregator": "fedavg", "client": "apfl",
               "client_args": {"alpha": args.apfl_alpha}, **personal},
  }


def study_config(args) -> dict:
  """The study as one experiment config (``fedjax_agg.experiment``): the
  algorithms of ``args.algorithms`` on Fashion-MNIST, Dirichlet(alpha)
  over ``args.num_clients`` clients, each holding out
  ``HOLDOUT_FRACTION``; mlp2, plain SGD."""
  specs = algorithm_specs(args)
  return {
      "name": "stateful",
      "dataset": {"name": "fashion_mnist"},
      "partition": {"name": "dirichlet", "num_clients": args.num_clients,
                    "args": {"alpha": args.alpha},
                    "holdout_fraction": HOLDOUT_FRACTION},
      "model": {"name": "mlp2"},
      "train": {"rounds": args.rounds, "participation": args.participation,
                "local_epochs": args.epochs, "batch_size": args.batch_size,
                "learning_rate": args.learning_rate, "optimizer": "sgd",
                "eval_every": args.eval_every,
                "finetune_steps": args.finetune_steps},
      "algorithms": {name: specs[name] for name in args.algorithms},
      "seeds": list(args.seeds),
  }


def build_run(config: dict, name: str, prepared) -> experiment.Built:
  """Algorithm ``name`` of ``config`` built for one seed's data
  (``experiment.build``), with what the config format cannot say:
  SCAFFOLD's server rule and the stragglers' budgets in steps.
  -> ``Built`` (its options record the changes)."""
  spec = config["algorithms"][name]
  notes = {}
  aggregator = None
  if spec.get("client") == "scaffold":
    # Uniform FedAvg followed by a server SGD step of SCAFFOLD_SERVER_LR:
    # a rule wrapped in a server optimizer, which a config cannot name.
    aggregator = clients.scaffold_aggregator(SCAFFOLD_SERVER_LR)
    notes["server_rule"] = (
        f"clients.scaffold_aggregator({SCAFFOLD_SERVER_LR})")
  built = experiment.build(config, name, prepared, aggregator=aggregator)
  training = built.options.training
  if training.steps_fn is not None:
    # The stragglers' budgets count local steps (U{1..E s}), a unit the
    # format's "stragglers" (whole epochs) does not have.
    fraction = experiment.check_config(config).train_of(name).stragglers
    training = dataclasses.replace(training, steps_fn=stragglers.stragglers(
        fraction, training.epochs, unit="steps"))
    notes["stragglers_unit"] = "steps"
  return built._replace(options=built.options.replace(
      training=training, config={**built.options.config, **notes}))


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=100)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
  parser.add_argument("--tables-only", action="store_true",
                      help="print the results table from --out's "
                      "summary.json (no runs)")
  parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS),
                      choices=ALGORITHMS)
  parser.add_argument("--alpha", type=float, default=0.1)
  parser.add_argument("--num-clients", type=int, default=100)
  parser.add_argument("--participation", type=float, default=0.1)
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--learning-rate", type=float, default=0.05)
  parser.add_argument("--mu", type=float, default=0.01, help="FedProx mu")
  parser.add_argument("--lam", type=float, default=0.5, help="Ditto lambda")
  parser.add_argument("--feddyn-alpha", type=float, default=0.01)
  parser.add_argument("--straggler-epochs", type=int, default=2,
                      help="local epochs of the runs with stragglers")
  parser.add_argument("--head-epochs", type=int, default=2,
                      help="FedRep's head epochs per round")
  parser.add_argument("--apfl-alpha", type=float, default=0.5,
                      help="APFL's initial mixing weight")
  parser.add_argument("--finetune-steps", type=int, default=5)
  parser.add_argument("--eval-every", type=int, default=10)
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  return parser.parse_args(argv)


def table(summary: dict) -> str:
  """The RESULTS.md table from ``summary.json``: per algorithm, mean ±
  population sd over its seeds (ddof 0, as every table of the project)
  of the global model's test accuracy, its held-out accuracy, the
  personal models' and the fine-tuned model's, and the mean of the runs'
  median seconds per round."""
  runs = {}
  for entry in summary["runs"]:
    runs.setdefault(entry["algorithm"], []).append(entry)
  columns = ("test_accuracy", "heldout_global_mean", "personal_mean",
             "finetuned_mean")
  rows = ["| algorithm | test acc. (global) | held-out, global model | "
          "held-out, personal model | held-out, global + 5 local steps | "
          "s / round (shared machine) |", "|---|---|---|---|---|---|"]
  for name in [n for n in ALGORITHMS if n in runs]:
    cells = [name]
    for column in columns:
      values = [e[column] for e in runs[name] if e.get(column) is not None
                and np.isfinite(e[column])]
      cells.append(f"{np.mean(values):.3f} ± {np.std(values):.3f}"
                   if values else "—")
    cells.append(f"{np.mean([e['round_time_s'] for e in runs[name]]):.3g}")
    rows.append("| " + " | ".join(cells) + " |")
  return "\n".join(rows) + "\n"


def main(argv=None):
  args = parse_args(argv)
  if args.tables_only:
    with open(os.path.join(args.out, "summary.json")) as f:
      print(table(json.load(f)), end="")
    return
  # Recorded relative to the repository when inside it (no machine paths).
  shown_out = experiment.shown_path(args.out)
  command = [experiment.shown_path(sys.argv[0])] + sys.argv[1:]
  config = study_config(args)
  experiment.check_config(config)
  dataset = experiment.load_dataset(config)
  for name in args.algorithms:
    # Each algorithm's config and provenance beside its histories (a call
    # with --algorithms leaves the others' as they are).
    os.makedirs(os.path.join(args.out, name), exist_ok=True)
    experiment.write_run_config(
        os.path.join(args.out, name),
        {**config, "algorithms": {name: config["algorithms"][name]}},
        dataset=dataset, execution={"out": shown_out}, command=command)
  summary = []
  for seed in args.seeds:
    prepared = experiment.prepare_data(config, seed, dataset)
    for name in args.algorithms:
      built = build_run(config, name, prepared)
      result = simulation.run(*built[:4], built.options.replace(config={
          **built.options.config, "data_source": dataset.source,
          "args": {**vars(args), "out": shown_out}}), seed=seed)
      result.history.save(history_lib.member_folder(
          os.path.join(args.out, name), f"seed{seed}", len(args.seeds)))
      rows = result.history.rows
      last = rows[-1]
      times = [row["time_s"] for row in rows[2:]]
      entry = {"algorithm": name, "seed": seed,
               "test_accuracy": last["test_accuracy"],
               "heldout_global_mean": last.get("global_accuracy_mean",
                                               float("nan")),
               "heldout_global_std": last.get("global_accuracy_std",
                                              float("nan")),
               "finetuned_mean": last.get("finetuned_accuracy_mean",
                                          float("nan")),
               "finetuned_std": last.get("finetuned_accuracy_std",
                                         float("nan")),
               "personal_mean": last.get("personal_accuracy_mean",
                                         float("nan")),
               "personal_std": last.get("personal_accuracy_std",
                                        float("nan")),
               "round_time_s": float(np.median(times)) if times else
                               float("nan")}
      summary.append(entry)
      print(json.dumps(entry), flush=True)
  # Runs of other algorithms or seeds already in the summary stay there
  # (an invocation with --algorithms adds its rows).
  path = os.path.join(args.out, "summary.json")
  kept, invocations = [], []
  if os.path.exists(path):
    with open(path) as f:
      previous = json.load(f)
    done = {(e["algorithm"], e["seed"]) for e in summary}
    kept = [{k: float("nan") if v is None else v for k, v in e.items()}
            for e in previous["runs"]
            if (e["algorithm"], e["seed"]) not in done]
    invocations = previous.get("invocations", [previous.get("args")])
  summary = kept + summary
  jsonio.dump_json({"runs": summary, "invocations": invocations + [
      {**vars(args), "out": shown_out}]}, path)
  lines = [",".join(summary[0])] + [
      ",".join(str(v) for v in entry.values()) for entry in summary]
  jsonio.write_text(os.path.join(args.out, "summary.csv"),
                    "\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
