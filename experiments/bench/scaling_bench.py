"""Weak scaling: one round with the client axis sharded over 1, 2, 4, 8 devices.

The cohort grows with the devices (``--clients-per-device`` clients on each,
all participating). For every device count D the same round is timed
twice: sharded over D devices (``distributed.round_mesh(D)``, params and
data replicated, clients split over the "clients" mesh axis) and on one
device; the global params after ``1 + --rounds`` rounds of both must agree
(``max_abs_diff``). Perfect weak scaling keeps ``round_s`` flat as D grows.

Workload: every client holds ``--examples`` random 28x28x1 images with
random labels of 10 classes (fixed seed), one local epoch of SGD (lr 0.01,
batch ``--batch-size``), the aggregator ``--aggregator`` (FedAvg: streamed),
the model ``--model`` (``mlp2``: 159,010 params; ``cnn_mcmahan``:
1,663,370). Round 0 (compilation) is reported apart; ``round_s`` is the
median of the ``--rounds`` timed rounds, ``samples_per_s = cohort x
examples / round_s``.

Devices: on a GPU/TPU host the real devices are used, all counts in this
process (counts above ``jax.device_count()`` are skipped). On CPU the script
re-runs itself once per count with
``XLA_FLAGS=--xla_force_host_platform_device_count=D`` (host devices share
the cores: there the table checks correctness, not speed).

  python experiments/bench/scaling_bench.py                  # 1,2,4,8
  python experiments/bench/scaling_bench.py --model cnn_mcmahan \
      --examples 600 --clients-per-device 8 --rounds 5        # GPU host

Prints one JSON line per device count, then a Markdown table.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import distributed
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg import rounds as rounds_lib

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
LEARNING_RATE = 0.01
COLUMNS = ("devices", "cohort", "first_round_s", "round_s", "samples_per_s",
           "single_device_round_s", "speedup_vs_single", "max_abs_diff")


def make_data(num_clients: int, examples: int, seed: int):
  rng = np.random.default_rng(seed)
  x = rng.random((num_clients, examples) + IMAGE_SHAPE, dtype=np.float32)
  y = rng.integers(0, NUM_CLASSES, size=(num_clients, examples))
  return federated.from_stacked(x, y)


def time_rounds(args, model, aggregator, data, devices):
  """-> (per-round seconds, final global params as numpy)."""
  mesh, device = distributed.round_mesh(devices)
  place = ((lambda tree: distributed.replicate(tree, mesh)) if mesh
           else (lambda tree: jax.device_put(tree, device)))
  round_fn = rounds_lib.make_round_fn(model, aggregator, mesh=mesh,
      donate_state=True,
      training=LocalTraining(batch_size=args.batch_size, epochs=1,
                             learning_rate=LEARNING_RATE),
      execution=Execution(clients_per_step=args.clients_per_step))
  params = model.init(jax.random.key(args.seed))
  state = place(rounds_lib.init_state(params, aggregator, args.seed))
  data = place(data)
  cohort = place(jnp.arange(data.num_clients, dtype=jnp.int32))
  mask = place(jnp.ones((data.num_clients,), jnp.float32))
  times = []
  for _ in range(1 + args.rounds):
    start = time.perf_counter()
    state, _ = round_fn(state, data, cohort, mask)
    if mesh is not None:
      state = place(state)  # keep the input shardings: no recompilation
    jax.block_until_ready(state.params)
    times.append(time.perf_counter() - start)
  return times, distributed.to_numpy(state.params)


def measure(args, num_devices: int) -> dict:
  cohort = num_devices * args.clients_per_device
  model = models.get(args.model, num_classes=NUM_CLASSES,
                     input_shape=IMAGE_SHAPE)
  options = {}
  if "num_participants" in _factory_parameters(args.aggregator):
    options["num_participants"] = cohort
  aggregator = aggregators.get(args.aggregator, num_clients=cohort,
                               **options)
  data = make_data(cohort, args.examples, args.seed)
  sharded, sharded_params = time_rounds(args, model, aggregator, data,
                                        num_devices)
  if num_devices > 1:
    single, single_params = time_rounds(args, model, aggregator, data, 1)
  else:
    single, single_params = sharded, sharded_params
  diff = max(float(np.max(np.abs(a - b))) for a, b in zip(
      jax.tree.leaves(sharded_params), jax.tree.leaves(single_params),
      strict=True))
  round_s = statistics.median(sharded[1:])
  single_s = statistics.median(single[1:])
  return {
      "devices": num_devices, "cohort": cohort,
      "first_round_s": round(sharded[0], 4), "round_s": round(round_s, 4),
      "samples_per_s": round(cohort * args.examples / round_s, 1),
      "single_device_round_s": round(single_s, 4),
      "speedup_vs_single": round(single_s / round_s, 3),
      "max_abs_diff": diff,
      "params": sum(int(np.prod(a.shape)) for a in jax.tree.leaves(
          sharded_params)),
      "model": args.model, "aggregator": args.aggregator,
      "examples_per_client": args.examples, "batch_size": args.batch_size,
      "rounds_timed": args.rounds, "backend": jax.default_backend(),
      "device_kind": jax.devices()[0].device_kind,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
  }


def _factory_parameters(name: str) -> set:
  import inspect  # pylint: disable=g-import-not-at-top
  return set(inspect.signature(aggregators.REGISTRY[name]).parameters)


def on_fresh_cpu(argv, num_devices: int) -> dict:
  """Runs ``--only D`` in a new process with D host CPU devices."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=(
      os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_"
      f"count={num_devices}").strip())
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), *argv, "--only",
       str(num_devices)], env=env, capture_output=True, text=True,
      check=False)
  if proc.returncode:
    raise SystemExit(f"D={num_devices} failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def table(rows) -> str:
  lines = ["| " + " | ".join(COLUMNS) + " |",
           "|" + "---|" * len(COLUMNS)]
  for row in rows:
    cells = [f"{row[c]:.2e}" if c == "max_abs_diff" else str(row[c])
             for c in COLUMNS]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--devices", default="1,2,4,8",
                 help="comma-separated device counts")
  p.add_argument("--clients-per-device", type=int, default=8)
  p.add_argument("--examples", type=int, default=32,
                 help="examples per client")
  p.add_argument("--batch-size", type=int, default=16)
  p.add_argument("--model", default="mlp2", choices=models.NAMES)
  p.add_argument("--aggregator", default="fedavg",
                 choices=sorted(aggregators.REGISTRY))
  p.add_argument("--clients-per-step", type=int, default=None,
                 help="vmap width (default: the engine's for the devices)")
  p.add_argument("--rounds", type=int, default=2,
                 help="timed rounds after the warm-up round")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--only", type=int, default=None,
                 help="measure this one device count in this process")
  args = p.parse_args(argv)
  if args.only is not None:
    print(json.dumps(measure(args, args.only)), flush=True)
    return
  counts = [int(c) for c in args.devices.split(",") if c.strip()]
  rows = []
  for count in counts:
    if jax.default_backend() == "cpu":
      row = on_fresh_cpu(argv, count)
    elif count > jax.device_count():
      print(f"skipping D={count}: {jax.device_count()} devices",
            file=sys.stderr)
      continue
    else:
      row = measure(args, count)
    print(json.dumps(row), flush=True)
    rows.append(row)
  print(table(rows))


if __name__ == "__main__":
  main()
