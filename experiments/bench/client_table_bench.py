"""Times SCAFFOLD rounds with the per-client table on the device or in host
memory, up to populations whose table does not fit in memory.

The state per client is SCAFFOLD's control variate: one mlp2-sized model
(159,010 float32 parameters, 0.64 MB), so the full table is N x 0.64 MB
(64 GB for N = 100,000). Every client holds ``--examples`` examples drawn
from a pool of random 28x28 images (shared pool, so the data's memory does
not grow with N); K = ``--cohort`` clients per round, 1 local epoch.

For each (placement, N): the first round (with compilation) and the median
of ``--rounds`` further rounds, the table's full size, and for a
file-backed host table the disk it actually takes (a sparse file: rows
never written take none). One JSON line per run.

  python experiments/bench/client_table_bench.py \
      --runs device:1000 host:1000 file:1000 file:100000
"""

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fedjax_agg import clients  # pylint: disable=wrong-import-position
from fedjax_agg import models  # pylint: disable=wrong-import-position
from fedjax_agg import rounds  # pylint: disable=wrong-import-position
from fedjax_agg.config import Execution  # pylint: disable=wrong-import-position
from fedjax_agg.config import LocalTraining  # pylint: disable=wrong-import-position
from fedjax_agg.federated import FederatedData  # pylint: disable=wrong-import-position


def population(num_clients: int, examples: int, pool: int, seed: int = 0
               ) -> FederatedData:
  rng = np.random.default_rng(seed)
  x = rng.random((pool, 28, 28, 1), np.float32)
  y = rng.integers(0, 10, pool).astype(np.int32)
  indices = rng.integers(0, pool, (num_clients, examples)).astype(np.int32)
  return FederatedData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(indices),
                       jnp.full((num_clients,), examples, jnp.int32))


def time_rounds(placement: str, num_clients: int, args) -> dict:
  model = models.get("mlp2")
  training = LocalTraining(epochs=1, batch_size=args.batch_size,
                           learning_rate=0.05)
  path = None
  if placement == "file":
    handle, path = tempfile.mkstemp(suffix=".table", dir=args.dir)
    os.close(handle)
  update = clients.scaffold(
      model, training, placement="device" if placement == "device" else
      "host", path=path)
  rule = clients.scaffold_aggregator(1.0)
  data = population(num_clients, args.examples, args.pool)
  params = model.init(jax.random.key(0))
  state = rounds.init_state(params, rule,
                            client_state=update.init(num_clients))
  round_fn = rounds.make_round_fn(
      model, rule, training, execution=Execution(progress=False),
      local_update=update, donate_state=True)
  mask = jnp.ones((args.cohort,), jnp.float32)
  times = []
  for r in range(args.rounds + 1):
    cohort = rounds.sample_cohort(jax.random.key(r), num_clients,
                                  args.cohort)
    start = time.perf_counter()
    state, _ = round_fn(state, data, cohort, mask)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - start)
  table = state.client_state.controls
  full_bytes = (table.store.nbytes if placement != "device" else
                sum(leaf.nbytes for leaf in jax.tree.leaves(table.rows)))
  result = {"placement": placement, "num_clients": num_clients,
            "cohort": args.cohort, "examples_per_client": args.examples,
            "first_round_s": times[0],
            "median_round_s": statistics.median(times[1:]),
            "table_full_gb": full_bytes / 1e9,
            "clients_written": int(np.sum(np.asarray(table.seen))),
            "max_rss_gb": resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1e6}
  if path is not None:
    result["file_disk_gb"] = os.stat(path).st_blocks * 512 / 1e9
    del state, table, update
    os.remove(path)
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--runs", nargs="+",
                      default=["device:1000", "host:1000", "file:1000",
                               "file:100000"],
                      help="placement:N, placement one of device, host, "
                      "file")
  parser.add_argument("--cohort", type=int, default=10)
  parser.add_argument("--examples", type=int, default=64)
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--pool", type=int, default=10000)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--dir", default=None,
                      help="folder of the file-backed tables (default: the "
                      "system's temporary folder)")
  args = parser.parse_args(argv)
  for run in args.runs:
    placement, count = run.split(":")
    if placement not in ("device", "host", "file"):
      parser.error(f"--runs: placement must be device, host or file, got "
                   f"{placement!r}")
    print(json.dumps(time_rounds(placement, int(count), args)), flush=True)


if __name__ == "__main__":
  main()
