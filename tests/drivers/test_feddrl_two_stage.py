"""FedDRL two-stage training: vmapped online workers, merged buffer, offline.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg.aggregators._feddrl import AgentConfig, make_agent
from fedjax_agg import drivers as two_stage_lib
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import ClientInfo
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

K, ROUNDS, WORKERS, CALLS = 3, 6, 2, 5
CONFIG = AgentConfig(policy_hidden=(16, 16, 16), value_hidden=(16, 16),
                     batch_size=4, updates_per_round=2, min_buffer_size=2)
ROUND_KWARGS = dict(training=LocalTraining(batch_size=3, learning_rate=0.2),
                    execution=Execution(clients_per_step=3))


@pytest.fixture(scope="module")
def result():
  data, *_ = tiny_data()
  return two_stage_lib.two_stage(
      tiny_model(), data, num_participants=K, online_rounds=ROUNDS,
      offline_calls=CALLS, num_workers=WORKERS, config=CONFIG, seed=0,
      **ROUND_KWARGS)


def test_workers_fill_one_merged_buffer(result):
  worker_buffers = result.workers.aggregator_state.buffer
  # Round 1 has no previous action: R - 1 experiences per worker.
  np.testing.assert_array_equal(worker_buffers.size, [ROUNDS - 1] * WORKERS)
  assert worker_buffers.capacity == ROUNDS  # sized to what can come
  assert int(result.buffer.size) == WORKERS * (ROUNDS - 1)
  for w in range(WORKERS):
    rows = slice(w * (ROUNDS - 1), (w + 1) * (ROUNDS - 1))
    for merged, own in zip(result.buffer.data, worker_buffers.data,
                           strict=True):
      np.testing.assert_array_equal(merged[rows], own[w, :ROUNDS - 1])
    # The buffer's rewards are the ones the worker's rounds reported.
    np.testing.assert_allclose(worker_buffers.data.reward[w, :ROUNDS - 1],
                               result.online_rewards[1:, w], rtol=1e-6)
  assert np.all(np.asarray(result.online_rewards[1:]) < 0)
  assert np.asarray(result.online_train_loss).shape == (ROUNDS, WORKERS)
  np.testing.assert_array_equal(result.workers.round, [ROUNDS] * WORKERS)


def test_workers_start_identical_and_drift_apart(result):
  agent = make_agent(K, CONFIG)
  initial = jax.jit(agent.init)(jax.random.split(jax.random.PRNGKey(0))[1])
  final = result.workers.aggregator_state.agent
  for start, end in zip(jax.tree.leaves(initial.policy),
                        jax.tree.leaves(final.policy), strict=True):
    assert not np.allclose(end[0], end[1])  # distinct individuals now
    assert not np.allclose(end[0], start)
  # Different runs: different cohorts, models and experiences.
  states = result.workers.aggregator_state.buffer.data.state
  assert not np.allclose(states[0], states[1])


def test_offline_stage_fits_the_merged_buffer(result):
  agent = make_agent(K, CONFIG)
  valid = int(result.buffer.size)
  rows = jax.tree.map(lambda x: x[:valid], result.buffer.data)
  td_loss = jax.jit(agent.td_loss)
  fresh = jax.jit(agent.init)(jax.random.split(jax.random.PRNGKey(2))[0])
  assert float(td_loss(result.agent, rows)) < float(td_loss(fresh, rows))
  assert result.offline_critic_loss.shape == (CALLS,)
  assert int(result.agent.value_opt_state[0].count) == (
      CALLS * CONFIG.updates_per_round)


def test_main_agent_decides(result):
  rule = two_stage_lib.decider(result, K, config=CONFIG)
  rng = np.random.default_rng(0)
  global_params = {"w": jnp.zeros(2)}
  info = ClientInfo(
      client_ids=jnp.arange(K), num_examples=jnp.full(K, 5.0),
      mask=jnp.ones(K), loss_before=jnp.asarray(rng.uniform(1, 2, K)),
      loss_after=jnp.asarray(rng.uniform(0.5, 1, K)),
      round=jnp.ones((), jnp.int32), key=jax.random.key(0))
  state = rule.init(global_params)
  _, new_state, metrics = jax.jit(rule.aggregate)(
      global_params, {"w": jnp.asarray(rng.normal(size=(K, 2)))}, info, state)
  np.testing.assert_allclose(np.sum(metrics["client_weights"]), 1.0,
                             rtol=1e-6)
  # The main agent's action, no exploration; deciding leaves it unchanged.
  agent = make_agent(K, CONFIG)
  mu, sigma = agent.networks.policy_apply(result.agent.policy,
                                          new_state.last_state)
  np.testing.assert_allclose(metrics["mu"], mu, rtol=1e-6)
  np.testing.assert_allclose(metrics["sigma"], sigma, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(result.agent),
                  jax.tree.leaves(new_state.agent), strict=True):
    np.testing.assert_array_equal(a, b)


def test_bad_arguments_raise():
  data, *_ = tiny_data()
  with pytest.raises(ValueError, match="num_workers"):
    two_stage_lib.two_stage(tiny_model(), data, num_participants=K,
                            online_rounds=2, offline_calls=1, num_workers=0,
                            **ROUND_KWARGS)
  with pytest.raises(ValueError, match="num_participants"):
    two_stage_lib.two_stage(tiny_model(), data, num_participants=9,
                            online_rounds=2, offline_calls=1,
                            **ROUND_KWARGS)
