"""Times ``aggregate`` alone next to the round's local training.

Workload: the FedLayerWise CNN (``cnn_fedlayerwise``, 582,026 params), K
clients per round, each holding 600 examples of 28x28x1 (the FedLayerWise
setting: 1 epoch of SGD, batch 16, lr 0.005). For every rule and K it prints
one JSON line with

* ``aggregate_s``: median wall time of one jitted ``aggregate`` call on
  [K, ...] client params already on device (compilation excluded);
* ``train_s``: wall time of the round's local training of the K clients
  with ``fedjax_agg.engine`` (one jitted call, losses not computed,
  compilation excluded). Local training is linear in K (every client does
  the same work); above ``--max-train-clients`` it is measured on that many
  clients and scaled to K, and ``train_extrapolated`` says so;
* ``aggregate_pct``: 100 aggregate_s / (train_s + aggregate_s).

Usage:
  python experiments/bench/aggregate_bench.py --clients 10 100 1000
  python experiments/bench/aggregate_bench.py --rules fedadp --clients 100

Numbers depend on the machine; run nothing else meanwhile.
"""

import argparse
import functools
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_agg import aggregators
from fedjax_agg import engine
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg.types import ClientInfo
from fedjax_agg.config import LocalTraining

EXAMPLES_PER_CLIENT = 600
BATCH_SIZE = 16
LEARNING_RATE = 0.005
POOL = 6000  # distinct images; clients draw their 600 from this pool


def median_seconds(fn, repeats: int) -> float:
  """Median wall time of ``fn()`` (its outputs blocked on) over repeats."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def make_clients(global_params, num_clients: int, seed: int):
  """[K, ...] client params: the global model plus small updates."""
  @jax.jit
  def build(key):
    leaves, treedef = jax.tree.flatten(global_params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(treedef, [
        leaf[None] + 0.01 * jax.random.normal(k, (num_clients,) + leaf.shape)
        for leaf, k in zip(leaves, keys, strict=True)])
  return build(jax.random.key(seed))


def cohort_info(num_clients: int) -> ClientInfo:
  return ClientInfo(
      client_ids=jnp.arange(num_clients, dtype=jnp.int32),
      num_examples=jnp.full((num_clients,), EXAMPLES_PER_CLIENT, jnp.float32),
      mask=jnp.ones((num_clients,), jnp.float32),
      loss_before=jnp.zeros((num_clients,), jnp.float32),
      loss_after=jnp.zeros((num_clients,), jnp.float32),
      round=jnp.asarray(1, jnp.int32), key=jax.random.key(0))


def time_training(model, global_params, num_clients: int,
                  clients_per_step: int, repeats: int) -> float:
  """Seconds of one round's local training of ``num_clients`` clients."""
  rng = np.random.default_rng(0)
  x = rng.uniform(size=(POOL, 28, 28, 1)).astype(np.float32)
  y = rng.integers(0, 10, size=POOL)
  indices = [rng.choice(POOL, EXAMPLES_PER_CLIENT, replace=False)
             for _ in range(num_clients)]
  data = federated.from_partition(x, y, indices)
  train = engine.make_local_trainer(model,
      LocalTraining(batch_size=BATCH_SIZE, epochs=1, optimizer=optax.sgd,
                    compute_losses=False),
      clients_per_step=clients_per_step)
  ids = jnp.arange(num_clients, dtype=jnp.int32)
  steps = engine.full_steps(data, ids, BATCH_SIZE, 1)
  lrs = jnp.full((num_clients,), LEARNING_RATE)
  run = lambda: train(global_params, data, ids, lrs, steps,
                      jax.random.key(1)).client_params
  jax.block_until_ready(run())  # compile
  return median_seconds(run, repeats)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", type=int, nargs="+",
                      default=[10, 100, 1000])
  parser.add_argument("--rules", nargs="+",
                      default=["fedavg", "fedadp", "fedlayerwise", "fednnnn"])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--max-train-clients", type=int, default=16)
  parser.add_argument("--train-repeats", type=int, default=1)
  parser.add_argument("--clients-per-step", type=int, default=8)
  parser.add_argument("--no-train", action="store_true",
                      help="time aggregate only")
  args = parser.parse_args(argv)
  for name in args.rules:
    if name not in aggregators.REGISTRY:
      parser.error(f"--rules: {name!r} is not one of "
                   f"{sorted(aggregators.REGISTRY)}")

  model = models.get("cnn_fedlayerwise", num_classes=10)
  global_params = model.init(jax.random.key(0))
  num_params = sum(x.size for x in jax.tree.leaves(global_params))
  print(f"# {jax.devices()[0].platform}, {num_params:,} params",
        file=sys.stderr)

  per_client_train = {}
  for num_clients in args.clients:
    train_s, extrapolated = None, False
    if not args.no_train:
      measured = min(num_clients, args.max_train_clients)
      if measured not in per_client_train:
        per_client_train[measured] = time_training(
            model, global_params, measured, args.clients_per_step,
            args.train_repeats) / measured
      train_s = per_client_train[measured] * num_clients
      extrapolated = measured < num_clients
    client_params = jax.block_until_ready(
        make_clients(global_params, num_clients, seed=1))
    info = cohort_info(num_clients)
    for name in args.rules:
      rule = aggregators.get(name, num_clients=num_clients)
      state = rule.init(global_params)
      aggregate = jax.jit(rule.aggregate)
      start = time.perf_counter()
      jax.block_until_ready(aggregate(global_params, client_params, info,
                                      state))
      compile_s = time.perf_counter() - start
      seconds = median_seconds(
          functools.partial(aggregate, global_params, client_params, info,
                            state), args.repeats)
      row = {"rule": name, "clients": num_clients, "params": num_params,
             "aggregate_s": round(seconds, 5),
             "first_call_s": round(compile_s, 3),
             "train_s": None if train_s is None else round(train_s, 3),
             "train_extrapolated": extrapolated,
             "aggregate_pct": None if train_s is None else round(
                 100 * seconds / (train_s + seconds), 3),
             "platform": jax.devices()[0].platform}
      print(json.dumps(row), flush=True)
    del client_params
  return 0


if __name__ == "__main__":
  sys.exit(main())
