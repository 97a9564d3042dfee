"""Size and time of one run checkpoint (``fedjax_agg.checkpoint``).

For each (model, aggregator) of ``--cases``, builds the run's
``ServerState`` and a history of ``--rounds`` rows (cohort ``--cohort``),
then saves it after rounds R - ``--repeats`` .. R as ``simulation.run``
does (each save holds the history up to its round):

* ``state_mb``: bytes of the state's arrays (floats made random, as after
  training: a fresh state is mostly zeros, which compress);
* ``disk_mb``: size of one checkpoint folder on disk;
* ``blocking_ms``: time ``save`` takes before the next round can start
  (host copy, checksums, orbax's synchronous part);
* ``total_ms``: the same save waited for until the folder is final (what
  a synchronous save costs);
* ``restore_ms``: restoring it (checks included) onto the device.

Times are medians after one warm-up save. Prints one JSON line per case.

  python experiments/bench/checkpoint_bench.py
  python experiments/bench/checkpoint_bench.py --cases mlp2:fedavg
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_agg import aggregators  # noqa: E402
from fedjax_agg import checkpoint  # noqa: E402
from fedjax_agg.checkpoint import _run as checkpoint_run  # noqa: E402
from fedjax_agg import models  # noqa: E402
from fedjax_agg import rounds as rounds_lib


def folder_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f))
             for d, _, files in os.walk(path) for f in files)


def fake_history(rounds: int, cohort: int):
  rng = np.random.default_rng(0)
  rows = [{"round": r, "time_s": 0.1, "test_accuracy": float(rng.random()),
           "test_loss": float(rng.random()), "train_loss": 1.0}
          for r in range(rounds + 1)]
  client_rows = [{"round": r, "client_ids": rng.permutation(
      100)[:cohort].astype(np.int32),
                  "loss_before": rng.random(cohort, np.float32),
                  "loss_after": rng.random(cohort, np.float32),
                  "client_weights": rng.random(cohort, np.float32)}
                 for r in range(1, rounds + 1)]
  return rows, client_rows


def bench(model_name: str, aggregator_name: str, args) -> dict:
  model = models.get(model_name, num_classes=10, input_shape=(28, 28, 1))
  aggregator = aggregators.get(aggregator_name, num_clients=100,
                               **({"num_participants": args.cohort}
                                  if aggregator_name == "feddrl" else {}))
  state = rounds_lib.init_state(model.init(jax.random.key(0)), aggregator)
  # Random floats everywhere (moments, a full replay buffer): fresh states
  # are mostly zeros, which orbax's compression would make look small.
  rng = np.random.default_rng(0)
  state = jax.tree.map(
      lambda x: (rng.normal(size=x.shape).astype(x.dtype)
                 if jax.numpy.issubdtype(x.dtype, np.floating) else x),
      state)
  run_key = jax.random.key(1)
  state_bytes = sum(np.asarray(
      jax.random.key_data(x) if checkpoint_run._is_key(x) else x).nbytes  # pylint: disable=protected-access
                    for x in jax.tree.leaves(state))
  with tempfile.TemporaryDirectory() as root:
    saver = checkpoint.RunCheckpointer(root, 1, {"case": model_name},
                                       max_to_keep=2)
    blocking, total = [], []
    first = args.rounds - args.repeats
    for step in range(first, args.rounds + 1):
      rows, client_rows = fake_history(step, args.cohort)
      start = time.perf_counter()
      saver.save(step, state, run_key, rows, client_rows)
      middle = time.perf_counter()
      saver._manager.wait_until_finished()  # pylint: disable=protected-access
      end = time.perf_counter()
      if step > first:
        blocking.append(middle - start)
        total.append(end - start)
    disk = folder_bytes(os.path.join(root, str(args.rounds)))
    restores = []
    for _ in range(args.repeats):
      start = time.perf_counter()
      snapshot = saver.restore(state, run_key)
      jax.block_until_ready(snapshot.state)
      restores.append(time.perf_counter() - start)
    saver.close()
  return {"model": model_name, "aggregator": aggregator_name,
          "state_mb": round(state_bytes / 2**20, 3),
          "disk_mb": round(disk / 2**20, 3),
          "blocking_ms": round(1e3 * statistics.median(blocking), 1),
          "total_ms": round(1e3 * statistics.median(total), 1),
          "restore_ms": round(1e3 * statistics.median(restores), 1),
          "rounds_in_history": args.rounds, "cohort": args.cohort,
          "backend": jax.default_backend(), "machine": platform.machine()}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cases", default="mlp2:fedavg,cnn_mcmahan:fedavg,"
                      "cnn_mcmahan:fedadam,mlp2:feddrl")
  parser.add_argument("--rounds", type=int, default=100)
  parser.add_argument("--cohort", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  if not 0 < args.repeats < args.rounds:
    parser.error("--repeats must be in [1, --rounds)")
  for case in args.cases.split(","):
    model_name, aggregator_name = case.split(":")
    print(json.dumps(bench(model_name, aggregator_name, args)), flush=True)


if __name__ == "__main__":
  main()
