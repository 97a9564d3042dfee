"""FedDRL's agent learns to down-weight clients with corrupted labels.

A tiny linear-regression federation written with jax directly: K = 4
clients, 2 of them (a different pair for each seed) hold labels corrupted
by noise of std 3 (the others 0.1). Each round every client fits a fresh
sample of its data by least squares; the server aggregates with FedDRL.
Client losses are the exact population risks, sigma_k^2 + |w - w*|^2, so
Eq. (7)'s cost is a constant plus |w - w*|^2 and the best weighting is
known: almost all weight on the clean clients (inverse-variance weights).
FedAvg (equal n_k) gives each corrupted client 1/4. The untrained agent
also gives ~1/4, so "clearly less" cannot happen by chance.
"""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg.aggregators._feddrl import AgentConfig, feddrl, make_agent
from fedjax_agg.types import ClientInfo
from tests import agg_testutil as tu

K, DIM, NUM_EXAMPLES = 4, 3, 30
CLEAN_STD, CORRUPT_STD = 0.1, 3.0
TRAIN_ROUNDS, EVAL_ROUNDS, NUM_SEEDS = 200, 50, 3
CONFIG = AgentConfig(
    policy_hidden=(32, 32, 32), value_hidden=(32, 32), discount=0.5,
    policy_lr=2e-5, value_lr=1e-3, buffer_capacity=TRAIN_ROUNDS,
    batch_size=32, updates_per_round=8, exploration_std=1.0)
W_STAR = jnp.array([1.0, -2.0, 0.5])


def client_round(key, global_w, label_std):
  """Least-squares local models on fresh data, and the clients' losses."""
  key_x, key_noise = jax.random.split(key)
  x = jax.random.normal(key_x, (K, NUM_EXAMPLES, DIM))
  y = x @ W_STAR + label_std[:, None] * jax.random.normal(
      key_noise, (K, NUM_EXAMPLES))
  local_w = jax.vmap(lambda a, b: jnp.linalg.solve(a.T @ a, a.T @ b))(x, y)
  loss_before = label_std**2 + jnp.sum((global_w - W_STAR)**2)
  loss_after = label_std**2 + jnp.sum((local_w - W_STAR)**2, axis=1)
  return local_w, loss_before, loss_after


def run_rounds(aggregate, state, key, num_rounds, label_std):
  """Runs the federation; returns the final state and [T] corrupted weight."""
  corrupted = (label_std > 1).astype(jnp.float32)

  def one_round(carry, round_key):
    global_params, state = carry
    local_w, loss_before, loss_after = client_round(
        round_key, global_params["w"], label_std)
    info = ClientInfo(
        client_ids=jnp.arange(K), num_examples=jnp.full(K, NUM_EXAMPLES,
                                                        jnp.float32),
        mask=jnp.ones(K), loss_before=loss_before, loss_after=loss_after,
        round=jnp.zeros((), jnp.int32), key=round_key)
    global_params, state, metrics = aggregate(global_params, {"w": local_w},
                                              info, state)
    weight = jnp.sum(metrics["client_weights"] * corrupted) / 2
    return (global_params, state), weight

  (_, state), weights = jax.lax.scan(
      one_round, ({"w": jnp.zeros(DIM)}, state),
      jax.random.split(key, num_rounds))
  return state, weights


def test_agent_down_weights_corrupted_clients():
  trainer = feddrl(K, config=CONFIG)
  decider = feddrl(K, config=CONFIG, explore=False, learn=False)
  agent = make_agent(K, CONFIG)

  def experiment(seed_key):
    key_pos, key_agent, key_rng, key_train, key_eval = jax.random.split(
        seed_key, 5)
    label_std = jnp.where(jax.random.permutation(key_pos, K) < 2,
                          CORRUPT_STD, CLEAN_STD)
    # Every seed its own networks and RNG (vmapped init).
    state = trainer.init({"w": jnp.zeros(DIM)})._replace(
        agent=agent.init(key_agent), key=key_rng)
    state, train_weights = run_rounds(trainer.aggregate, state, key_train,
                                      TRAIN_ROUNDS, label_std)
    _, eval_weights = run_rounds(decider.aggregate, state, key_eval,
                                 EVAL_ROUNDS, label_std)
    return train_weights[:20].mean(), eval_weights.mean()

  seeds = jax.random.split(jax.random.PRNGKey(0), NUM_SEEDS)
  # One large program (3 x 250 rounds of the agent), run for well under a
  # second: compiled fast (its checks are on what the agent learns).
  first_rounds, learned = tu.compiled_fast(jax.vmap(experiment), seeds)(
      seeds)
  first_rounds, learned = np.asarray(first_rounds), np.asarray(learned)
  fedavg_weight = 1.0 / K
  # Before learning the agent is about as fair as FedAvg ...
  np.testing.assert_array_less(0.6 * fedavg_weight, first_rounds)
  # ... afterwards every seed gives the corrupted clients clearly less.
  np.testing.assert_array_less(learned, 0.5 * fedavg_weight)
  assert learned.mean() < 0.25 * fedavg_weight, learned
