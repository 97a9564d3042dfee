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
over rounds after the first). Writes each algorithm's histories (and
resolved configs) in the one layout of ``fedjax_agg.history``, a run per
algorithm whose members are the seeds of the call:
``<out>/<algorithm>/seed<k>/history.csv|json``, or
``<out>/<algorithm>/history.csv|json`` for one seed; then ``summary.csv``
and ``summary.json`` (one row per algorithm and seed).
"""

import argparse
import dataclasses
import json
import os
import sys

import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fedjax_agg import aggregators  # pylint: disable=wrong-import-position
from fedjax_agg import clients  # pylint: disable=wrong-import-position
from fedjax_agg import data as data_lib  # pylint: disable=wrong-import-position
from fedjax_agg import experiment  # pylint: disable=wrong-import-position
from fedjax_agg import federated  # pylint: disable=wrong-import-position
from fedjax_agg import history as history_lib
from fedjax_agg import jsonio  # pylint: disable=wrong-import-position
from fedjax_agg import models  # pylint: disable=wrong-import-position
from fedjax_agg import objectives  # pylint: disable=wrong-import-position
from fedjax_agg import partitions  # pylint: disable=wrong-import-position
from fedjax_agg import simulation  # pylint: disable=wrong-import-position
from fedjax_agg import stragglers  # pylint: disable=wrong-import-position
from fedjax_agg import validation  # pylint: disable=wrong-import-position
from fedjax_agg.config import (Evaluation, Execution,  # pylint: disable=wrong-import-position
                               LocalTraining)

ALGORITHMS = ("fedavg", "fedprox", "scaffold", "fedavg_bn", "fedbn",
              "ditto", "feddyn", "fednova", "fedavg_stragglers",
              "fednova_stragglers", "fedper", "fedrep", "apfl")


def build(name: str, training: LocalTraining, args):
  """-> (model, aggregator, local_update or None, training, personalized)."""
  plain = models.get("mlp2")
  with_bn = models.get("mlp2", batch_norm=True)
  if name == "fedavg":
    return plain, aggregators.fedavg(), None, training, False
  if name == "fedprox":
    return (plain, aggregators.fedavg(), None,
            dataclasses.replace(training,
                                objective=objectives.fedprox(args.mu)),
            False)
  if name == "scaffold":
    return (plain, clients.scaffold_aggregator(1.0),
            clients.scaffold(plain, training), training, False)
  if name == "fedavg_bn":
    return with_bn, aggregators.fedavg(), None, training, False
  if name == "fedbn":
    return (with_bn, aggregators.fedavg(), clients.fedbn(with_bn, training),
            training, True)
  if name == "ditto":
    return (plain, aggregators.fedavg(),
            clients.ditto(plain, training, lam=args.lam), training, True)
  if name == "feddyn":
    return (plain, aggregators.feddyn(args.feddyn_alpha,
                                      num_clients=args.num_clients),
            clients.feddyn(plain, training, alpha=args.feddyn_alpha),
            training, False)
  if name.startswith("fednova") or name == "fedavg_stragglers":
    if name.endswith("_stragglers"):
      # Half of each cohort stops after U{1..E s} of its E s steps.
      training = dataclasses.replace(
          training, epochs=args.straggler_epochs,
          steps_fn=stragglers.stragglers(0.5, args.straggler_epochs,
                                         unit="steps"))
    rule = (aggregators.fedavg() if name.startswith("fedavg") else
            aggregators.fednova(learning_rate=training.learning_rate))
    return plain, rule, None, training, False
  if name == "fedper":
    return (plain, aggregators.fedavg(), clients.fedper(plain, training),
            training, True)
  if name == "fedrep":
    return (plain, aggregators.fedavg(),
            clients.fedrep(plain, training, head_epochs=args.head_epochs),
            training, True)
  if name == "apfl":
    return (plain, aggregators.fedavg(),
            clients.apfl(plain, training, alpha=args.apfl_alpha), training,
            True)
  raise ValueError(f"unknown algorithm {name!r}; one of {ALGORITHMS}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=100)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
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
  args = parser.parse_args(argv)
  # Recorded relative to the repository when inside it (no machine paths).
  shown_out = experiment.shown_path(args.out)

  dataset = data_lib.load("fashion_mnist")
  training = LocalTraining(epochs=args.epochs, batch_size=args.batch_size,
                           learning_rate=args.learning_rate,
                           optimizer=optax.sgd)
  execution = Execution(progress=False)
  evaluation_base = dict(every=args.eval_every,
                         finetune_steps=args.finetune_steps)
  summary = []
  for seed in args.seeds:
    parts = partitions.REGISTRY.build(
        "dirichlet", labels=dataset.train_y, num_clients=args.num_clients,
        seed=seed, alpha=args.alpha)
    full = federated.from_partition(dataset.train_x, dataset.train_y, parts)
    train, held = validation.holdout_split(full, 0.2, seed=seed)
    fed = train.with_validation(held)
    for name in args.algorithms:
      model, rule, update, member_training, personal = build(
          name, training, args)
      config = {"algorithm": name, "dataset": "fashion_mnist",
                "data_source": dataset.source,
                "train_examples": int(dataset.train_x.shape[0]),
                "test_examples": int(dataset.test_x.shape[0]),
                "partition": {"name": "dirichlet", "alpha": args.alpha,
                              "num_clients": args.num_clients,
                              "seed": seed},
                "holdout_fraction": 0.2, "model": "mlp2" + (
                    "+bn" if name in ("fedavg_bn", "fedbn") else ""),
                "args": {**vars(args), "out": shown_out}}
      result = simulation.run(
          model, fed, (dataset.test_x, dataset.test_y), rule,
          num_rounds=args.rounds, participation=args.participation,
          training=member_training, execution=execution,
          evaluation=Evaluation(personalized=personal, **evaluation_base),
          local_update=update, seed=seed, config=config)
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
