"""Times FedBuff's host-side event scheduling against a training round.

Writes trace files for ``--clients`` N clients (profiles: one CSV row per
client, log-normal speeds and bandwidths; availability: ``--windows``
online intervals per client over a day, as a trace CSV), reads them back
with ``systems.read_profiles`` / ``systems.read_intervals`` and plans
``--steps`` server steps of the asynchronous schedule (concurrency C,
buffer K) with ``systems.plan_async``. Then times one synchronous round of
a K-client cohort of ``mlp2`` on Fashion-MNIST (Dirichlet 0.3 over 100
clients, batch 20, one epoch) with the round function every run uses
(median of ``--repeats`` rounds after the first, compiled one).

Prints one JSON line: trace writing and reading seconds, planning seconds
per step, the round's seconds and the overhead ratio (planning per step /
round).

  python experiments/bench/async_bench.py --clients 100000
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import data as data_lib
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import partitions
from fedjax_agg import rounds
from fedjax_agg import systems
from fedjax_agg.config import Execution, LocalTraining


def _write_traces(directory, num_clients, windows, rng):
  """Profile and interval CSVs for ``num_clients`` clients."""
  profiles = os.path.join(directory, "profiles.csv")
  speed = np.exp(rng.normal(np.log(100.0), 1.0, num_clients))
  up = np.exp(rng.normal(np.log(1e6), 1.0, num_clients))
  down = np.exp(rng.normal(np.log(4e6), 1.0, num_clients))
  table = np.column_stack([np.arange(num_clients), speed, up, down])
  np.savetxt(profiles, table, delimiter=",", fmt=["%d", "%.6g", "%.6g",
                                                     "%.6g"],
             header="client_id,speed,uplink,downlink", comments="")
  intervals = os.path.join(directory, "intervals.csv")
  day = 86_400.0
  # ``windows`` disjoint windows per client: sorted cut points of the day.
  cuts = np.sort(rng.uniform(0, day, (num_clients, 2 * windows)), axis=1)
  starts, ends = cuts[:, 0::2], cuts[:, 1::2]
  ids = np.repeat(np.arange(num_clients), windows)
  rows = np.column_stack([ids, starts.reshape(-1), ends.reshape(-1)])
  rows = rows[rows[:, 2] > rows[:, 1]]
  np.savetxt(intervals, rows, delimiter=",", fmt=["%d", "%.3f", "%.3f"],
             header="client_id,start_s,end_s", comments="")
  return profiles, intervals


def _round_seconds(cohort_size, repeats):
  """Median seconds of a synchronous round of ``cohort_size`` clients."""
  dataset = data_lib.load("fashion_mnist")
  parts = partitions.dirichlet(dataset.train_y, 100, seed=0, alpha=0.3)
  data = federated.from_partition(dataset.train_x, dataset.train_y, parts)
  model = models.get("mlp2", num_classes=10)
  params = model.init(jax.random.key(0))
  aggregator = aggregators.fedavg()
  round_fn = rounds.make_round_fn(
      model, aggregator, LocalTraining(batch_size=20, epochs=1,
                                       learning_rate=0.05),
      execution=Execution(progress=False))
  state = rounds.init_state(params, aggregator)
  mask = jnp.ones((cohort_size,))
  times = []
  for r in range(repeats + 1):
    cohort = rounds.sample_cohort(jax.random.key(r), 100, cohort_size)
    start = time.perf_counter()
    state, _ = round_fn(state, data, cohort, mask)
    jax.block_until_ready(state.params)
    times.append(time.perf_counter() - start)
  return statistics.median(times[1:])


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=100_000)
  p.add_argument("--windows", type=int, default=3)
  p.add_argument("--concurrency", type=int, default=100)
  p.add_argument("--buffer", type=int, default=10)
  p.add_argument("--steps", type=int, default=500)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--skip-round", action="store_true")
  args = p.parse_args(argv)
  rng = np.random.default_rng(0)
  out = {"clients": args.clients, "windows": args.windows,
         "concurrency": args.concurrency, "buffer": args.buffer,
         "steps": args.steps}
  with tempfile.TemporaryDirectory() as directory:
    start = time.perf_counter()
    profile_csv, interval_csv = _write_traces(directory, args.clients,
                                              args.windows, rng)
    out["write_traces_s"] = time.perf_counter() - start
    start = time.perf_counter()
    profiles = systems.read_profiles(profile_csv, args.clients)
    availability = systems.read_intervals(interval_csv, args.clients)
    out["read_traces_s"] = time.perf_counter() - start
  workload = systems.Workload(np.full(args.clients, 600.0), 8e5, 8e5)
  population = systems.System(profiles, availability, workload)
  start = time.perf_counter()
  plan = systems.plan_async(population, args.steps, args.concurrency,
                            args.buffer, seed=0, max_staleness=100)
  planning = time.perf_counter() - start
  out["plan_s"] = planning
  out["plan_per_step_s"] = planning / args.steps
  out["sim_time_s"] = float(plan.sim_time_s[-1])
  out["dropped"] = int(plan.dropped.sum())
  out["staleness_mean"] = float(plan.staleness.mean())
  if not args.skip_round:
    out["round_s"] = _round_seconds(args.buffer, args.repeats)
    out["overhead"] = out["plan_per_step_s"] / out["round_s"]
  print(json.dumps(out))


if __name__ == "__main__":
  main()
