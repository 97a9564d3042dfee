"""FedDRL: impact factors, state/reward, replay, DDPG steps, checkpointing.

Formulas are checked against independent numpy computations (Eq. (5)-(7),
the soft update, TD priorities, rank sampling, ring-buffer writes); the
learning test lives in test_feddrl_learning.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg.aggregators._feddrl import AgentConfig, feddrl, make_agent
from fedjax_agg.aggregators._feddrl import networks, replay
from fedjax_agg.aggregators._feddrl.aggregator import observation, reward_cost
from fedjax_agg.types import ClientInfo

K = 4
DIM = 3
CONFIG = AgentConfig(policy_hidden=(16, 16, 16), value_hidden=(16, 16),
                     buffer_capacity=16, batch_size=8, updates_per_round=2,
                     min_buffer_size=3, beta=0.4, max_mean=3.0)


def np_softmax(z):
  e = np.exp(z - z.max())
  return e / e.sum()


def make_info(rng, mask=None, num=K):
  mask = np.ones(num) if mask is None else np.asarray(mask, np.float32)
  return ClientInfo(
      client_ids=jnp.arange(num, dtype=jnp.int32),
      num_examples=jnp.asarray(rng.integers(1, 50, num), jnp.float32),
      mask=jnp.asarray(mask, jnp.float32),
      loss_before=jnp.asarray(rng.uniform(0.1, 3.0, num), jnp.float32),
      loss_after=jnp.asarray(rng.uniform(0.05, 2.0, num), jnp.float32),
      round=jnp.ones((), jnp.int32), key=jax.random.key(0))


def make_clients(rng, num=K):
  return {"w": jnp.asarray(rng.normal(size=(num, DIM)), jnp.float32),
          "b": jnp.asarray(rng.normal(size=(num,)), jnp.float32)}


GLOBAL = {"w": jnp.zeros(DIM), "b": jnp.zeros(())}


@pytest.fixture(scope="module")
def rule():
  aggregator = feddrl(K, config=CONFIG)
  return aggregator, jax.jit(aggregator.aggregate)


@pytest.fixture(scope="module")
def decider():
  """A trained agent's mode: no exploration, no learning."""
  aggregator = feddrl(K, config=CONFIG, explore=False, learn=False)
  return aggregator, jax.jit(aggregator.aggregate)


def run_rounds(aggregate, state, num_rounds, seed, masks=None):
  """Rounds with random clients and losses; returns the per-round records."""
  rng = np.random.default_rng(seed)
  records = []
  global_params = GLOBAL
  for t in range(num_rounds):
    info = make_info(rng, None if masks is None else masks[t])
    clients = make_clients(rng)
    new_global, state, metrics = aggregate(global_params, clients, info,
                                           state)
    records.append((global_params, clients, info, new_global, state,
                    metrics))
    global_params = new_global
  return state, records


# ---------------------------------------------------------------------------
# Eq. (4)-(6): impact factors and the aggregate.


@given(seed=st.integers(0, 10_000),
       mask=st.lists(st.booleans(), min_size=K, max_size=K))
def test_impact_factors_are_a_masked_softmax_of_the_gaussian_sample(seed,
                                                                    mask):
  rng = np.random.default_rng(seed)
  mu = rng.uniform(0, 3, K).astype(np.float32)
  sigma = (0.4 * mu * rng.uniform(0, 1, K)).astype(np.float32)
  mask = np.asarray(mask, np.float32)
  key = jax.random.PRNGKey(seed)
  alpha = np.asarray(jax.jit(networks.impact_factors)(key, mu, sigma, mask))
  sample = mu + sigma * np.asarray(jax.random.normal(key, (K,)))
  expected = np.zeros(K)
  if mask.any():
    expected[mask > 0] = np_softmax(sample[mask > 0].astype(np.float64))
  np.testing.assert_allclose(alpha, expected, rtol=1e-5, atol=1e-7)


def test_aggregate_is_the_alpha_weighted_sum_with_constraints(rule):
  aggregator, aggregate = rule
  masks = [[1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 1, 1],
           [1, 1, 0, 1], [0, 0, 1, 0], [1, 1, 1, 1], [1, 0, 1, 1]]
  _, records = run_rounds(aggregate, aggregator.init(GLOBAL), len(masks), 0,
                          masks)
  for _, clients, info, new_global, _, metrics in records:
    alpha = np.asarray(metrics["client_weights"], np.float64)
    mask = np.asarray(info.mask) > 0
    assert np.all(alpha[mask] > 0) and np.all(alpha[~mask] == 0)
    np.testing.assert_allclose(alpha.sum(), 1.0, rtol=1e-6)
    mu, sigma = np.asarray(metrics["mu"]), np.asarray(metrics["sigma"])
    # Eq. (6), also after exploration noise.
    assert np.all(sigma <= CONFIG.beta * mu + 1e-7) and np.all(sigma >= 0)
    assert np.all((mu >= 0) & (mu <= CONFIG.max_mean))
    for name in ("w", "b"):  # Eq. (4)
      expected = np.tensordot(alpha, np.asarray(clients[name], np.float64),
                              axes=(0, 0))
      np.testing.assert_allclose(new_global[name], expected, rtol=1e-5,
                                 atol=1e-6)
  # The buffer filled and learning ran.
  assert int(records[-1][-1]["buffer_size"]) == len(masks) - 1
  assert float(records[-1][-1]["critic_loss"]) > 0


def test_smaller_cohort_equals_padded_cohort(decider):
  aggregator, aggregate = decider
  rng = np.random.default_rng(3)
  small_info, small_clients = make_info(rng, num=3), make_clients(rng, 3)
  # The same cohort with a 4th, padding row of garbage.
  pad = lambda x, value: jnp.concatenate([x, jnp.full((1,), value, x.dtype)])
  padded_info = small_info._replace(
      client_ids=pad(small_info.client_ids, 0),
      num_examples=pad(small_info.num_examples, 1e6),
      mask=pad(small_info.mask, 0.0),
      loss_before=pad(small_info.loss_before, 50.0),
      loss_after=pad(small_info.loss_after, 50.0))
  padded_clients = jax.tree.map(lambda x: jnp.concatenate([x, x[:1] + 1e3]),
                                small_clients)
  state = aggregator.init(GLOBAL)
  small = aggregate(GLOBAL, small_clients, small_info, state)
  padded = aggregate(GLOBAL, padded_clients, padded_info, state)
  np.testing.assert_allclose(small[0]["w"], padded[0]["w"], rtol=1e-6)
  np.testing.assert_array_equal(small[2]["client_weights"],
                                padded[2]["client_weights"][:3])
  assert padded[2]["client_weights"][3] == 0
  for a, b in zip(jax.tree.leaves(small[1]), jax.tree.leaves(padded[1]),
                  strict=True):
    np.testing.assert_array_equal(a, b)


def test_cohort_of_padding_only_keeps_model_and_state(rule):
  aggregator, aggregate = rule
  state, _ = run_rounds(aggregate, aggregator.init(GLOBAL), 4, 6)
  rng = np.random.default_rng(6)
  info = make_info(rng, [0, 0, 0, 0])
  out, new_state, metrics = aggregate(GLOBAL, make_clients(rng), info, state)
  for a, b in zip(jax.tree.leaves((out, new_state)),
                  jax.tree.leaves((GLOBAL, state)), strict=True):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(metrics["client_weights"], 0.0)


# ---------------------------------------------------------------------------
# State, reward (Eq. (7)) and the delayed transition.


def np_observation(info, transform="log"):
  mask = np.asarray(info.mask) > 0
  n = np.where(mask, np.asarray(info.num_examples), 0.0)
  f = np.log if transform == "log" else (lambda x: x)
  logs = lambda x: np.where(mask, f(np.asarray(x)), 0.0)
  return np.concatenate([logs(info.loss_before), logs(info.loss_after),
                         n / n.sum()])


def np_cost(losses, mask):
  real = np.asarray(losses)[np.asarray(mask) > 0]
  return real.mean() + real.max() - real.min()


def test_observation_and_reward_cost_match_numpy():
  rng = np.random.default_rng(1)
  for mask in ([1, 1, 1, 1], [0, 1, 1, 0], [1, 0, 0, 0]):
    info = make_info(rng, mask)
    np.testing.assert_allclose(jax.jit(observation)(info),
                               np_observation(info), rtol=1e-6)
    np.testing.assert_allclose(
        jax.jit(observation, static_argnums=1)(info, "raw"),
        np_observation(info, "raw"), rtol=1e-6)
    np.testing.assert_allclose(
        jax.jit(reward_cost)(info.loss_before, info.mask),
        np_cost(info.loss_before, mask), rtol=1e-6)


def test_transition_of_round_t_is_stored_at_round_t_plus_1(rule):
  aggregator, aggregate = rule
  _, records = run_rounds(aggregate, aggregator.init(GLOBAL), 3, 2)
  (_, _, info1, _, state1, m1), (_, _, info2, _, state2, m2) = records[:2]
  assert int(state1.buffer.size) == 0 and float(m1["reward"]) == 0.0
  assert int(state2.buffer.size) == 1
  row = jax.tree.map(lambda x: np.asarray(x[0]), state2.buffer.data)
  np.testing.assert_allclose(row.state, np_observation(info1), rtol=1e-6)
  np.testing.assert_array_equal(
      row.action, np.concatenate([m1["mu"], m1["sigma"]]))
  # Eq. (7) on the new global model's losses, negated: lower cost, higher
  # reward.
  expected_reward = -np_cost(info2.loss_before, info2.mask)
  np.testing.assert_allclose(row.reward, expected_reward, rtol=1e-6)
  np.testing.assert_allclose(m2["reward"], expected_reward, rtol=1e-6)
  np.testing.assert_allclose(row.next_state, np_observation(info2),
                             rtol=1e-6)


def test_decide_only_mode_keeps_agent_and_buffer(rule, decider):
  aggregator, aggregate = rule
  state, _ = run_rounds(aggregate, aggregator.init(GLOBAL), 5, 4)
  new_state, _ = run_rounds(decider[1], state, 2, 5)
  for a, b in zip(jax.tree.leaves((state.agent, state.buffer)),
                  jax.tree.leaves((new_state.agent, new_state.buffer)),
                  strict=True):
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------
# Algorithm 1: critic, soft update, TD priorities.


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


@given(priorities=st.lists(st.floats(0, 10), min_size=8, max_size=8),
       size=st.integers(1, 8), exponent=st.sampled_from([0.0, 0.5, 1.0]))
def test_rank_probabilities_match_numpy(priorities, size, exponent):
  priorities = np.asarray(priorities, np.float32)
  probs = np.asarray(replay.rank_probabilities(
      jnp.asarray(priorities), jnp.asarray(size), exponent))
  order = np.argsort(-priorities[:size], kind="stable")
  weights = np.arange(1, size + 1, dtype=np.float64)**-exponent
  expected = np.zeros(8)
  expected[order] = weights / weights.sum()
  np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-7)


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


# ---------------------------------------------------------------------------
# Replay buffer.


def numbered(n, start=0):
  """Transitions whose every field holds its index (to track rows)."""
  idx = np.arange(start, start + n, dtype=np.float32)
  return replay.Transition(
      state=jnp.asarray(np.repeat(idx[:, None], 2, 1)),
      action=jnp.asarray(np.repeat(idx[:, None], 3, 1)),
      reward=jnp.asarray(idx),
      next_state=jnp.asarray(np.repeat(idx[:, None], 2, 1) + 0.5))


def test_ring_buffer_wraps_at_capacity():
  capacity = 5
  buffer = replay.init(capacity, 2, 3)
  add = jax.jit(replay.add)
  rows = numbered(8)
  for i in range(8):
    buffer = add(buffer, jax.tree.map(lambda x, i=i: x[i], rows))
    assert int(buffer.size) == min(i + 1, capacity)
    assert int(buffer.write_index) == (i + 1) % capacity
  # Rows 5, 6, 7 overwrote rows 0, 1, 2: [5, 6, 7, 3, 4].
  np.testing.assert_array_equal(buffer.data.reward, [5, 6, 7, 3, 4])
  np.testing.assert_array_equal(buffer.data.next_state[:, 0],
                                [5.5, 6.5, 7.5, 3.5, 4.5])
  # An invalid transition changes nothing.
  same = add(buffer, jax.tree.map(lambda x: x[0], rows), False)
  for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(buffer), strict=True):
    np.testing.assert_array_equal(a, b)


@given(first=st.lists(st.booleans(), min_size=9, max_size=9),
       second=st.lists(st.booleans(), min_size=9, max_size=9))
def test_add_many_equals_adding_one_by_one(first, second):
  capacity = 4
  buffer = replay.init(capacity, 2, 3)
  rewards, pointer, size = np.zeros(capacity), 0, 0  # numpy reference
  for start, valid in ((0, first), (9, second)):
    rows = numbered(9, start)
    buffer = add_many_jit(buffer, rows, jnp.asarray(valid))
    for i in np.flatnonzero(valid):
      rewards[pointer] = start + i
      pointer, size = (pointer + 1) % capacity, min(size + 1, capacity)
  np.testing.assert_array_equal(buffer.data.reward, rewards)
  np.testing.assert_array_equal(buffer.data.state[:, 0], rewards)
  np.testing.assert_array_equal(buffer.data.next_state[:size, 1],
                                rewards[:size] + 0.5)
  assert int(buffer.write_index) == pointer and int(buffer.size) == size


add_many_jit = jax.jit(replay.add_many)


def test_merge_keeps_every_worker_valid_row():
  workers = []
  for start, count in ((0, 3), (100, 5)):
    buffer = replay.add_many(replay.init(6, 2, 3), numbered(count, start),
                             jnp.ones(count, bool))
    workers.append(buffer)
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *workers)
  merged = replay.merge(stacked, capacity=10)
  assert int(merged.size) == 8 and int(merged.write_index) == 8
  np.testing.assert_array_equal(merged.data.reward[:8],
                                [0, 1, 2, 100, 101, 102, 103, 104])
  small = replay.merge(stacked, capacity=4)  # keeps the last 4
  np.testing.assert_array_equal(np.sort(small.data.reward),
                                [101, 102, 103, 104])


# ---------------------------------------------------------------------------
# Checkpointing, vmapping, validation.


def test_state_round_trips_through_a_checkpoint_bit_identically(rule,
                                                                tmp_path):
  aggregator, aggregate = rule
  state, _ = run_rounds(aggregate, aggregator.init(GLOBAL), 6, 8)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "feddrl", state)
  checkpointer.wait_until_finished()
  restored = checkpointer.restore(tmp_path / "feddrl",
                                  jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                               state))
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  continued, _ = run_rounds(aggregate, state, 4, 9)
  resumed, _ = run_rounds(aggregate, restored, 4, 9)
  for a, b in zip(jax.tree.leaves(continued), jax.tree.leaves(resumed),
                  strict=True):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match="num_participants"):
    feddrl(0)
  with pytest.raises(ValueError, match="beta"):
    feddrl(K, beta=1.5)
  with pytest.raises(ValueError, match="td_priority"):
    feddrl(K, td_priority="nope")
  with pytest.raises(ValueError, match="policy_hidden"):
    feddrl(K, policy_hidden=())
  with pytest.raises(TypeError, match="unknown arguments"):
    feddrl(K, learning_rate=0.1)
  aggregator = feddrl(2, config=CONFIG)
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="num_participants=2"):
    aggregator.aggregate(GLOBAL, make_clients(rng), make_info(rng),
                         jax.eval_shape(aggregator.init, GLOBAL))


def test_registered():
  assert aggregators.REGISTRY["feddrl"] is feddrl
  rule_ = aggregators.get("feddrl", num_clients=100, num_participants=3,
                          config=CONFIG)
  state = jax.eval_shape(rule_.init, GLOBAL)
  assert state.last_state.shape == (9,) and state.last_action.shape == (6,)
