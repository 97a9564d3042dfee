"""DP-FTRL (Kairouz et al., ICML 2021): golden tests against numpy FTRL
and an independent tree decomposition, the noise's covariance, padding,
restarts, and the accounting of its runs against dp_accounting.
"""

import functools
import pickle

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import simulation
from fedjax_agg.aggregators import _dp_fedavg
from fedjax_agg.config import Execution, Privacy
from tests import agg_testutil as tu
from tests._util import _direct_epsilons
from tests.aggregators._util import flat
from tests.aggregators._util import garbage_cohort
from tests.aggregators._util import MASKS
from tests.clients._util import _run_data, linear_model

K = 6
QUIET = Execution(clients_per_step=2, progress=False)


@functools.lru_cache(maxsize=None)
def _jitted(items=()):
  rule = aggregators.dp_ftrl(**dict(items))
  return rule, jax.jit(rule.aggregate)


def _rule(**kwargs):
  kwargs.setdefault("num_participants", K)
  return _jitted(tuple(sorted(kwargs.items())))


def _info(info, round_):
  # A fresh key every round, as the rounds give: the tree's noise must
  # come from its first round's key only.
  return info._replace(round=jnp.asarray(round_, jnp.int32),
                       key=jax.random.key(100 + round_))


def np_ftrl(clients, theta, mask, num_rounds, clip_norm, m, eta, gamma,
            restart_every):
  """Alg. 1 without noise (DP-FTRLM with gamma), restarts as App. D, on
  fixed client models [K, P]: the model after each round."""
  real = clients[np.asarray(mask) > 0]
  out = []
  for r in range(num_rounds):
    if r == 0 or (restart_every and r % restart_every == 0):
      theta0, gradient_sum, velocity = theta, 0.0, 0.0
    updates = real - theta
    norms = np.linalg.norm(updates, axis=1, keepdims=True)
    clipped = updates * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-30))
    gradient_sum = gradient_sum - clipped.sum(0) / m
    velocity = gamma * velocity + gradient_sum
    theta = theta0 - eta * velocity
    out.append(theta)
  return out


def dyadic_nodes(t):
  """The nodes (level, index) of [1, t]'s binary decomposition, greedily
  from the largest power of two."""
  nodes, start = [], 0
  for level in range(t.bit_length(), -1, -1):
    if start + 2 ** level <= t:
      nodes.append((level, start // 2 ** level))
      start += 2 ** level
  assert start == t
  return nodes


def node_noise(key, level, index, params, stddev):
  node_key = jax.random.fold_in(jax.random.fold_in(key, level), index)
  return flat(_dp_fedavg.gaussian_noise(node_key, params, stddev))


# ---------------------------------------------------------------------------
# The rule.


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("clip_norm,eta,gamma,restart_every", [
    (1e6, 1.0, 0.0, None), (0.4, 0.7, 0.0, None), (0.4, 1.3, 0.6, None),
    (0.4, 1.0, 0.5, 2), (2.0, 0.5, 0.0, 3)])
def test_golden_without_noise_over_rounds(mask, clip_norm, eta, gamma,
                                          restart_every):
  global_params, clients, info, _, _ = garbage_cohort(31, mask)
  rule, aggregate = _rule(clip_norm=clip_norm, server_learning_rate=eta,
                          momentum=gamma, restart_every=restart_every)
  real = np.flatnonzero(np.asarray(mask))
  expected = np_ftrl(tu.flat_rows(clients)[real], flat(global_params),
                     np.ones(len(real)), 6, clip_norm, K, eta, gamma,
                     restart_every)
  params, state = global_params, rule.init(global_params)
  for r in range(6):
    norms = np.linalg.norm(tu.flat_rows(clients)[real] - flat(params),
                           axis=1)
    params, state, metrics = aggregate(params, clients, _info(info, r + 1),
                                       state)
    np.testing.assert_allclose(flat(params), expected[r], rtol=1e-5,
                               atol=2e-5)
    np.testing.assert_allclose(metrics["fraction_clipped"],
                               np.mean(norms > clip_norm), atol=1e-6)
    assert float(metrics["noise_stddev"]) == 0.0
    position = r % restart_every + 1 if restart_every else r + 1
    assert int(state.tree_round) == position == metrics["tree_round"]


@pytest.mark.parametrize("mask", MASKS[:3])
def test_no_noise_unit_step_is_cumulative_clipped_fedavg(mask):
  # eta = 1, gamma = 0, z = 0: theta_t = theta_{t-1} + the clipped updates'
  # sum over m, round after round; m = the real participants gives their
  # mean when nothing is clipped.
  global_params, clients, info, _, _ = garbage_cohort(32, mask)
  real = np.flatnonzero(np.asarray(mask))
  rule, aggregate = _rule(clip_norm=1e6, num_participants=len(real))
  params, state = global_params, rule.init(global_params)
  for r in range(3):
    params, state, _ = aggregate(params, clients, _info(info, r + 1), state)
    np.testing.assert_allclose(flat(params),
                               tu.flat_rows(clients)[real].mean(0),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("restart_every,gamma", [(None, 0.0), (None, 0.5),
                                                 (3, 0.0), (4, 0.3)])
def test_noise_is_the_sum_of_the_dyadic_nodes(restart_every, gamma):
  # Zero updates (every client returns the broadcast model), so the model
  # moves by the noise alone: theta_t - theta_0 = -eta v_t with
  # v_t = gamma v_{t-1} + the noise of t's dyadic nodes in its tree,
  # drawn from the key of the tree's first round.
  z, clip, eta, m = 1.3, 0.5, 0.8, 4
  rng = np.random.default_rng(33)
  global_params = tu.make_params(rng)
  mask = [1, 0, 1, 1, 0, 1]
  info = tu.make_info(np.arange(K), np.ones(K), mask)
  rule, aggregate = _rule(clip_norm=clip, noise_multiplier=z,
                          server_learning_rate=eta, momentum=gamma,
                          num_participants=m, restart_every=restart_every)
  stddev = z * clip / m
  params, state = global_params, rule.init(global_params)
  theta0, velocity = flat(global_params), 0.0
  for r in range(9):
    position = r % restart_every + 1 if restart_every else r + 1
    if position == 1:
      tree_key, theta0, velocity = jax.random.key(100 + r + 1), flat(
          params), 0.0
    clients = tu.spoil_rows(tu.take_rows(tu.stack_rows([params]), [0] * K),
                            [1, 4])
    params, state, metrics = aggregate(params, clients, _info(info, r + 1),
                                       state)
    noise = sum(node_noise(tree_key, level, index, global_params, stddev)
                for level, index in dyadic_nodes(position))
    velocity = gamma * velocity + noise
    np.testing.assert_allclose(flat(params) - theta0, -eta * velocity,
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(
        metrics["noise_stddev"],
        stddev * np.sqrt(len(dyadic_nodes(position))), rtol=1e-6)


def test_noise_covariance_is_the_shared_nodes():
  # Independent of how the nodes draw their noise: across keys, the
  # noise at rounds t and s has covariance (z C / m)^2 |B(t) & B(s)|.
  rounds, z, clip, m = 8, 1.0, 1.0, 2
  rng = np.random.default_rng(34)
  global_params = tu.make_params(rng)
  info = tu.make_info(np.arange(2), np.ones(2))
  rule = aggregators.dp_ftrl(clip_norm=clip, noise_multiplier=z,
                             num_participants=m)

  def trajectory(key):
    def one_round(carry, r):
      params, state = carry
      clients = tu.take_rows(tu.stack_rows([params]), [0, 0])
      params, state, _ = rule.aggregate(params, clients, info._replace(
          key=jax.random.fold_in(key, r)), state)
      move = (jax.flatten_util.ravel_pytree(params)[0]
              - jax.flatten_util.ravel_pytree(global_params)[0])
      return (params, state), move

    # The rounds as a scan: one traced round, not eight.
    _, moves = jax.lax.scan(one_round, (global_params,
                                        rule.init(global_params)),
                            jnp.arange(rounds))
    return moves

  keys = jax.random.split(jax.random.key(7), 400)
  moves = np.asarray(jax.jit(jax.vmap(trajectory))(keys)) / (z * clip / m)
  samples = moves.transpose(1, 0, 2).reshape(rounds, -1)  # [T, keys x P]
  empirical = samples @ samples.T / samples.shape[1]
  nodes = [set(dyadic_nodes(t)) for t in range(1, rounds + 1)]
  shared = np.array([[len(a & b) for b in nodes] for a in nodes])
  np.testing.assert_allclose(empirical, shared, atol=0.2)


def test_padding_garbage_changes_nothing_with_noise():
  mask = [1, 0, 1, 1, 0, 1]
  global_params, dirty, info, _, _ = garbage_cohort(35, mask)
  clean = jax.tree.map(
      lambda d, g: jnp.where(
          (jnp.asarray(mask) > 0).reshape((-1,) + (1,) * g.ndim), d, g[None]),
      dirty, global_params)
  rule, aggregate = _rule(clip_norm=0.3, noise_multiplier=1.0, momentum=0.4,
                          restart_every=2)
  runs = []
  for clients in (clean, dirty):
    params, state = global_params, rule.init(global_params)
    for r in range(3):
      params, state, _ = aggregate(params, clients, _info(info, r + 1),
                                   state)
    runs.append((params, state))
  tu.assert_trees_close(runs[1], runs[0], rtol=0, atol=0)
  assert np.all(np.isfinite(flat(runs[1][0])))


def test_empty_rounds_advance_the_tree_and_add_noise():
  global_params, clients, info, _, _ = garbage_cohort(36, [1] * K)
  empty = info._replace(mask=jnp.zeros((K,), jnp.float32))
  for z in (0.0, 1.0):
    rule, aggregate = _rule(noise_multiplier=z)
    params, state, _ = aggregate(global_params, clients, _info(info, 1),
                                 rule.init(global_params))
    out, new_state, _ = aggregate(params, clients, _info(empty, 2), state)
    assert int(new_state.tree_round) == 2
    if z == 0:  # the model stays, to the bit
      tu.assert_trees_close(out, params, rtol=0, atol=0)
    else:
      assert np.abs(flat(out) - flat(params)).max() > 1e-3


def test_noise_multiplier_carries_the_tree_to_the_accounting():
  rule = aggregators.dp_ftrl(noise_multiplier=1.5, num_participants=3,
                             restart_every=8)
  z = rule.noise_multiplier
  assert isinstance(z, aggregators.TreeAggregationNoise)
  assert float(z) == 1.5 and z.restart_every == 8
  assert rule.expected_clients == 3
  again = pickle.loads(pickle.dumps(z))
  assert float(again) == 1.5 and again.restart_every == 8
  # Server optimizers over the rule pass it on.
  wrapped = aggregators.fedavgm(momentum=0.5, base=rule)
  assert wrapped.noise_multiplier is z
  # Built with a traced z (a sweep's grid), the rule still runs.
  rng = np.random.default_rng(37)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 2)
  info = tu.make_info([0, 1], [1.0, 1.0])

  def step(noise):
    built = aggregators.dp_ftrl(noise_multiplier=noise, num_participants=2)
    return built.aggregate(global_params, clients, info,
                           built.init(global_params))[0]
  rule, aggregate = _rule(noise_multiplier=0.7, num_participants=2)
  tu.assert_trees_close(
      jax.jit(step)(0.7),
      aggregate(global_params, clients, info, rule.init(global_params))[0])


@pytest.mark.parametrize("kwargs,name", [
    (dict(clip_norm=0.0), "clip_norm"),
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(server_learning_rate=0.0), "server_learning_rate"),
    (dict(momentum=1.0), "momentum"),
    (dict(num_participants=0), "num_participants"),
    (dict(num_participants=2.5), "num_participants"),
    (dict(restart_every=0), "restart_every"),
    (dict(restart_every=1.5), "restart_every"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
  kwargs.setdefault("num_participants", 3)
  with pytest.raises((ValueError, TypeError), match=name):
    aggregators.dp_ftrl(**kwargs)


# ---------------------------------------------------------------------------
# Accounting.


def _run(priv, num_rounds=5, restart_every=2, z=1.1):
  data, test = _run_data()
  return simulation.run(
      linear_model(), data, test,
      aggregators.dp_ftrl(clip_norm=1.0, noise_multiplier=z,
                          num_participants=3, restart_every=restart_every),
      num_rounds=num_rounds, participation=0.5, execution=QUIET,
      privacy=priv, seed=0)


def _cohorts(history):
  return np.array([row["client_ids"] for row in history.client_rows])


def test_recorded_epsilon_is_the_trees_of_the_drawn_cohorts():
  result = _run(Privacy(delta=1e-5))
  cohorts = _cohorts(result.history)
  assert cohorts.shape == (5, 3)
  got = [row["epsilon"] for row in result.history.rows[1:]]
  want = _direct_epsilons(1.1, cohorts, 2, 1e-5)
  np.testing.assert_allclose(got, want, rtol=1e-9)
  recorded = result.history.config["privacy"]
  assert recorded["mechanism"] == "tree_aggregation"
  assert recorded["neighboring_relation"] == "zero_out"
  assert recorded["restart_every"] == 2
  assert recorded["noise_multiplier"] == pytest.approx(1.1)
  assert recorded["final_epsilon"] == pytest.approx(want[-1], rel=1e-9)
  assert recorded["max_participations"] == max(
      int(np.max(np.unique(cohorts[s:s + 2], return_counts=True)[1]))
      for s in range(0, 5, 2))
  # Without restarts the run is one tree.
  alone = _run(Privacy(delta=1e-5), num_rounds=3, restart_every=None)
  np.testing.assert_allclose(
      [row["epsilon"] for row in alone.history.rows[1:]],
      _direct_epsilons(1.1, _cohorts(alone.history), None, 1e-5),
      rtol=1e-9)


def test_target_epsilon_ends_a_tree_run_and_refusals():
  full = _run(Privacy(delta=1e-5))
  epsilons = [row["epsilon"] for row in full.history.rows[1:]]
  target = float((epsilons[2] + epsilons[3]) / 2)
  with pytest.warns(UserWarning, match="ends there"):
    result = _run(Privacy(delta=1e-5, target_epsilon=target))
  assert result.history.config["privacy"]["rounds_run"] == 3
  np.testing.assert_allclose(
      [row["epsilon"] for row in result.history.rows[1:]], epsilons[:3],
      rtol=1e-12)
  with pytest.raises(ValueError, match="single round"):
    _run(Privacy(delta=1e-5, target_epsilon=float(epsilons[0]) / 2))
  # No amplification by sampling: Poisson cohorts are refused.
  with pytest.raises(ValueError, match="sampling='poisson'"):
    _run(Privacy(delta=1e-5, sampling="poisson"))
  with pytest.raises(ValueError, match="differs"):
    _run(Privacy(noise_multiplier=2.0, delta=1e-5))


def test_sweep_members_are_accounted_from_their_seeds_cohorts():
  from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
  data, test = _run_data()
  members = sweep.run_sweep(
      lambda h: aggregators.dp_ftrl(noise_multiplier=h["noise"],
                                    num_participants=3, restart_every=2),
      {"noise": [0.8, 1.5]}, seeds=[0, 1], model=linear_model(), data=data,
      test_data=test, num_rounds=4, participation=0.5, execution=QUIET,
      privacy=Privacy(delta=1e-5))
  for member in members:
    cohorts = _cohorts(member.history)
    np.testing.assert_allclose(
        [row["epsilon"] for row in member.history.rows[1:]],
        _direct_epsilons(member.hparams["noise"], cohorts, 2, 1e-5),
        rtol=1e-6)
