"""Round time and peak memory vs cohort size: streaming vs stacked FedAvg.

One FedAvg round (``rounds_lib.make_round_fn``) of the 2-layer MLP
(``models.get("mlp2")``: 784-200-10 on Fashion-MNIST, 60-200-10 on
Synthetic(1,1)) over cohorts of K = 10, 100, 1,000 and 10,000 clients, run
two ways:

* ``stream``: the aggregator's streaming form (``engine.make_local_reducer``)
  keeps a running sum over the clients trained so far; client models exist
  for one chunk of ``clients_per_step`` clients at a time;
* ``stacked``: the trained models of the whole cohort are stacked [K, ...]
  (``engine.make_local_trainer``) and then averaged.

Workload: a population of N = max(K) clients, each holding
``--examples-per-client`` examples (Fashion-MNIST: drawn at random from the
60,000 training images, so clients may share images; Synthetic(1,1):
FedProx's generator with every device of the same size); the cohort is the
first K clients; one local epoch of SGD (batch ``--batch-size``, lr 0.05);
losses before and after training are computed (as in a simulation run).

Every (K, mode, clients_per_step) runs in a fresh subprocess, so the peak
resident memory (``resource.getrusage(...).ru_maxrss``) is that run's alone.
The table gives: the warm-up round (compilation included); the median of
``--rounds`` timed rounds; samples/s = K * examples / round; the process's
RSS before the first round (data and model on device, round compiled) and
its peak; and XLA's own account of the compiled round (temp, argument and
output bytes, ``compiled.memory_analysis()``). A run whose XLA estimate
exceeds ``--max-gb`` is compiled but not executed ("skipped").

  python experiments/bench/cohort_bench.py            # the default grid
  python experiments/bench/cohort_bench.py --sizes 10 100 --rounds 1
  python experiments/bench/cohort_bench.py --data synthetic
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

MODES = ("stream", "stacked")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", type=int, nargs="+",
                      default=[10, 100, 1000, 10000], help="cohort sizes K")
  parser.add_argument("--modes", nargs="+", choices=MODES,
                      default=list(MODES))
  parser.add_argument("--clients-per-step", type=int, default=8,
                      help="W for the cohort-size sweep")
  parser.add_argument("--sweep-size", type=int, default=1000,
                      help="the K at which clients_per_step is varied")
  parser.add_argument("--sweep-widths", type=int, nargs="*",
                      default=[2, 32, 128],
                      help="the other clients_per_step values tried there")
  parser.add_argument("--data", choices=("fmnist", "synthetic"),
                      default="fmnist")
  parser.add_argument("--examples-per-client", type=int, default=20)
  parser.add_argument("--batch-size", type=int, default=10)
  parser.add_argument("--rounds", type=int, default=2,
                      help="timed rounds after the warm-up round")
  parser.add_argument("--max-gb", type=float, default=6.0,
                      help="skip executing runs whose XLA estimate (temp + "
                      "arguments + outputs) exceeds this")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", help="also append the JSON lines here")
  parser.add_argument("--worker", action="store_true",
                      help=argparse.SUPPRESS)
  parser.add_argument("--clients", type=int, help=argparse.SUPPRESS)
  parser.add_argument("--population", type=int, help=argparse.SUPPRESS)
  parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
  return parser.parse_args(argv)


# ---------------------------------------------------------------- worker


def current_rss_mb() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024.0
  return float("nan")


def peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def federation(args):
  """(FederatedData, model) for a population of ``args.population``."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from fedjax_agg import data as data_lib  # pylint: disable=g-import-not-at-top
  from fedjax_agg import federated  # pylint: disable=g-import-not-at-top
  from fedjax_agg import models  # pylint: disable=g-import-not-at-top
  population, per_client = args.population, args.examples_per_client
  rng = np.random.default_rng(args.seed)
  if args.data == "fmnist":
    dataset = data_lib.load("fashion_mnist")
    x, y = dataset.train_x, dataset.train_y
    parts = rng.integers(0, x.shape[0], (population, per_client))
    input_shape = None
  else:
    # Equal device sizes: LogNormal(0, 0) = 1, plus min_size, 80% train.
    fed = data_lib.synthetic(
        1.0, 1.0, num_clients=population, seed=args.seed,
        size_log_mean=0.0, size_log_sigma=0.0,
        min_size=int(round(per_client / 0.8)) - 1)
    x, y = fed.dataset.train_x, fed.dataset.train_y
    parts = fed.train_indices
    input_shape = fed.dataset.input_shape
  data = federated.from_partition(x, y, list(parts))
  return data, models.get("mlp2", 10, input_shape=input_shape)


def worker(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_agg import aggregators  # pylint: disable=g-import-not-at-top
  from fedjax_agg import rounds as rounds_lib  # pylint: disable=g-import-not-at-top
  from fedjax_agg.config import Execution, LocalTraining  # pylint: disable=g-import-not-at-top

  data, model = federation(args)
  rule = aggregators.fedavg()
  round_fn = rounds_lib.make_round_fn(model, rule,
      training=LocalTraining(batch_size=args.batch_size, epochs=1,
                             learning_rate=0.05),
      execution=Execution(clients_per_step=args.clients_per_step,
                          stream=args.mode == "stream"))
  state = rounds_lib.init_state(model.init(jax.random.key(args.seed)), rule,
                                seed=args.seed)
  cohort = jnp.arange(args.clients, dtype=jnp.int32)
  mask = jnp.ones((args.clients,), jnp.float32)
  start = time.perf_counter()
  compiled = round_fn.lower(state, data, cohort, mask).compile()
  compile_s = time.perf_counter() - start
  memory = compiled.memory_analysis()
  row = {
      "clients": args.clients, "mode": args.mode,
      "clients_per_step": args.clients_per_step, "data": args.data,
      "examples_per_client": args.examples_per_client,
      "batch_size": args.batch_size,
      "params": sum(a.size for a in jax.tree.leaves(state.params)),
      "compile_s": round(compile_s, 3),
      "xla_temp_mb": memory.temp_size_in_bytes / 2**20,
      "xla_argument_mb": memory.argument_size_in_bytes / 2**20,
      "xla_output_mb": memory.output_size_in_bytes / 2**20,
      "rss_before_round_mb": current_rss_mb(),
      "backend": jax.default_backend(), "cpus": os.cpu_count(),
      "python": platform.python_version(), "jax": jax.__version__,
  }
  needed_gb = (memory.temp_size_in_bytes + memory.argument_size_in_bytes
               + memory.output_size_in_bytes) / 2**30
  if needed_gb > args.max_gb:
    row.update(skipped=f"XLA needs {needed_gb:.1f} GB > --max-gb "
               f"{args.max_gb:g}", peak_rss_mb=peak_rss_mb())
    return row
  times = []
  for _ in range(1 + args.rounds):
    start = time.perf_counter()
    state, out = compiled(state, data, cohort, mask)
    jax.block_until_ready((state.params, out))
    times.append(time.perf_counter() - start)
  round_s = statistics.median(times[1:]) if args.rounds else times[0]
  row.update(
      first_round_s=round(times[0], 4), round_s=round(round_s, 4),
      round_s_all=[round(t, 4) for t in times[1:]],
      samples_per_s=round(args.clients * args.examples_per_client
                          / round_s, 1),
      train_loss=float(out.train_loss), peak_rss_mb=peak_rss_mb())
  return row


# ---------------------------------------------------------------- driver


def run_one(args, clients: int, mode: str, width: int,
            population: int) -> dict:
  command = [sys.executable, os.path.abspath(__file__), "--worker",
             "--clients", str(clients), "--mode", mode,
             "--clients-per-step", str(width), "--population",
             str(population), "--data", args.data, "--examples-per-client",
             str(args.examples_per_client), "--batch-size",
             str(args.batch_size), "--rounds", str(args.rounds), "--max-gb",
             str(args.max_gb), "--seed", str(args.seed)]
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
      p for p in (root, env.get("PYTHONPATH")) if p)
  proc = subprocess.run(command, env=env, capture_output=True, text=True,
                        check=False)
  lines = [line for line in proc.stdout.splitlines()
           if line.startswith("{")]
  if proc.returncode != 0 or not lines:
    tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
    return {"clients": clients, "mode": mode, "clients_per_step": width,
            "failed": f"exit {proc.returncode}: {tail[0][:200]}"}
  return json.loads(lines[-1])


def _cell(row, key, fmt):
  value = row.get(key)
  return "-" if value is None else format(value, fmt)


def print_table(rows):
  header = ("| K | mode | W | first round s | round s | samples/s | "
            "RSS before MB | peak RSS MB | XLA temp MB | XLA args MB | "
            "XLA out MB | note |")
  print(header)
  print("|" + "---|" * (header.count("|") - 1))
  for row in rows:
    note = row.get("skipped") or row.get("failed") or ""
    print(f"| {row['clients']:,} | {row['mode']} | "
          f"{row['clients_per_step']} | "
          f"{_cell(row, 'first_round_s', '.2f')} | "
          f"{_cell(row, 'round_s', '.3f')} | "
          f"{_cell(row, 'samples_per_s', ',.0f')} | "
          f"{_cell(row, 'rss_before_round_mb', ',.0f')} | "
          f"{_cell(row, 'peak_rss_mb', ',.0f')} | "
          f"{_cell(row, 'xla_temp_mb', ',.1f')} | "
          f"{_cell(row, 'xla_argument_mb', ',.1f')} | "
          f"{_cell(row, 'xla_output_mb', ',.2f')} | {note} |", flush=True)


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    print(json.dumps(worker(args)), flush=True)
    return
  # One population for every run (the largest cohort's), so that the
  # data are the same whatever K.
  population = max(args.sizes + [args.sweep_size])
  plan = [(k, mode, args.clients_per_step) for k in args.sizes
          for mode in args.modes]
  plan += [(args.sweep_size, mode, width) for width in args.sweep_widths
           for mode in args.modes]
  rows = []
  for clients, mode, width in plan:
    print(f"running K={clients} {mode} W={width}", file=sys.stderr,
          flush=True)
    row = run_one(args, clients, mode, width, population)
    rows.append(row)
    print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
      with open(args.json, "a") as f:
        f.write(json.dumps(row) + "\n")
  print_table(rows)


if __name__ == "__main__":
  main()
