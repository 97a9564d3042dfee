"""DP-FedAvg (McMahan et al., ICLR 2018) with adaptive clipping (Andrew et
al., NeurIPS 2021): golden tests against numpy, noise, streaming."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg import testing
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES
from tests.aggregators._util import flat
from tests.aggregators._util import garbage_cohort
from tests.aggregators._util import MASKS
from tests.aggregators._util import permute_info

K = 6


@functools.lru_cache(maxsize=None)
def _jitted(items=()):
  rule = aggregators.dp_fedavg(**dict(items))
  return rule, jax.jit(rule.aggregate)


def _run(global_params, clients, info, state=None, **kwargs):
  rule, aggregate = _jitted(tuple(sorted(kwargs.items())))
  state = rule.init(global_params) if state is None else state
  return aggregate(global_params, clients, info, state)


def np_dp_mean(updates, clip_norm):
  """McMahan et al. Alg. 1 without noise: clip, sum, divide by m."""
  norms = np.linalg.norm(updates, axis=1)
  clipped = updates * np.minimum(1.0, clip_norm / norms)[:, None]
  return clipped.sum(0) / len(updates), norms


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("clip_norm", [0.3, 5.0, 1e6])
def test_golden_without_noise(mask, clip_norm):
  global_params, clients, info, updates, _ = garbage_cohort(21, mask)
  out, state, metrics = _run(global_params, clients, info,
                             clip_norm=clip_norm, noise_multiplier=0.0)
  expected, norms = np_dp_mean(updates, clip_norm)
  np.testing.assert_allclose(flat(out) - flat(global_params), expected,
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(metrics["fraction_clipped"],
                             np.mean(norms > clip_norm))
  np.testing.assert_allclose(metrics["clip_norm"], clip_norm, rtol=1e-7)
  assert float(metrics["noise_stddev"]) == 0.0
  np.testing.assert_allclose(state.clip_norm, clip_norm, rtol=1e-7)


@pytest.mark.parametrize("mask", MASKS)
def test_adaptive_clip_norm_golden_over_three_rounds(mask):
  # Noise off (z = 0, so sigma_b = 0): the geometric update of Andrew et
  # al. Alg. 1 on the unclipped fraction, round after round.
  global_params, clients, info, updates, _ = garbage_cohort(22, mask)
  kwargs = dict(clip_norm=4.0, noise_multiplier=0.0, adaptive=True,
                target_quantile=0.3, clip_learning_rate=0.5)
  rule, aggregate = _jitted(tuple(sorted(kwargs.items())))
  params, state, clip = global_params, rule.init(global_params), 4.0
  for _ in range(3):
    new_params, state, metrics = aggregate(params, clients, info, state)
    round_updates = updates + flat(global_params) - flat(params)
    expected, norms = np_dp_mean(round_updates, clip)
    np.testing.assert_allclose(flat(new_params) - flat(params), expected,
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(metrics["clip_norm"], clip, rtol=1e-5)
    clip *= np.exp(-0.5 * (np.mean(norms <= clip) - 0.3))
    np.testing.assert_allclose(state.clip_norm, clip, rtol=1e-5)
    params = new_params


@pytest.mark.parametrize("scale,direction", [(0.01, -1), (10.0, 1)])
def test_adaptive_clip_norm_moves_toward_the_update_norms(scale, direction):
  global_params, clients, info, _, _ = garbage_cohort(
      23, [1, 1, 0, 1, 1, 1], scale=scale)
  # Every |update| is far below C = 1 (scale 0.01) or far above (10).
  _, state, _ = _run(global_params, clients, info, clip_norm=1.0,
                     noise_multiplier=0.0, adaptive=True)
  assert np.sign(float(state.clip_norm) - 1.0) == direction
  np.testing.assert_allclose(state.clip_norm,
                             np.exp(-0.2 * (0.5 if direction < 0 else -0.5)),
                             rtol=1e-6)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(K))
def test_no_noise_and_a_huge_bound_is_uniform_fedavg(cohort):
  global_params, clients, info = cohort
  out, _, _ = _run(global_params, clients, info, clip_norm=1e6,
                   noise_multiplier=0.0)
  real = np.asarray(info.mask) > 0
  expected = jax.tree.map(lambda c: np.asarray(c)[real].mean(0), clients)
  tu.assert_trees_close(out, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(K), perm_seed=st.integers(0, 2**31),
       noise_multiplier=st.sampled_from([0.0, 1.0]))
def test_permuting_the_clients_changes_nothing(cohort, perm_seed,
                                               noise_multiplier):
  # The noise comes from the round's key, not from the clients' order.
  global_params, clients, info = cohort
  perm = np.random.default_rng(perm_seed).permutation(K)
  out, _, _ = _run(global_params, clients, info, clip_norm=0.2,
                   noise_multiplier=noise_multiplier)
  p_out, _, _ = _run(global_params, tu.take_rows(clients, perm),
                     permute_info(info, perm), clip_norm=0.2,
                     noise_multiplier=noise_multiplier)
  tu.assert_trees_close(p_out, out, rtol=1e-5, atol=1e-5)


def _zero_updates(num_params, mask):
  global_params = {"w": jnp.zeros((num_params,), jnp.float32)}
  clients = {"w": jnp.zeros((len(mask), num_params), jnp.float32)}
  return global_params, clients, tu.make_info(
      np.arange(len(mask)), np.ones(len(mask)), mask, seed=4)


@pytest.mark.parametrize("clip_norm,noise_multiplier", [(2.0, 1.5),
                                                        (0.1, 0.7)])
def test_noise_standard_deviation_is_sigma_c_over_m(clip_norm,
                                                    noise_multiplier):
  mask = [1, 1, 0, 1, 0]  # m = 3
  global_params, clients, info = _zero_updates(100_000, mask)
  out, _, metrics = _run(global_params, clients, info, clip_norm=clip_norm,
                         noise_multiplier=noise_multiplier)
  expected = noise_multiplier * clip_norm / 3
  noise = np.asarray(out["w"], np.float64)
  np.testing.assert_allclose(noise.std(), expected, rtol=0.02)
  assert abs(noise.mean()) < 0.02 * expected
  np.testing.assert_allclose(metrics["noise_stddev"], expected, rtol=1e-6)
  # The noise is the round key's: another key, other noise.
  again, _, _ = _run(global_params, clients, info, clip_norm=clip_norm,
                     noise_multiplier=noise_multiplier)
  np.testing.assert_array_equal(again["w"], out["w"])
  other, _, _ = _run(global_params, clients,
                     info._replace(key=jax.random.key(5)),
                     clip_norm=clip_norm, noise_multiplier=noise_multiplier)
  assert np.abs(np.asarray(other["w"]) - noise).max() > expected


@pytest.mark.parametrize("noise_multiplier,count_stddev", [
    (1.0, None), (1.0, 5.0), (2.0, 1.5), (0.5, 10.0)])
def test_adaptive_update_noise_keeps_the_total_privacy(noise_multiplier,
                                                       count_stddev):
  # Andrew et al. Thm. 1: sigma_dw = (z^-2 - (2 sigma_b)^-2)^(-1/2).
  sigma_b = 5.0 * noise_multiplier if count_stddev is None else count_stddev
  sigma_dw = (noise_multiplier**-2 - (2 * sigma_b)**-2) ** -0.5
  global_params, clients, info = _zero_updates(100_000, [1, 1, 1, 1])
  kwargs = dict(clip_norm=0.5, noise_multiplier=noise_multiplier,
                adaptive=True)
  if count_stddev is not None:
    kwargs["clipped_count_stddev"] = count_stddev
  out, state, metrics = _run(global_params, clients, info, **kwargs)
  np.testing.assert_allclose(metrics["noise_stddev"], sigma_dw * 0.5 / 4,
                             rtol=1e-6)
  np.testing.assert_allclose(np.asarray(out["w"]).std(),
                             sigma_dw * 0.5 / 4, rtol=0.02)
  assert float(state.clip_norm) != 0.5  # the noised count moved C


def test_clipped_count_noise_too_small_for_the_budget_raises():
  with pytest.raises(ValueError, match="clipped_count_stddev"):
    aggregators.dp_fedavg(noise_multiplier=1.0, adaptive=True,
                          clipped_count_stddev=0.5)
  with pytest.raises(ValueError, match="clipped_count_stddev"):
    aggregators.dp_fedavg(noise_multiplier=1.0, adaptive=True,
                          clipped_count_stddev=0.1)
  # Without adaptive clipping the count is not released: no constraint.
  aggregators.dp_fedavg(noise_multiplier=1.0, clipped_count_stddev=0.1)
  aggregators.dp_fedavg(noise_multiplier=0.0, adaptive=True,
                        clipped_count_stddev=0.0)


@pytest.mark.parametrize("kwargs,arg", [
    ({"clip_norm": 0.0}, "clip_norm"),
    ({"noise_multiplier": -1.0}, "noise_multiplier"),
    ({"adaptive": 1}, "adaptive"),
    ({"target_quantile": 1.5}, "target_quantile"),
    ({"clip_learning_rate": -0.1}, "clip_learning_rate"),
    ({"clipped_count_stddev": -1.0}, "clipped_count_stddev"),
    ({"clipped_count_stddev": float("nan")}, "clipped_count_stddev"),
])
def test_bad_arguments_name_the_argument(kwargs, arg):
  with pytest.raises((ValueError, TypeError), match=arg):
    aggregators.dp_fedavg(**kwargs)


@pytest.mark.parametrize("noise_multiplier", [0.0, 1.3])
def test_streaming_form_equals_aggregate_with_garbage_padding(
    noise_multiplier):
  rule = aggregators.dp_fedavg(clip_norm=0.7,
                               noise_multiplier=noise_multiplier)
  assert rule.stream is not None
  streamed = jax.jit(functools.partial(tu.streamed_aggregate, rule))
  aggregate = jax.jit(rule.aggregate)
  global_params, clients, info, _, _ = garbage_cohort(24, [0, 1, 1, 0, 1, 1])
  state = rule.init(global_params)
  params = global_params
  for round_ in (1, 2):
    info = info._replace(round=jnp.asarray(round_, jnp.int32),
                         key=jax.random.key(round_))
    expected = aggregate(params, clients, info, state)
    tu.assert_trees_close(streamed(params, clients, info, state), expected,
                          rtol=2e-5, atol=2e-6)
    params, state, _ = expected


def test_adaptive_clipping_has_no_streaming_form():
  assert aggregators.dp_fedavg(adaptive=True).stream is None


def test_a_cohort_of_padding_only_without_noise_keeps_the_model():
  # An empty round is a round like any other (module docstring): with
  # z = 0 its update is 0, and the adaptive clip norm takes Andrew et al.'s
  # step with no unclipped client, C exp(eta_C gamma). (Until every round
  # had to add the noise it is accounted for, this test had the default
  # z = 1 and asserted that an empty round changed nothing.)
  global_params, clients, info, _, _ = garbage_cohort(25, [1] * K)
  kwargs = dict(adaptive=True, clip_norm=2.0, noise_multiplier=0.0)
  _, state, _ = _run(global_params, clients, info, **kwargs)
  empty = info._replace(mask=jnp.zeros((K,), jnp.float32))
  out, new_state, _ = _run(global_params, clients, empty, state, **kwargs)
  tu.assert_trees_close(out, global_params, rtol=0, atol=0)
  np.testing.assert_allclose(new_state.clip_norm,
                             float(state.clip_norm) * np.exp(0.2 * 0.5),
                             rtol=1e-6)


def np_clipped_sum(updates, clip_norm):
  """McMahan et al. Alg. 1's sum of clipped updates, [m, P] -> [P]."""
  norms = np.linalg.norm(updates, axis=1)
  scale = np.minimum(1.0, clip_norm / np.where(norms > 0, norms, 1.0))
  return (updates * scale[:, None]).sum(0), norms


EMPTY = [0] * K


@pytest.mark.parametrize("mask", MASKS + [EMPTY])
@pytest.mark.parametrize("expected_clients", [2.5, 9.0])
def test_expected_clients_is_the_denominator_whatever_the_cohort(
    mask, expected_clients):
  # McMahan et al. 2018's fixed denominator qN: m = 6, 4, 4, 1, 2, 0 real
  # participants, the same divisor; with sigma = 0 the update is
  # sum_k clipped dw_k / qN, and the adaptive count fraction uses qN too.
  global_params, clients, info, updates, _ = garbage_cohort(26, mask)
  kwargs = dict(clip_norm=1.5, noise_multiplier=0.0, adaptive=True,
                target_quantile=0.4, clip_learning_rate=0.3,
                expected_clients=expected_clients)
  out, state, metrics = _run(global_params, clients, info, **kwargs)
  clipped_sum, norms = np_clipped_sum(updates, 1.5)
  np.testing.assert_allclose(flat(out) - flat(global_params),
                             clipped_sum / expected_clients, rtol=1e-5,
                             atol=1e-6)
  unclipped = np.sum(norms <= 1.5)
  np.testing.assert_allclose(
      state.clip_norm,
      1.5 * np.exp(-0.3 * (unclipped / expected_clients - 0.4)), rtol=1e-6)
  assert float(metrics["noise_stddev"]) == 0.0


@pytest.mark.parametrize("adaptive", [False, True])
def test_noise_with_expected_clients_does_not_depend_on_who_was_drawn(
    adaptive):
  # 60 rounds, each a fresh key and a random Poisson-like mask (m from 0 to
  # K): the update minus the numpy clipped sum / qN is the noise alone,
  # N(0, (sigma_dw C / qN)^2) per coordinate for every m. Its sample
  # variance over n values is within 5 sqrt(2 / n) of that, relatively
  # (chi-square with n degrees of freedom), pooled and per m.
  clip_norm, z, expected_clients, rounds = 0.8, 1.3, 3.0, 60
  sigma = z if not adaptive else (z**-2 - (2 * 5 * z)**-2) ** -0.5
  stddev = sigma * clip_norm / expected_clients
  rng = np.random.default_rng(27)
  by_m = {}
  for round_ in range(rounds):
    mask = (rng.random(K) < 0.5).astype(int).tolist()
    global_params, clients, info, updates, _ = garbage_cohort(
        1000 + round_, mask)
    info = info._replace(key=jax.random.key(round_))
    out, _, metrics = _run(global_params, clients, info,
                           clip_norm=clip_norm, noise_multiplier=z,
                           adaptive=adaptive,
                           expected_clients=expected_clients)
    np.testing.assert_allclose(metrics["noise_stddev"], stddev, rtol=1e-6)
    clipped_sum, _ = np_clipped_sum(updates, clip_norm)
    noise = flat(out) - flat(global_params) - clipped_sum / expected_clients
    by_m.setdefault(sum(mask), []).append(noise)
  assert len(by_m) >= 4  # several realised cohort sizes
  pooled = np.concatenate([np.concatenate(v) for v in by_m.values()])
  assert abs(pooled.mean()) < 5 * stddev / np.sqrt(pooled.size)
  for sample in [pooled] + [np.concatenate(v) for v in by_m.values()]:
    variance = np.mean(np.square(sample))  # known mean 0
    assert abs(variance / stddev**2 - 1) < 5 * np.sqrt(2 / sample.size)


@pytest.mark.parametrize("expected_clients", [None, 4.0])
@pytest.mark.parametrize("adaptive", [False, True])
def test_an_empty_round_adds_the_noise_it_is_accounted_for(expected_clients,
                                                           adaptive):
  # No real participant (padding rows of NaN and 1e30): the update is the
  # noise alone, sigma_dw C / D with D = qN, or 1 without expected_clients.
  clip_norm, z = 0.5, 1.2
  sigma = z if not adaptive else (z**-2 - (2 * 5 * z)**-2) ** -0.5
  stddev = sigma * clip_norm / (expected_clients or 1.0)
  global_params = {"w": jnp.zeros((100_000,), jnp.float32)}
  clients = {"w": jnp.stack([jnp.full((100_000,), v, jnp.float32)
                             for v in (np.nan, 1e30, np.nan)])}
  info = tu.make_info(np.arange(3), np.ones(3), [0, 0, 0], seed=8)
  kwargs = dict(clip_norm=clip_norm, noise_multiplier=z, adaptive=adaptive,
                expected_clients=expected_clients)
  out, state, metrics = _run(global_params, clients, info, **kwargs)
  noise = np.asarray(out["w"], np.float64)
  assert abs(noise.mean()) < 5 * stddev / np.sqrt(noise.size)
  assert (abs(noise.var() / stddev**2 - 1)
          < 5 * np.sqrt(2 / noise.size))
  np.testing.assert_allclose(metrics["noise_stddev"], stddev, rtol=1e-6)
  assert float(metrics["fraction_clipped"]) == 0.0
  if adaptive:  # the noised count moved C
    assert float(state.clip_norm) != clip_norm
  # Without noise the same round leaves the model as it was.
  kwargs["noise_multiplier"] = 0.0
  out, _, _ = _run(global_params, clients, info, **kwargs)
  tu.assert_trees_close(out, global_params, rtol=0, atol=0)


def test_the_aggregator_carries_the_noise_it_adds():
  assert aggregators.dp_fedavg(noise_multiplier=0.7).noise_multiplier == 0.7
  rule = aggregators.dp_fedavg(noise_multiplier=1.1, adaptive=True,
                               expected_clients=20.0)
  assert rule.noise_multiplier == 1.1  # z of the round, not sigma_dw
  assert rule.expected_clients == 20.0
  assert aggregators.dp_fedavg().expected_clients is None
  assert aggregators.fedavg().noise_multiplier is None
  # Server optimizers over DP-FedAvg pass it on; over FedAvg there is none.
  for wrapped in (
      aggregators.with_server_optimizer(rule, optax.sgd(1.0)),
      aggregators.fedadam(base=rule),
      aggregators.fedavgm(base=rule)):
    assert wrapped.noise_multiplier == 1.1
    assert wrapped.expected_clients == 20.0
  assert aggregators.fedadam().noise_multiplier is None


@pytest.mark.parametrize("expected_clients", [None, 3.0])
def test_a_server_optimizer_keeps_the_noise_of_an_empty_round(
    expected_clients):
  # with_server_optimizer(rule, sgd(1)) is the rule: an empty round moves
  # the model by DP-FedAvg's noise, where the wrapper once kept it.
  rule = aggregators.dp_fedavg(clip_norm=0.5, noise_multiplier=1.0,
                               expected_clients=expected_clients)
  wrapped = aggregators.with_server_optimizer(rule, optax.sgd(1.0))
  global_params, clients, info, _, _ = garbage_cohort(28, [1] * K)
  empty = info._replace(mask=jnp.zeros((K,), jnp.float32))
  expected, _, _ = jax.jit(rule.aggregate)(
      global_params, clients, empty, rule.init(global_params))
  out, _, metrics = jax.jit(wrapped.aggregate)(
      global_params, clients, empty, wrapped.init(global_params))
  tu.assert_trees_close(out, expected, rtol=1e-6, atol=1e-6)
  noise = flat(out) - flat(global_params)
  assert np.abs(noise).max() > 0.1 * 0.5 / (expected_clients or 1.0)
  np.testing.assert_allclose(metrics["pseudo_gradient_norm"],
                             np.linalg.norm(noise), rtol=1e-5)
  # The streaming form agrees.
  streamed = jax.jit(functools.partial(tu.streamed_aggregate, wrapped))(
      global_params, clients, empty, wrapped.init(global_params))
  tu.assert_trees_close(streamed[0], out, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("value", [0.0, -2.0, float("nan"), float("inf")])
def test_expected_clients_must_be_positive(value):
  with pytest.raises(ValueError, match="expected_clients"):
    aggregators.dp_fedavg(expected_clients=value)
