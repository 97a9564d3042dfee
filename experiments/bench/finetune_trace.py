"""Where FedIT's local-training call spends its time, op by op.

  python experiments/bench/finetune_trace.py                 # 10 clients
  python experiments/bench/finetune_trace.py --clients 100 --top 12

Compiles the engine's local training of ``finetune_bench.py``'s workload
(K clients, chunks of ``--clients-per-step``), times the compiled call
alone (median of 5), then records ``jax.profiler`` traces of 3 calls and
sums each XLA op's time, read from the trace's events and matched to the
optimised HLO by name. Prints one JSON line: the call's wall time, the
ops' summed time (over both of XLA's threads, so more than the wall
time), the shares of the frozen base's products, attention, the
adapters' rank-r products, copies/transposes and the rest, and the
``--top`` slowest ops with their shapes and source. ``--peak`` prints
instead the rate of lone jitted float32 products on this machine (the
base's shapes and 2048^3): the ceiling of the round's products.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# pylint: disable=wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

import finetune_bench
from fedjax_agg import engine
from fedjax_agg import federated
from fedjax_agg.config import LocalTraining
from fedjax_agg.models import lora
# pylint: enable=wrong-import-position

CALLS = 3


def compiled_call(num_clients: int, clients_per_step):
  """(the compiled local-training call, its arguments)."""
  base, x, y, _ = finetune_bench.workload(num_clients)
  model = lora.lora(base.model, base.variables, rank=finetune_bench.RANK,
                    key=jax.random.key(0),
                    targets=list(lora.TRANSFORMER_TARGETS))
  rows = finetune_bench.ROWS
  data = federated.from_partition(
      x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]),
      list(np.arange(num_clients * rows).reshape(num_clients, rows)))
  train = engine.make_local_trainer(
      model, LocalTraining(epochs=1, batch_size=finetune_bench.BATCH,
                           compute_losses=False),
      clients_per_step=clients_per_step)
  args = (model.init(jax.random.key(0)), data, jnp.arange(num_clients),
          jnp.full((num_clients,), finetune_bench.LEARNING_RATE),
          jnp.full((num_clients,), 3, jnp.int32), jax.random.key(1))
  return jax.jit(train).lower(*args).compile(), args


def op_times(compiled, args) -> dict:
  """XLA op name -> microseconds per call, from a profiler trace."""
  with tempfile.TemporaryDirectory() as folder:
    jax.profiler.start_trace(folder, create_perfetto_trace=True)
    for _ in range(CALLS):
      jax.block_until_ready(compiled(*args))
    jax.profiler.stop_trace()
    path, = glob.glob(os.path.join(folder, "**", "*.trace.json.gz"),
                      recursive=True)
    with gzip.open(path) as f:
      events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  times = collections.Counter()
  for event in events:
    if event.get("ph") == "X":
      times[event["name"]] += event.get("dur", 0) / CALLS
  return times


def hlo_ops(text: str) -> dict:
  """op name -> (shape, opcode, the JAX operation it came from)."""
  ops = {}
  for match in re.finditer(r"^\s*(?:ROOT )?%(\S+) = (\S+) (\S+?)\((.*)$",
                           text, re.M):
    name, shape, opcode, rest = match.groups()
    source = re.search(r'op_name="([^"]*)"', rest)
    ops[name] = (shape, opcode, source.group(1) if source else "")
  return ops


def category(name: str, shape: str, opcode: str, source: str,
             rank: int) -> str:
  """What an op computes, from its name, shape and source."""
  product = "ynn_fusion" in name or opcode == "dot" or name.startswith(
      "dot")
  attention = "MultiHeadDotProductAttention" in source
  projection = re.search(r"/(query|key|value|out)/", source)
  if product and attention and not projection:
    return "attention products"
  if product and re.search(rf"[\[,]{rank}[\],]", shape):
    return f"adapter products (rank {rank})"
  if product:
    return "frozen base products"
  if "copy" in name or "transpose" in name:
    return "copies and transposes"
  if attention and not projection:
    return "attention softmax and mask"
  return "other elementwise, norms, loss"


def product_rates() -> dict:
  """GFLOP/s of a lone jitted float32 product, wall, median of 7."""
  rates = {}
  for m, k, n, reps in ((2048, 2048, 2048, 3), (2560, 64, 256, 200),
                        (2560, 256, 64, 200)):
    a, b = jnp.ones((m, k)), jnp.ones((k, n))
    product = jax.jit(jnp.matmul)
    jax.block_until_ready(product(a, b))
    walls = []
    for _ in range(7):
      start = time.perf_counter()
      for _ in range(reps):
        out = product(a, b)
      jax.block_until_ready(out)
      walls.append((time.perf_counter() - start) / reps)
    rates[f"{m}x{k}x{n}"] = round(2 * m * k * n / np.median(walls) / 1e9, 1)
  return rates


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", type=int, default=10)
  parser.add_argument("--clients-per-step", type=int, default=None)
  parser.add_argument("--top", type=int, default=8)
  parser.add_argument("--peak", action="store_true")
  args = parser.parse_args(argv)
  if args.peak:
    print(json.dumps({"product_gflops": product_rates(),
                      **finetune_bench.stamp()}))  # pylint: disable=protected-access
    return 0
  compiled, call_args = compiled_call(args.clients, args.clients_per_step)
  jax.block_until_ready(compiled(*call_args))
  walls = []
  for _ in range(5):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*call_args))
    walls.append(time.perf_counter() - start)
  ops = hlo_ops(compiled.as_text())
  times = {name: t for name, t in op_times(compiled, call_args).items()
           if name in ops}
  total = sum(times.values())
  shares = collections.Counter()
  for name, t in times.items():
    shares[category(name, *ops[name], finetune_bench.RANK)] += t
  top = sorted(times.items(), key=lambda item: -item[1])[:args.top]
  print(json.dumps({
      "clients": args.clients, "call_s": round(float(np.median(walls)), 4),
      "op_ms": round(total / 1e3, 1),
      "by_kind_ms": {k: round(v / 1e3, 1) for k, v in shares.most_common()},
      "top": [{"op": name, "ms": round(t / 1e3, 2), "shape": ops[name][0],
               "source": re.sub(r".*while/body/", "", ops[name][2])}
              for name, t in top],
      **finetune_bench.stamp()}))  # pylint: disable=protected-access
  return 0


if __name__ == "__main__":
  sys.exit(main())
