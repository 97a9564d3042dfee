"""FedDRL's one-stage aggregator: the alpha-weighted aggregate (Eq. (4)),
padding, state and reward (Eq. (7)), the delayed transition, the
decide-only mode, checkpointing, validation and the registry; the learning
test lives in test_aggregator_learning.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from fedjax_agg import aggregators
from fedjax_agg.aggregators._feddrl import feddrl
from fedjax_agg.aggregators._feddrl.aggregator import observation, reward_cost
from fedjax_agg.types import ClientInfo
from tests.aggregators._feddrl._util import CONFIG
from tests.aggregators._feddrl._util import K


DIM = 3


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
