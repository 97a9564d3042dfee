"""Times S seeds as one vmapped sweep against S runs one after the other.

Workload: FedAvg with the 2-layer MLP (``mlp2``, 784-200-10) on
Fashion-MNIST (the IDX files; ``--max-train-examples`` keeps the first M
training images), ``partitions.shards`` over ``--clients`` clients (2
shards each, drawn once with seed 0 and shared by every seed), C =
``--participation``, E = ``--epochs``, B = ``--batch-size``, SGD at
``--lr``; test accuracy every round, no per-client evaluation.

* ``sequential``: ``simulation.run(seed=s)`` for each of the S seeds;
* ``sweep``: ``sweep.run_sweep`` with the same S seeds (one vmapped,
  jitted round for all S members per round).

Reported per mode: wall time of the whole thing (compilation, rounds,
evaluation), the first rounds' time (compilation included; summed over the
S runs for ``sequential``) and the median time of a later round (for
``sequential`` the S runs' medians added: the time to advance all S
members by one round). Also the largest difference between the two modes'
test accuracies and final params (float reordering only).

  python experiments/bench/sweep_bench.py --seeds 4
  python experiments/bench/sweep_bench.py --seeds 4 --max-train-examples 6000

Prints one JSON line on stdout.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import jax  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position

from fedjax_agg import aggregators  # noqa: E402  pylint: disable=wrong-import-position
from fedjax_agg import data as data_lib  # noqa: E402  pylint: disable=wrong-import-position
from fedjax_agg import federated  # noqa: E402  pylint: disable=wrong-import-position
from fedjax_agg import models  # noqa: E402  pylint: disable=wrong-import-position
from fedjax_agg import partitions  # noqa: E402  pylint: disable=wrong-import-position
from fedjax_agg import simulation  # noqa: E402  pylint: disable=wrong-import-position
from fedjax_agg import sweep  # noqa: E402  pylint: disable=wrong-import-position
from fedjax_agg import rounds as rounds_lib
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seeds", type=int, default=4, help="S")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--clients", type=int, default=100)
  parser.add_argument("--participation", type=float, default=0.1)
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--batch-size", type=int, default=10)
  parser.add_argument("--lr", type=float, default=0.05)
  parser.add_argument("--max-train-examples", type=int, default=None)
  parser.add_argument("--clients-per-step", type=int, default=None)
  args = parser.parse_args(argv)

  ds = data_lib.load("fashion_mnist", source="files")
  train_x, train_y = ds.train_x, ds.train_y
  if args.max_train_examples:
    train_x = train_x[:args.max_train_examples]
    train_y = train_y[:args.max_train_examples]
  indices = partitions.shards(train_y, num_clients=args.clients, seed=0,
                              shards_per_client=2)
  data = federated.from_partition(train_x, train_y, indices)
  model = models.get("mlp2", num_classes=ds.num_classes,
                     input_shape=ds.input_shape)
  seeds = list(range(args.seeds))
  train = dict(
      num_rounds=args.rounds, participation=args.participation,
      training=LocalTraining(epochs=args.epochs, batch_size=args.batch_size,
                             learning_rate=args.lr),
      execution=Execution(clients_per_step=args.clients_per_step,
                          progress=False),
      evaluation=Evaluation(clients=False))
  test = (ds.test_x, ds.test_y)

  def round_times(history):
    return [row["time_s"] for row in history.rows[1:]]

  print("sequential ...", file=sys.stderr, flush=True)
  start = time.perf_counter()
  solo = [simulation.run(model, data, test, aggregators.fedavg(), seed=s,
      **train) for s in seeds]
  sequential_s = time.perf_counter() - start

  print("sweep ...", file=sys.stderr, flush=True)
  start = time.perf_counter()
  members = sweep.run_sweep(lambda hparams: aggregators.fedavg(), seeds=seeds,
      model=model, data=data, test_data=test, **train)
  sweep_s = time.perf_counter() - start

  accuracy_diff = max(
      float(np.max(np.abs(m.history.column("test_accuracy")
                          - r.history.column("test_accuracy"))))
      for m, r in zip(members, solo, strict=True))
  params_diff = max(
      float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
      for m, r in zip(members, solo, strict=True)
      for a, b in zip(jax.tree.leaves(m.state.params),
                      jax.tree.leaves(r.state.params), strict=True))
  later = lambda times: statistics.median(times[1:]) if len(times) > 1 \
      else float("nan")
  cohort = rounds_lib.num_sampled(args.clients, args.participation)
  print(json.dumps({
      "bench": "sweep", "seeds": args.seeds, "rounds": args.rounds,
      "clients": args.clients, "cohort": cohort, "epochs": args.epochs,
      "batch_size": args.batch_size,
      "train_examples": int(train_x.shape[0]),
      "sequential_total_s": round(sequential_s, 2),
      "sweep_total_s": round(sweep_s, 2),
      "speedup_total": round(sequential_s / sweep_s, 2),
      "sequential_first_round_s": round(
          sum(round_times(r.history)[0] for r in solo), 2),
      "sweep_first_round_s": round(round_times(members[0].history)[0], 2),
      "sequential_round_s": round(
          sum(later(round_times(r.history)) for r in solo), 3),
      "sweep_round_s": round(later(round_times(members[0].history)), 3),
      "final_test_accuracy": [r.history.rows[-1]["test_accuracy"]
                              for r in solo],
      "max_test_accuracy_diff": accuracy_diff,
      "max_final_params_diff": params_diff,
      "backend": jax.default_backend(), "devices": jax.device_count(),
      "cpu_count": os.cpu_count(), "machine": platform.machine(),
      "jax": jax.__version__}))


if __name__ == "__main__":
  main()
