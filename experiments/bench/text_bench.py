"""Times FedAvg rounds of the char-LSTM on the Shakespeare federation.

Workload: the Shakespeare federation (``data.shakespeare()``, LEAF's
characters, 80-token rows), ``--clients`` clients drawn with the seed train
every round: 1 epoch of plain SGD, lr ``--lr``, batch 10 rows (the FedAvg
paper's B = 10), the token-weighted sequence cross-entropy, then FedAvg
weighted by rows. Model: ``models.get("char_lstm")`` (embedding 8, two
LSTMs of 256, 817,872 parameters).

Modes:
* ``--mode engine``: the library's one-call local training
  (``engine.make_local_trainer``, vmapped over clients, sharded over one XLA
  host device per core as the command line does) and ``aggregators.fedavg``
  in one jitted round.
* ``--mode loop``: the way one writes it by hand: a Python loop over the
  clients and their batches calling one jitted SGD step (the same loss),
  then the weighted mean.

Round 0 is the warm-up (compilation); then ``--rounds`` rounds are timed;
``round_s`` is their median, ``rows_per_s`` and ``tokens_per_s`` the
trained rows and scored tokens per second. One JSON line on stdout.

  python experiments/bench/text_bench.py --mode engine
  python experiments/bench/text_bench.py --mode loop
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import data as data_lib
from fedjax_agg import distributed
from fedjax_agg import engine
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import ClientInfo

BATCH_SIZE = 10


def client_rows(args):
  """The drawn clients' rows: [(x [n, 80], y [n, 80])] and the pooled
  ``FederatedData`` of them."""
  fed = data_lib.shakespeare()
  chosen = np.sort(np.random.default_rng(args.seed).choice(
      fed.num_clients, args.clients, replace=False))
  parts = [np.asarray(fed.train_clients[c]) for c in chosen]
  rows = np.concatenate(parts)
  bounds = np.cumsum([0] + [len(p) for p in parts])
  local = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:],
                                           strict=True)]
  x, y = fed.train_x[rows], fed.train_y[rows]
  return x, y, local


def engine_rounds(args, model, params, x, y, parts):
  mesh = None
  if jax.default_backend() == "cpu" and jax.device_count() > 1:
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("clients",))
  device = (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            if mesh is not None else None)
  data = federated.from_partition(x, y, parts, device=device)
  trainer = engine.make_local_trainer(
      model, LocalTraining(batch_size=BATCH_SIZE, epochs=1,
                           compute_losses=False), mesh=mesh,
      clients_per_step=args.clients_per_step)
  aggregator = aggregators.fedavg()
  n = len(parts)
  ids = jnp.arange(n, dtype=jnp.int32)
  steps = engine.full_steps(data, ids, BATCH_SIZE, 1)

  @jax.jit
  def round_fn(global_params, state, round_num):
    key = jax.random.fold_in(jax.random.key(args.seed), round_num)
    local = trainer(global_params, data, ids, jnp.full((n,), args.lr),
                    steps, key)
    info = ClientInfo(client_ids=ids,
                      num_examples=data.num_examples.astype(jnp.float32),
                      mask=jnp.ones((n,)), loss_before=local.loss_before,
                      loss_after=local.loss_after, round=round_num + 1,
                      key=key)
    new, state, _ = aggregator.aggregate(global_params, local.client_params,
                                         info, state)
    return new, state, local.train_loss

  if device is not None:
    params = jax.device_put(params, device)
  state = aggregator.init(params)
  for r in range(1 + args.rounds):
    start = time.perf_counter()
    params, state, loss = jax.block_until_ready(
        round_fn(params, state, jnp.int32(r)))
    yield time.perf_counter() - start, float(jnp.mean(loss))


def loop_rounds(args, model, params, x, y, parts):
  loss_fn = objectives.local_loss(model, objectives.cross_entropy())

  @jax.jit
  def step(p, xb, yb):
    batch = {"x": xb, "y": yb, "mask": jnp.ones((xb.shape[0],))}
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        p, batch, p, ())
    return jax.tree.map(lambda a, g: a - args.lr * g, p, grads), loss

  for r in range(1 + args.rounds):
    start = time.perf_counter()
    total, weighted, losses = 0.0, None, []
    for c, part in enumerate(parts):
      order = np.random.default_rng([args.seed, r, c]).permutation(part)
      p = params
      for s in range(0, len(order), BATCH_SIZE):
        ix = order[s:s + BATCH_SIZE]
        p, loss = step(p, x[ix], y[ix])  # a short last batch recompiles once
        losses.append(loss)
      w = float(len(part))
      weighted = (jax.tree.map(lambda a, w=w: w * a, p) if weighted is None
                  else jax.tree.map(lambda acc, a, w=w: acc + w * a,
                                    weighted, p))
      total += w
    params = jax.block_until_ready(
        jax.tree.map(lambda acc, t=total: acc / t, weighted))
    yield time.perf_counter() - start, float(np.mean(
        [float(v) for v in losses]))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=10)
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--lr", type=float, default=1.0)
  p.add_argument("--mode", choices=("engine", "loop"), default="engine")
  p.add_argument("--host-devices", type=int, default=os.cpu_count() or 1)
  p.add_argument("--clients-per-step", type=int, default=None,
                 help="engine vmap width (default: the engine's)")
  args = p.parse_args(argv)
  if args.mode == "engine" and args.host_devices > 1:
    distributed.use_cpu_devices(args.host_devices)
  x, y, parts = client_rows(args)
  model = models.get("char_lstm", num_classes=80)
  params = model.init(jax.random.key(args.seed))
  rounds = engine_rounds if args.mode == "engine" else loop_rounds
  times = []
  for r, (seconds, loss) in enumerate(rounds(args, model, params, x, y,
                                             parts)):
    times.append(seconds)
    print(f"{args.mode} round {r}: {seconds:.2f}s train loss {loss:.4f}",
          file=sys.stderr, flush=True)
  round_s = statistics.median(times[1:])
  tokens = int(np.sum(y >= 0))
  print(json.dumps({
      "mode": args.mode, "clients": args.clients, "rows": int(len(x)),
      "tokens": tokens, "first_round_s": round(times[0], 3),
      "round_s": round(round_s, 3),
      "rows_per_s": round(len(x) / round_s, 1),
      "tokens_per_s": round(tokens / round_s, 1),
      "devices": jax.device_count(),
      "clients_per_step": args.clients_per_step,
      "backend": jax.default_backend(),
      "jax": jax.__version__, "python": platform.python_version()}))


if __name__ == "__main__":
  main()
