"""One round of federated LoRA fine-tuning: the engine's one call against
the same clients trained one after another in PyTorch + PEFT.

  python experiments/bench/finetune_bench.py                  # 10, 100
  python experiments/bench/finetune_bench.py --clients 10 100 1000
  python experiments/bench/finetune_bench.py --profile        # HLO counts

The workload is FedIT's in ``experiments/fine_tuning``: the pre-trained
``transformer_lm`` base (115,536 parameters, ``fine_tuning/base``), rank-8
adapters (alpha = r) on the six kernels of each block
(``lora.TRANSFORMER_TARGETS``: query, key, value, out and the two MLP
layers), K clients of 40 sequences of 80 characters (rows of the held-out
plays, dealt at random), one local epoch of batch 16 (3 steps: 16, 16, 8
rows), SGD at learning rate 3.0, every client every round, FedIT's mean
of A and B.

* engine: ``simulation.run`` of that round, on one XLA CPU device per
  core (``distributed.use_all_cores``, the command line's layout;
  ``--one-device`` for one); the first round (which
  compiles) is reported apart as ``compile_s``; ``round_s`` and ``cpu_s``
  (the process's user + system CPU seconds) are the medians over the
  next ``--rounds`` rounds (the last round, which evaluates the test
  set, is not timed).
* loop (when ``torch`` and ``peft`` import): a PyTorch module of the same
  architecture, loaded with the same base weights (its logits are checked
  against the engine's base to 1e-4 before timing), PEFT's ``LoraConfig``
  on the same six matrices (rank 8, alpha 8, no dropout), each client's
  adapters from the global ones, 3 SGD steps, then the mean of A and B:
  the simplest loop a user writes. Timed at 1 thread and at torch's
  default thread count.

Prints one JSON line per variant (clients, round_s, cpu_s, compile_s,
threads, load average before and after, date, machine). ``--profile``
prints what XLA's compiled round holds instead: its cost analysis (flops,
bytes accessed) and the count of each op kind in the optimised HLO.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments", "fine_tuning"))
sys.path.insert(0, HERE)

# pylint: disable=wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import data as data_lib
from fedjax_agg import distributed
from fedjax_agg import federated
from fedjax_agg import simulation
from fedjax_agg import types
from fedjax_agg.config import Evaluation, Execution, LocalTraining
from fedjax_agg.models import lora
import pretrain
# pylint: enable=wrong-import-position

RANK = 8
ROWS = 40          # sequences a client
BATCH = 16
LEARNING_RATE = 3.0


def _cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def stamp() -> dict:
  return {"date": datetime.date.today().isoformat(),
          "machine": f"{platform.machine()}, {os.cpu_count()} cores",
          "load": [round(x, 2) for x in os.getloadavg()]}


def workload(num_clients: int, seed: int = 0):
  """(base, client rows [K, 40, 80] x and y): rows of the plays the base
  never saw, dealt at random."""
  base = pretrain.load_base(os.path.join(ROOT, "experiments",
                                         "fine_tuning", "base"))
  fed = data_lib.shakespeare(exclude_plays=pretrain.HELD_OUT_PLAYS)
  rng = np.random.default_rng(seed)
  need = num_clients * ROWS
  picks = rng.choice(len(fed.train_x), size=need,
                     replace=need > len(fed.train_x))
  x = np.asarray(fed.train_x)[picks].reshape(num_clients, ROWS, -1)
  y = np.asarray(fed.train_y)[picks].reshape(num_clients, ROWS, -1)
  return base, x, y, fed


class _Timer(types.Callback):
  """Round callback: wall and CPU seconds of each round."""

  def __init__(self):
    super().__init__()
    self.rounds, self._last = [], None

  def start(self):
    self._last = (time.perf_counter(), _cpu())

  def __call__(self, row, client):
    del client
    now = (time.perf_counter(), _cpu())
    self.rounds.append((row["round"], now[0] - self._last[0],
                        now[1] - self._last[1]))
    self._last = now


def engine_round(base, x, y, test, rounds: int,
                 targets=tuple(lora.TRANSFORMER_TARGETS),
                 **execution) -> dict:
  """The engine's FedIT round for K = len(x) clients (``targets`` None:
  a loaded checkpoint's own default targets)."""
  key = jax.random.key(0)
  model = lora.lora(base.model, base.variables, rank=RANK, key=key,
                    targets=None if targets is None else list(targets))
  data = federated.from_partition(
      x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]),
      list(np.arange(x.shape[0] * ROWS).reshape(x.shape[0], ROWS)))
  timer = _Timer()
  timer.start()
  simulation.run(
      model, data, test, aggregators.fedit(), num_rounds=rounds + 2,
      participation=1.0,
      training=LocalTraining(epochs=1, batch_size=BATCH,
                             learning_rate=LEARNING_RATE),
      evaluation=Evaluation(every=rounds + 2, clients=False),
      execution=Execution(progress=False, **execution),
      callbacks=[timer])
  # Row 0 is the initial evaluation; round 1 compiles; the last round
  # also evaluates: the rounds between are timed.
  by_round = {r: (wall, cpu) for r, wall, cpu in timer.rounds}
  first = (1, *by_round[1])
  later = [(r, *by_round[r]) for r in range(2, rounds + 2)]
  return {"variant": "engine", "clients": int(x.shape[0]),
          "devices": len(jax.devices()),
          "compile_s": round(first[1], 3),
          "round_s": round(float(np.median([r[1] for r in later])), 4),
          "cpu_s": round(float(np.median([r[2] for r in later])), 4),
          "rounds": len(later), **{k: v for k, v in execution.items()}}


def profile(base, x, y) -> dict:
  """What the compiled local training of K clients holds: XLA's cost
  analysis and op counts by kind in the optimised HLO."""
  from fedjax_agg import engine  # pylint: disable=g-import-not-at-top
  import collections  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  model = lora.lora(base.model, base.variables, rank=RANK,
                    key=jax.random.key(0),
                    targets=list(lora.TRANSFORMER_TARGETS))
  k = x.shape[0]
  data = federated.from_partition(
      x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1]),
      list(np.arange(k * ROWS).reshape(k, ROWS)))
  trainer = engine.make_local_trainer(
      model, LocalTraining(epochs=1, batch_size=BATCH,
                           learning_rate=LEARNING_RATE, compute_losses=False))
  params = model.init(jax.random.key(0))
  cohort = jnp.arange(k)
  steps = jnp.full((k,), 3, jnp.int32)
  lrs = jnp.full((k,), LEARNING_RATE, jnp.float32)
  lowered = jax.jit(trainer).lower(params, data, cohort, lrs, steps,
                                   jax.random.key(1))
  compiled = lowered.compile()
  arguments = (params, data, cohort, lrs, steps, jax.random.key(1))
  jax.block_until_ready(compiled(*arguments))
  calls = []
  for _ in range(5):  # the local-training call alone, compiled
    start = time.perf_counter()
    jax.block_until_ready(compiled(*arguments))
    calls.append(time.perf_counter() - start)
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  text = compiled.as_text()
  ops = collections.Counter(re.findall(r"= \S+ ([a-z][a-z0-9-]*)\(", text))
  dots = re.findall(r"= (\S+) dot\(", text)
  return {"variant": "profile", "clients": k,
          "call_s": round(float(np.median(calls)), 4),
          "flops": float(cost.get("flops", float("nan"))),
          "bytes_accessed": float(cost.get("bytes accessed", float("nan"))),
          "ops": dict(ops.most_common(25)), "dot_shapes": dots[:40]}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
  parser.add_argument("--rounds", type=int, default=3,
                      help="timed rounds after the compiling one")
  parser.add_argument("--profile", action="store_true")
  parser.add_argument("--clients-per-step", type=int, nargs="+",
                      default=[None], help="engine chunk widths to time "
                      "(None: the library's default)")
  parser.add_argument("--no-loop", action="store_true",
                      help="the engine only")
  parser.add_argument("--one-device", action="store_true",
                      help="one XLA CPU device (default: one per core, "
                      "distributed.use_all_cores, as the command line)")
  args = parser.parse_args(argv)
  if not args.one_device:
    distributed.use_all_cores()
  for k in args.clients:
    base, x, y, fed = workload(k)
    test = (np.asarray(fed.test_x)[:64], np.asarray(fed.test_y)[:64])
    if args.profile:
      print(json.dumps({**profile(base, x, y), **stamp()}), flush=True)
      continue
    for width in args.clients_per_step:
      execution = {} if width is None else {"clients_per_step": width}
      print(json.dumps({**engine_round(base, x, y, test, args.rounds,
                                       **execution), **stamp()}),
            flush=True)
    if not args.no_loop:
      try:
        import finetune_torch  # pylint: disable=g-import-not-at-top
      except ImportError as error:
        print(json.dumps({"variant": "loop", "skipped": str(error)}))
        continue
      for threads in (1, None):
        print(json.dumps({**finetune_torch.loop_round(
            base, x, y, args.rounds, threads, rank=RANK, batch=BATCH,
            learning_rate=LEARNING_RATE), **stamp()}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
