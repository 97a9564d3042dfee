"""Times FedDRL's agent next to a round's local training (paper §5.3, Fig. 9).

For each cohort size K (``--clients``, default 10 and 100), with the
paper's agent (Table 1: 3 x 256 policy, 2 x 256 critic, buffer 100,000):

* ``decision_ms``: state -> policy forward pass -> exploration noise ->
  impact factors (Eq. (5)-(6)), the paper's "DRL" bar (~3 ms);
* ``update_ms@F``: one call of Algorithm 1 (TD priorities of the F stored
  experiences, rank sampling, ``--updates`` DDPG steps on batches of
  ``--agent-batch``) with the buffer holding F experiences
  (``--fill``, default 1,000 and the full 100,000);
* ``aggregation_ms``: sum_k alpha_k w_k over K models (the "Aggregation"
  bar);
* ``feddrl_aggregate_ms``: the whole ``Aggregator.aggregate`` of a round
  (store the transition, Algorithm 1, decide, aggregate), buffer at the
  first ``--fill`` level; jitted without donation, so every call also
  copies the state's buffer (100,000 x 8K floats); ``..._donated_ms``:
  the same with the state donated (``donate_argnums``), rounds chained;
* ``local_training_s``: the same round's local training of the K clients
  (``engine.make_local_trainer``, one jitted call) on random data of
  ``--samples`` examples per client.

Each number is the median of ``--repeats`` timed calls after one warm-up
call (compilation). Prints one JSON line per K.

  python experiments/bench/feddrl_bench.py
  python experiments/bench/feddrl_bench.py --clients 10 --model mlp2
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fedjax_agg import engine  # noqa: E402
from fedjax_agg import federated  # noqa: E402
from fedjax_agg import models  # noqa: E402
from fedjax_agg import tree_math  # noqa: E402
from fedjax_agg.aggregators._feddrl import AgentConfig  # noqa: E402
from fedjax_agg.aggregators._feddrl import feddrl  # noqa: E402
from fedjax_agg.aggregators._feddrl import make_agent  # noqa: E402
from fedjax_agg.aggregators._feddrl import networks  # noqa: E402
from fedjax_agg.aggregators._feddrl import replay  # noqa: E402
from fedjax_agg.types import ClientInfo  # noqa: E402
from fedjax_agg.config import LocalTraining


def timed(fn, *args, repeats: int) -> float:
  """Median seconds of ``fn(*args)`` over ``repeats`` calls after warm-up."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def filled_buffer(rng, capacity: int, fill: int, num_clients: int):
  """A buffer of ``capacity`` rows holding ``fill`` random experiences."""
  k = num_clients
  mu = rng.uniform(0, 5, (fill, k))
  rows = replay.Transition(
      state=jnp.asarray(rng.normal(size=(fill, 3 * k)), jnp.float32),
      action=jnp.asarray(np.concatenate(
          [mu, 0.5 * mu * rng.uniform(size=(fill, k))], 1), jnp.float32),
      reward=jnp.asarray(-rng.uniform(1, 3, fill), jnp.float32),
      next_state=jnp.asarray(rng.normal(size=(fill, 3 * k)), jnp.float32))
  return jax.jit(replay.add_many)(replay.init(capacity, 3 * k, 2 * k), rows,
                                  jnp.ones(fill, bool))


def bench(num_clients: int, args) -> dict:
  rng = np.random.default_rng(0)
  config = AgentConfig(batch_size=args.agent_batch,
                       updates_per_round=args.updates)
  agent = make_agent(num_clients, config)
  agent_state = agent.init(jax.random.PRNGKey(0))
  mask = jnp.ones(num_clients)
  s = jnp.asarray(rng.normal(size=(3 * num_clients,)), jnp.float32)

  @jax.jit
  def decide(agent_state, s, key):
    act_key, sample_key = jax.random.split(key)
    mu, sigma = agent.act(agent_state, s, act_key, True)
    return networks.impact_factors(sample_key, mu, sigma, mask)

  out = {"clients": num_clients, "model": args.model,
         "decision_ms": 1e3 * timed(decide, agent_state, s,
                                    jax.random.PRNGKey(1),
                                    repeats=args.repeats)}
  train = jax.jit(agent.train)
  buffers = {}
  for fill in args.fill:
    buffers[fill] = filled_buffer(rng, config.buffer_capacity, fill,
                                  num_clients)
    out[f"update_ms@{fill}"] = 1e3 * timed(
        train, agent_state, buffers[fill], jax.random.PRNGKey(2),
        repeats=args.repeats)

  # The round's local training and the models it produces.
  model = models.get(args.model, conv_impl=args.conv_impl)
  params = model.init(jax.random.key(0))
  shape = models.default_input_shape(args.model)
  total = num_clients * args.samples
  data = federated.from_partition(
      rng.uniform(size=(total,) + shape).astype(np.float32),
      rng.integers(0, 10, total),
      list(np.arange(total).reshape(num_clients, args.samples)))
  trainer = engine.make_local_trainer(model,
      LocalTraining(batch_size=args.batch_size, epochs=args.epochs),
      clients_per_step=min(args.clients_per_step, num_clients))
  cohort = jnp.arange(num_clients)
  steps = engine.full_steps(data, cohort, args.batch_size, args.epochs)
  lrs = jnp.full((num_clients,), 0.01)
  local = trainer(params, data, cohort, lrs, steps, jax.random.key(1))
  out["local_training_s"] = timed(trainer, params, data, cohort, lrs, steps,
                                  jax.random.key(1), repeats=args.repeats)
  alpha = decide(agent_state, s, jax.random.PRNGKey(1))
  out["aggregation_ms"] = 1e3 * timed(jax.jit(tree_math.weighted_sum),
                                      local.client_params, alpha,
                                      repeats=args.repeats)

  rule = feddrl(num_clients, config=config)
  state = rule.init(params)
  state = state._replace(agent=agent_state, buffer=buffers[args.fill[0]],
                         has_last=jnp.ones((), bool))
  info = ClientInfo(cohort, data.num_examples.astype(jnp.float32), mask,
                    local.loss_before, local.loss_after,
                    jnp.ones((), jnp.int32), jax.random.key(2))
  out["feddrl_aggregate_ms"] = 1e3 * timed(
      jax.jit(rule.aggregate), params, local.client_params, info, state,
      repeats=args.repeats)
  # The same with the state donated (rounds chained): the buffer is then
  # updated in place instead of copied.
  donated = jax.jit(rule.aggregate, donate_argnums=3)
  state = jax.tree.map(jnp.copy, state)  # buffers of its own to donate
  state = donated(params, local.client_params, info, state)[1]
  times = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    state = jax.block_until_ready(
        donated(params, local.client_params, info, state)[1])
    times.append(time.perf_counter() - start)
  out["feddrl_aggregate_donated_ms"] = 1e3 * statistics.median(times)
  out.update(conv_impl=args.conv_impl, samples_per_client=args.samples,
             epochs=args.epochs,
             batch_size=args.batch_size, agent_updates=args.updates,
             agent_batch=args.agent_batch, backend=jax.default_backend(),
             device=str(jax.devices()[0]), machine=platform.machine(),
             cpus=os.cpu_count())
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
  parser.add_argument("--model", default="cnn_mcmahan",
                      choices=models.NAMES)
  parser.add_argument("--conv-impl", default="auto",
                      help="convolution lowering (models.layers.CONV_IMPLS)")
  parser.add_argument("--samples", type=int, default=60,
                      help="examples per client")
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--batch-size", type=int, default=10)
  parser.add_argument("--clients-per-step", type=int, default=10)
  parser.add_argument("--updates", type=int, default=1,
                      help="DDPG steps per call of Algorithm 1")
  parser.add_argument("--agent-batch", type=int, default=64)
  parser.add_argument("--fill", type=int, nargs="+", default=[1000, 100000],
                      help="experiences in the buffer when timing updates")
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args(argv)
  for k in args.clients:
    if k < 1:
      parser.error(f"--clients must be positive, got {k}")
    print(json.dumps(bench(k, args)), flush=True)


if __name__ == "__main__":
  main()
