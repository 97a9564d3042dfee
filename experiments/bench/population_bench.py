"""Times building and sampling federations of 100,000+ clients.

For each population size N: every client holds 1-3 examples (uniform) of
``--features`` float32 features; the owner of every pooled example is one
int array. Reports the seconds of

* ``from_assignment``: the vectorised constructor (argsort + bincount), on
  device;
* ``from_partition``: the list-of-index-arrays constructor, given the N
  arrays (building the list itself is not counted), unless
  ``--skip-partition``;
* cohort sampling (``rounds_lib.sample_cohort``) of K clients with the
  permutation and the rejection sampler: first call (with compilation) and
  the median of ``--repeats`` further calls.

Prints one JSON line per (N, K); progress on stderr.

  python experiments/bench/population_bench.py --clients 100000 1000000
"""

import argparse
import json
import resource
import statistics
import sys
import time

import jax
import numpy as np

from fedjax_agg import federated
from fedjax_agg import rounds as rounds_lib


def _seconds(fn, *args):
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - start, out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, nargs="+",
                 default=[100_000, 1_000_000])
  p.add_argument("--cohorts", type=int, nargs="+", default=[100, 10_000])
  p.add_argument("--features", type=int, default=5)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--skip-partition", action="store_true")
  args = p.parse_args(argv)
  for num_clients in args.clients:
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 4, size=num_clients)
    owner = np.repeat(np.arange(num_clients), sizes)
    rng.shuffle(owner)
    x = rng.random((owner.size, args.features), dtype=np.float32)
    y = rng.integers(0, 10, size=owner.size)
    assign_s, data = _seconds(federated.from_assignment, x, y, owner,
                              num_clients)
    partition_s = None
    if not args.skip_partition:
      order = np.argsort(owner, kind="stable")
      parts = np.split(order, np.cumsum(sizes)[:-1])
      partition_s, _ = _seconds(federated.from_partition, x, y, parts)
      del parts
    print(f"N={num_clients}: from_assignment {assign_s:.3f}s, "
          f"from_partition {partition_s}", file=sys.stderr, flush=True)
    for cohort in args.cohorts:
      row = {"clients": num_clients, "examples": int(owner.size),
             "cohort": cohort, "from_assignment_s": round(assign_s, 4),
             "from_partition_s": (None if partition_s is None
                                  else round(partition_s, 4))}
      for method in ("permutation", "rejection"):
        keys = jax.random.split(jax.random.key(1), args.repeats + 1)
        draw = (data.num_clients, cohort, method)
        first_s, ids = _seconds(rounds_lib.sample_cohort, keys[0], *draw)
        assert len(set(np.asarray(ids).tolist())) == cohort
        times = [_seconds(rounds_lib.sample_cohort, k, *draw)[0]
                 for k in keys[1:]]
        row[f"{method}_first_s"] = round(first_s, 4)
        row[f"{method}_s"] = round(statistics.median(times), 5)
      row["peak_rss_mb"] = round(
          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
      row["backend"] = jax.default_backend()
      print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
