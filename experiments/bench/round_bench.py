"""Times one FedAvg round of the peer-benchmark workload.

Workload (the FedAvg peer benchmark's, restated here so that this script
needs nothing outside the repository):

* data: ``numpy.random.default_rng(seed)`` draws ``x`` float32 uniform
  [0, 1) of shape (N, 600, 28, 28, 1), then ``y`` int32 uniform in 0..9 of
  shape (N, 600); client i holds ``x[i], y[i]``;
* all N clients train every round: 1 epoch of plain SGD, lr 0.005, batch 16,
  mean softmax cross-entropy, the last partial batch kept (600 = 37*16 + 8:
  38 steps), reshuffled per client per round;
* FedAvg: new global = sum_i n_i params_i / sum_i n_i;
* model: conv5x5x32 SAME-ReLU-maxpool2, conv5x5x64 SAME-ReLU-maxpool2,
  dense 512-ReLU, dense 10: 1,663,370 parameters;
* round 0 is the warm-up (compilation), reported as ``first_round_s``; then
  ``--rounds`` rounds are timed one by one, ``round_s`` is their median and
  ``samples_per_s = N * 600 / round_s``. The clock runs from handing out the
  global params to the new global params being materialised.

Modes:
* ``--mode engine``: the library's one-call local training
  (``engine.make_local_trainer``) and ``aggregators.fedavg`` in one jitted
  round function.
* ``--mode loop``: a same-machine baseline, the way one writes it by hand:
  a Python loop over clients and over their batches calling one jitted SGD
  step (numpy batches, per-client numpy shuffles), then the weighted mean.
* ``--mode central``: the anchor of what the device does with ONE model:
  the same N x 600 samples trained centrally, one jitted ``lax.scan`` of
  SGD steps of ``--central-batch`` examples (the last partial batch
  dropped); a "round" is one pass, ``samples_per_s`` counts the samples
  it trained on.

Prints one JSON line per run on stdout (progress on stderr).

  python experiments/bench/round_bench.py --clients 100
  python experiments/bench/round_bench.py --clients 100 --mode loop
"""

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import time
from importlib import metadata

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_agg import aggregators
from fedjax_agg import distributed
from fedjax_agg import engine
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg.models import layers
from fedjax_agg.types import ClientInfo, Model
from fedjax_agg import config as config_lib
from fedjax_agg.config import LocalTraining

SAMPLES_PER_CLIENT = 600
BATCH_SIZE = 16
LEARNING_RATE = 0.005
LOCAL_EPOCHS = 1
IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
STEPS_PER_CLIENT = -(-SAMPLES_PER_CLIENT // BATCH_SIZE)  # 38
EXPECTED_PARAMS = 1_663_370


def make_client_data(num_clients: int, seed: int,
                     samples: int = SAMPLES_PER_CLIENT):
  """x (N, 600, 28, 28, 1) float32 in [0, 1), y (N, 600) int32 in 0..9
  (``samples`` instead of 600 for a toy run)."""
  rng = np.random.default_rng(seed)
  x = rng.random((num_clients, samples) + IMAGE_SHAPE, dtype=np.float32)
  y = rng.integers(0, NUM_CLASSES, size=(num_clients, samples),
                   dtype=np.int32)
  return x, y


class LocalCNN(nn.Module):
  """The workload's CNN written here with ``layers.Conv``/``max_pool``."""
  conv_impl: str = "auto"

  @nn.compact
  def __call__(self, x):
    for features in (32, 64):
      x = layers.Conv(features, (5, 5), padding="SAME", impl=self.conv_impl)(x)
      x = layers.max_pool(nn.relu(x), (2, 2))
    x = nn.relu(nn.Dense(512)(x.reshape((x.shape[0], -1))))
    return nn.Dense(NUM_CLASSES)(x)


def build_model(which: str, conv_impl: str) -> Model:
  if which == "zoo":
    return models.get("cnn_mcmahan", NUM_CLASSES, conv_impl=conv_impl)
  net = LocalCNN(conv_impl)
  return Model(
      init=lambda key: net.init(key, jnp.zeros((1,) + IMAGE_SHAPE)),
      apply=lambda variables, x, train: (net.apply(variables, x), variables))


def samples_per_round(args) -> int:
  """Samples trained on in one timed round (central: whole batches)."""
  samples = args.clients * args.examples_per_client
  if args.mode == "central":
    return samples // args.central_batch * args.central_batch
  return samples


def resolved_impl(mode: str, conv_impl: str) -> str:
  """The lowering "auto" stands for: the engine traces per-client kernels."""
  if mode != "engine":
    return layers.resolve_impl(conv_impl)
  with layers.per_client_training():
    return layers.resolve_impl(conv_impl)


def peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def engine_rounds(args, model, params, client_data):
  """Yields the new global params of each round (round 0 = warm-up)."""
  n = args.clients
  x, y = client_data.pop()  # the host copy is dropped once on device
  options = engine_options(args)
  # With a mesh the data are replicated on every device once, up front.
  device = (jax.sharding.NamedSharding(options["mesh"],
                                       jax.sharding.PartitionSpec())
            if "mesh" in options else None)
  data = federated.from_stacked(x, y, device=device)
  del x, y
  training = LocalTraining(batch_size=BATCH_SIZE, epochs=LOCAL_EPOCHS,
                           compute_losses=options.pop("compute_losses"),
                           unroll=options.pop("unroll", 1),
                           **options.pop("precision", {}))
  trainer = engine.make_local_trainer(model, training, **options)
  aggregator = aggregators.fedavg()
  ids = jnp.arange(n, dtype=jnp.int32)
  num_steps = engine.full_steps(data, ids, BATCH_SIZE, LOCAL_EPOCHS)

  @jax.jit
  def round_fn(global_params, agg_state, round_num, data, ids, num_steps):
    key, agg_key = jax.random.split(
        jax.random.fold_in(jax.random.key(args.seed), round_num))
    local = trainer(global_params, data, ids, jnp.full((n,), LEARNING_RATE),
                    num_steps, key)
    info = ClientInfo(
        client_ids=ids, num_examples=data.num_examples.astype(jnp.float32),
        mask=jnp.ones((n,)), loss_before=local.loss_before,
        loss_after=local.loss_after, round=round_num + 1, key=agg_key)
    new_params, agg_state, _ = aggregator.aggregate(
        global_params, local.client_params, info, agg_state)
    # The losses are returned (as a simulation reports them), so that XLA
    # does not drop their computation although FedAvg ignores them.
    return new_params, agg_state, (local.train_loss, local.loss_before,
                                   local.loss_after)

  if device is not None:
    # Replicated like the round's output, so round 1 does not recompile.
    params = jax.device_put(params, device)
  agg_state = aggregator.init(params)
  for r in range(1 + args.rounds):
    start = time.perf_counter()
    cpu_start = time.process_time()
    params, agg_state, train_loss = jax.block_until_ready(
        round_fn(params, agg_state, jnp.int32(r), data, ids, num_steps))
    yield (time.perf_counter() - start, time.process_time() - cpu_start,
           params, float(jnp.mean(train_loss[0])))


def central_rounds(args, model, params, client_data):
  """One model over every client's samples, ``--central-batch`` at a time."""
  x, y = client_data.pop()
  batch = args.central_batch
  steps = x.shape[0] * x.shape[1] // batch
  x = jnp.asarray(x.reshape((-1,) + IMAGE_SHAPE)[:steps * batch].reshape(
      (steps, batch) + IMAGE_SHAPE))
  y = jnp.asarray(y.reshape(-1)[:steps * batch].reshape(steps, batch))

  def step(p, xy):
    xb, yb = xy

    def loss_fn(p):
      logits, _ = model.apply(p, xb, True)
      return optax.softmax_cross_entropy_with_integer_labels(
          logits, yb).mean()
    loss, grads = jax.value_and_grad(loss_fn)(p)
    return jax.tree.map(lambda w, g: w - LEARNING_RATE * g, p, grads), loss

  @jax.jit
  def one_pass(p, x, y):
    with contextlib.ExitStack() as stack:
      if args.matmul_precision == "highest":
        stack.enter_context(jax.default_matmul_precision("highest"))
      return jax.lax.scan(step, p, (x, y))

  for _ in range(1 + args.rounds):
    start = time.perf_counter()
    cpu_start = time.process_time()
    trained, losses = jax.block_until_ready(one_pass(params, x, y))
    yield (time.perf_counter() - start, time.process_time() - cpu_start,
           trained, float(jnp.mean(losses)))


def loop_rounds(args, model, params, client_data):
  """The hand-written baseline: Python loops around one jitted SGD step."""
  n = args.clients
  x, y = client_data.pop()

  @jax.jit
  def train_step(p, xb, yb):
    def loss_fn(p):
      logits, _ = model.apply(p, xb, True)
      return optax.softmax_cross_entropy_with_integer_labels(logits,
                                                             yb).mean()
    loss, grads = jax.value_and_grad(loss_fn)(p)
    return jax.tree.map(lambda a, g: a - LEARNING_RATE * g, p, grads), loss

  for r in range(1 + args.rounds):
    start = time.perf_counter()
    cpu_start = time.process_time()
    weighted_sum, total, losses = None, 0.0, []
    for c in range(n):
      perm = np.random.default_rng([args.seed, r, c]).permutation(
          args.examples_per_client)
      xc, yc = x[c][perm], y[c][perm]
      p = params
      for s in range(-(-args.examples_per_client // BATCH_SIZE)):
        sl = slice(s * BATCH_SIZE, (s + 1) * BATCH_SIZE)
        p, loss = train_step(p, xc[sl], yc[sl])
        losses.append(loss)
      w = float(len(xc))
      weighted_sum = (jax.tree.map(lambda a, w=w: w * a, p)
                      if weighted_sum is None
                      else jax.tree.map(lambda acc, a, w=w: acc + w * a,
                                        weighted_sum, p))
      total += w
    params = jax.block_until_ready(
        jax.tree.map(lambda acc, total=total: acc / total, weighted_sum))
    yield (time.perf_counter() - start, time.process_time() - cpu_start,
           params, float(np.mean([float(v) for v in losses])))


def engine_options(args) -> dict:
  # The library's default ("auto") computes the per-client losses only for
  # rules that read them; FedAvg does not.
  options = {"compute_losses": args.compute_losses == "1"}
  devices = min(args.host_devices, jax.device_count())
  if jax.default_backend() == "cpu" and devices > 1 and args.mode == "engine":
    options["mesh"] = jax.sharding.Mesh(np.array(jax.devices()[:devices]),
                                        ("clients",))
  for name in ("clients_per_step", "unroll", "chunk_loop"):
    if getattr(args, name) is not None:
      options[name] = getattr(args, name)
  if args.matmul_precision is not None:
    options["precision"] = {"matmul_precision": args.matmul_precision}
  return options


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--clients", type=int, default=10)
  p.add_argument("--rounds", type=int, default=2,
                 help="timed rounds after the warm-up round")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--mode", choices=("engine", "loop", "central"),
                 default="engine")
  p.add_argument("--examples-per-client", type=int,
                 default=SAMPLES_PER_CLIENT,
                 help="the workload's 600; fewer only for a toy run")
  p.add_argument("--central-batch", type=int, default=16,
                 help="central mode: examples per SGD step")
  p.add_argument("--matmul-precision", default=None,
                 choices=config_lib.MATMUL_PRECISIONS,
                 help="engine and central modes: precision of training's "
                 "products (default: the library's, 'highest'; the central "
                 "mode's default leaves them to the backend)")
  p.add_argument("--model", choices=("zoo", "local"), default="zoo",
                 help="zoo: models.get('cnn_mcmahan'); local: the same CNN "
                 "defined in this script with layers.Conv/max_pool")
  p.add_argument("--conv-impl", default=None,
                 help=f"one of {layers.CONV_IMPLS}; default 'auto' for the "
                 "engine and central modes, 'xla' for the loop")
  p.add_argument("--clients-per-step", type=int, default=None,
                 help="engine vmap width (default: the engine's)")
  p.add_argument("--unroll", type=int, default=None,
                 help="engine step-scan unroll (default: the engine's)")
  p.add_argument("--chunk-loop", choices=("map", "unroll"), default=None,
                 help="engine loop over chunks (default: the engine's)")
  p.add_argument("--host-devices", type=int, default=os.cpu_count() or 1,
                 help="engine on CPU: split the CPU into this many XLA host "
                 "devices and shard each chunk of clients over them (a "
                 "device mesh; each device trains its own clients). Default: "
                 "the number of cores; 1 = one device")
  p.add_argument("--compute-losses", choices=("0", "1", "auto"),
                 default="auto",
                 help="engine: compute loss_before/loss_after (default: the "
                 "library's 'auto', i.e. only for rules that read them; "
                 "FedAvg does not)")
  args = p.parse_args(argv)
  if args.mode == "engine" and args.host_devices > 1:
    # Before the first device query; GPUs/TPUs are unaffected by the split.
    distributed.use_cpu_devices(args.host_devices)
  conv_impl = args.conv_impl or ("xla" if args.mode == "loop" else "auto")

  client_data = [make_client_data(args.clients, args.seed,
                                  args.examples_per_client)]
  model = build_model(args.model, conv_impl)
  params = model.init(jax.random.key(args.seed))
  num_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))
  if num_params != EXPECTED_PARAMS:
    print(f"WARNING: {num_params} params, expected {EXPECTED_PARAMS}",
          file=sys.stderr)

  rounds = {"engine": engine_rounds, "loop": loop_rounds,
            "central": central_rounds}[args.mode]
  times, cpu_times, train_loss = [], [], float("nan")
  for r, (seconds, cpu_seconds, trained, train_loss) in enumerate(
      rounds(args, model, params, client_data)):
    del trained
    times.append(seconds)
    cpu_times.append(cpu_seconds)
    print(f"{args.mode} N={args.clients} round {r}: {seconds:.3f}s "
          f"(train loss {train_loss:.4f}, load {os.getloadavg()[0]:.2f})",
          file=sys.stderr, flush=True)

  timed = times[1:]
  round_s = statistics.median(timed)
  out = {
      "peer": f"fedjax_agg_{args.mode}",
      "clients": args.clients,
      "round_s": round(round_s, 4),
      "first_round_s": round(times[0], 4),
      "samples_per_s": round(samples_per_round(args) / round_s, 1),
      "s_per_client": round(round_s / args.clients, 4),
      "params": num_params,
      "rounds_timed": len(timed),
      "round_s_all": [round(t, 4) for t in timed],
      "round_s_min": round(min(timed), 4),
      # CPU time of this process (all its threads) per timed round: less
      # sensitive than wall time to other processes sharing the cores.
      "cpu_s_per_round": round(statistics.median(cpu_times[1:]), 4),
      "peak_rss_mb": round(peak_rss_mb(), 1),
      "model": args.model,
      "conv_impl": conv_impl,
      "resolved_conv_impl": resolved_impl(args.mode, conv_impl),
      "matmul_precision": args.matmul_precision,
      "central_batch": args.central_batch if args.mode == "central" else None,
      "device_kind": jax.devices()[0].device_kind,
      "steps_per_client": -(-args.examples_per_client // BATCH_SIZE),
      "examples_per_client": args.examples_per_client,
      "batch_size": BATCH_SIZE,
      "train_loss_last_round": round(train_loss, 5),
      "params_abs_sum": float(sum(np.abs(np.asarray(a, np.float64)).sum()
                                  for a in jax.tree.leaves(params))),
      "backend": jax.default_backend(),
      "devices": jax.device_count(),
      "cpus": os.cpu_count(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "python": platform.python_version(),
      "versions": {k: metadata.version(k) for k in ("jax", "jaxlib", "flax",
                                                     "optax", "numpy")},
      "loadavg_end": [round(v, 2) for v in os.getloadavg()],
      "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
  }
  if args.mode == "engine":
    options = engine_options(args)
    out["engine_options"] = {k: (v if k != "mesh" else dict(v.shape))
                             for k, v in options.items()}
    # The vmap width the engine trained with (its default when not given).
    out["clients_per_step_resolved"] = options.get(
        "clients_per_step") or distributed.default_clients_per_step(
            options.get("mesh"), num_params=num_params)
  print(json.dumps(out), flush=True)
  return out


if __name__ == "__main__":
  main()
