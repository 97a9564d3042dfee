"""FedDRL's DDPG agent (Algorithm 1): critic steps, the TD loss against a
numpy forward pass, the soft update, TD priorities and their sampling.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg.aggregators._feddrl import make_agent
from fedjax_agg.aggregators._feddrl import replay
from tests.aggregators._feddrl._util import CONFIG
from tests.aggregators._feddrl._util import K


def random_batch(rng, size, agent_config=CONFIG, num=K):
  mu = rng.uniform(0, agent_config.max_mean, (size, num))
  sigma = agent_config.beta * mu * rng.uniform(0, 1, (size, num))
  return replay.Transition(
      state=jnp.asarray(rng.normal(size=(size, 3 * num)), jnp.float32),
      action=jnp.asarray(np.concatenate([mu, sigma], 1), jnp.float32),
      reward=jnp.asarray(rng.normal(size=(size,)), jnp.float32),
      next_state=jnp.asarray(rng.normal(size=(size, 3 * num)), jnp.float32))


@pytest.fixture(scope="module")
def agent():
  return make_agent(K, CONFIG)


def test_one_critic_step_lowers_the_td_loss_on_a_fixed_batch(agent):
  critic_step, td_loss = jax.jit(agent.critic_step), jax.jit(agent.td_loss)
  for seed in range(5):
    rng = np.random.default_rng(seed)
    state = agent.init(jax.random.PRNGKey(seed))
    batch = random_batch(rng, 32)
    new_state, loss = critic_step(state, batch)
    np.testing.assert_allclose(loss, td_loss(state, batch), rtol=1e-6)
    assert float(td_loss(new_state, batch)) < float(loss)
    # The critic step changes only the critic and its optimizer.
    for name in ("policy", "target_policy", "target_value"):
      for a, b in zip(jax.tree.leaves(getattr(state, name)),
                      jax.tree.leaves(getattr(new_state, name)), strict=True):
        np.testing.assert_array_equal(a, b)


def np_mlp(layers, x):
  for i, layer in enumerate(layers):
    x = x @ np.asarray(layer["w"], np.float64) + np.asarray(layer["b"])
    if i < len(layers) - 1:
      x = np.where(x > 0, x, 0.01 * x)  # LeakyReLU
  return x


def np_policy(params, s):
  h = np_mlp(params, s)
  h_mu = h[:, :K] - h[:, :K].mean(1, keepdims=True)
  mu = CONFIG.max_mean / (1 + np.exp(-h_mu))
  sigma = CONFIG.beta * mu / (1 + np.exp(-h[:, K:]))
  return np.concatenate([mu, sigma], 1)


def np_q(params, s, a):
  scaled = np.concatenate(
      [2 * a[:, :K] / CONFIG.max_mean - 1,
       2 * a[:, K:] / (CONFIG.beta * CONFIG.max_mean) - 1], 1)
  return np_mlp(params, np.concatenate([s, scaled], 1))[:, 0]


def test_td_loss_matches_a_numpy_forward_pass(agent):
  rng = np.random.default_rng(7)
  state = agent.init(jax.random.PRNGKey(7))
  batch = random_batch(rng, 6)
  s, a, r, s2 = (np.asarray(x, np.float64) for x in batch)
  # Alg. 1 line 5: y = r + gamma Q'(s', pi'(s')).
  y = r + CONFIG.discount * np_q(state.target_value, s2,
                                 np_policy(state.target_policy, s2))
  expected = np.mean((np_q(state.value, s, a) - y)**2)
  np.testing.assert_allclose(jax.jit(agent.td_loss)(state, batch), expected,
                             rtol=1e-4)


def test_soft_update_equals_the_formula(agent):
  rng = np.random.default_rng(0)
  state = agent.init(jax.random.PRNGKey(0))
  batch = random_batch(rng, 16)
  for _ in range(2):  # the second time targets differ from the mains
    new_state, _ = jax.jit(agent.update)(state, batch)
    rho = CONFIG.target_update
    for main, target, new_target in (
        (new_state.value, state.target_value, new_state.target_value),
        (new_state.policy, state.target_policy, new_state.target_policy)):
      for m, t, n in zip(jax.tree.leaves(main), jax.tree.leaves(target),
                         jax.tree.leaves(new_target), strict=True):
        # Lines 8-9 with rho weighing the main network (see agent.py).
        expected = rho * np.asarray(m, np.float64) + (1 - rho) * np.asarray(
            t, np.float64)
        np.testing.assert_allclose(n, expected, rtol=1e-6, atol=1e-7)
    state = new_state


@pytest.mark.parametrize("td_priority", ["paper", "target"])
def test_td_priorities_match_the_formula(td_priority):
  config = CONFIG._replace(td_priority=td_priority, priority_chunk=4)
  agent = make_agent(K, config)
  rng = np.random.default_rng(1)
  state = agent.init(jax.random.PRNGKey(1))
  buffer = replay.add_many(replay.init(16, 3 * K, 2 * K),
                           random_batch(rng, 11), jnp.ones(11, bool))
  priorities = np.asarray(jax.jit(agent.td_priorities)(state, buffer))
  s, a, r, s2 = (np.asarray(x[:11], np.float64) for x in buffer.data)
  if td_priority == "paper":  # Alg. 1 line 1 as printed
    next_q = np_q(state.value, s2, a)
  else:
    next_q = np_q(state.target_value, s2, np_policy(state.target_policy, s2))
  expected = np.abs(r + config.discount * next_q - np_q(state.value, s, a))
  np.testing.assert_allclose(priorities[:11], expected, rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_array_equal(priorities[11:], 0.0)


def test_td_priority_sampling_prefers_high_error_transitions(agent):
  rng = np.random.default_rng(2)
  state = agent.init(jax.random.PRNGKey(2))
  batch = random_batch(rng, 12)
  # Three transitions with huge rewards: huge TD errors for any critic.
  surprising = np.asarray([2, 7, 9])
  batch = batch._replace(reward=batch.reward.at[surprising].set(100.0))
  buffer = replay.add_many(replay.init(16, 3 * K, 2 * K), batch,
                           jnp.ones(12, bool))

  @jax.jit
  def draws(key):
    priorities = agent.td_priorities(state, buffer)
    probs = replay.rank_probabilities(priorities, buffer.size, 1.0)
    return replay.sample_indices(key, probs, 20_000)

  counts = np.bincount(np.asarray(draws(jax.random.PRNGKey(0))),
                       minlength=16)
  assert counts[12:].sum() == 0  # empty rows are never drawn
  # Ranks 1-3 carry (1 + 1/2 + 1/3) / H_12 = 59% of the mass.
  harmonic = np.sum(1.0 / np.arange(1, 13))
  np.testing.assert_allclose(counts[surprising].sum() / 20_000,
                             (1 + 1 / 2 + 1 / 3) / harmonic, atol=0.02)
  assert counts[surprising].min() > counts[np.setdiff1d(
      np.arange(12), surprising)].max()


def test_train_runs_algorithm_1_and_changes_every_network(agent):
  rng = np.random.default_rng(3)
  state = agent.init(jax.random.PRNGKey(3))
  buffer = replay.add_many(replay.init(16, 3 * K, 2 * K),
                           random_batch(rng, 10), jnp.ones(10, bool))
  new_state, metrics = jax.jit(agent.train)(state, buffer,
                                            jax.random.PRNGKey(0))
  for name in ("policy", "value", "target_policy", "target_value"):
    for a, b in zip(jax.tree.leaves(getattr(state, name)),
                    jax.tree.leaves(getattr(new_state, name)), strict=True):
      assert not np.array_equal(a, b)
  assert int(new_state.value_opt_state[0].count) == CONFIG.updates_per_round
  assert set(metrics) == {"critic_loss", "actor_q", "mean_priority"}
