"""``flower_compatible=True``: Krum and DP-FedAvg as Flower computes them.

Each switch is checked against an independent numpy computation of what
Flower's strategy does in ``aggregate_fit`` (the file and function are
named on each reference below), on cohorts with unequal ``num_examples``
and padding rows holding garbage (NaN or 1e30 parameters, a huge or NaN
example count), which Flower never sees: it receives the m real results
only, in cohort order. Flower's models are compared flattened: its norms
and distances are taken over all layers together and its averages are
per coordinate. Noise is compared with noise_multiplier 0, and its
standard deviation and timing separately.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from tests import agg_testutil as tu
from tests.aggregators._util import garbage_cohort
from tests.aggregators._util import K
from tests.aggregators._util import MASKS
from tests.aggregators._util import np_krum

flat = tu.flat


# ---------------------------------------------------------------------------
# Flower's computations, in numpy. A model is one flat float64 vector.


def flower_weighted_average(models, num_examples):
  """``aggregate`` (flwr/server/strategy/aggregate.py), which
  ``FedAvg.aggregate_fit`` (flwr/server/strategy/fedavg.py) applies:
  sum_k n_k w_k / sum_k n_k; None (no parameters) without results."""
  if len(models) == 0:
    return None
  weights = np.asarray(num_examples, np.float64)
  return weights @ np.stack(models) / weights.sum()


def flower_multikrum(models, num_examples, num_malicious, to_keep):
  """``aggregate_krum`` (flwr/server/strategy/aggregate.py), called by
  ``Krum.aggregate_fit`` (flwr/server/strategy/krum.py).

  Squared Euclidean distances between whole models; each model's score
  sums its max(1, m - f - 2) smallest distances to the others (its own 0
  is the first of the sorted row, skipped); ``to_keep`` = 0 returns the
  best model (Krum), otherwise the ``to_keep`` best are averaged with
  ``aggregate``'s num_examples weights. Valid here for to_keep <= m.
  """
  stacked = np.stack(models)
  num = len(models)
  distances = np.square(np.linalg.norm(
      stacked[:, None, :] - stacked[None, :, :], axis=-1))
  num_closest = max(1, num - num_malicious - 2)
  scores = np.array([np.sort(row)[1:1 + num_closest].sum()
                     for row in distances])
  if to_keep == 0:
    return models[int(np.argmin(scores))]
  kept = np.argsort(scores)[:to_keep]
  return flower_weighted_average([models[i] for i in kept],
                                 [num_examples[i] for i in kept])


def flower_clip(model, current, clipping_norm):
  """``compute_clip_model_update`` / ``compute_adaptive_clip_model_update``
  (flwr/common/differential_privacy.py): the update scaled by
  min(1, C / |update|), added back to the round's model; and the "norm
  bit", whether that factor was below 1 (the update was clipped)."""
  update = model - current
  norm = np.linalg.norm(update)
  factor = 1.0 if norm == 0 else min(1.0, clipping_norm / norm)
  return current + factor * update, factor < 1


def flower_stdv(noise_multiplier, clipping_norm, num_sampled_clients):
  """``compute_stdv`` (flwr/common/differential_privacy.py)."""
  return noise_multiplier * clipping_norm / num_sampled_clients


def flower_adaptive_noise_params(noise_multiplier, num_sampled_clients,
                                 clipped_count_stddev=None):
  """``compute_adaptive_noise_params`` (flwr/common/differential_privacy.py):
  -> (sigma_b, the update's noise multiplier)."""
  if noise_multiplier <= 0:
    return (0.0 if clipped_count_stddev is None
            else clipped_count_stddev), 0.0
  if clipped_count_stddev is None:
    clipped_count_stddev = num_sampled_clients / 20
  if noise_multiplier >= 2 * clipped_count_stddev:
    raise ValueError("clipped_count_stddev too small")
  return clipped_count_stddev, (noise_multiplier**-2
                                - (2 * clipped_count_stddev)**-2) ** -0.5


def flower_add_noise(aggregated, noise_multiplier, clipping_norm,
                     num_sampled_clients, rng):
  """``add_gaussian_noise_to_params`` (flwr/common/differential_privacy.py),
  applied by the DP wrappers only when the inner strategy returned
  parameters."""
  if aggregated is None:
    return None
  return aggregated + rng.normal(
      0.0, flower_stdv(noise_multiplier, clipping_norm, num_sampled_clients),
      aggregated.shape)


def flower_server_side_fixed(current, models, num_examples,
                             noise_multiplier, clipping_norm,
                             num_sampled_clients, rng):
  """``DifferentialPrivacyServerSideFixedClipping.aggregate_fit``
  (flwr/server/strategy/dp_fixed_clipping.py) around ``FedAvg``: clip each
  result on the server, average, add noise."""
  clipped = [flower_clip(m, current, clipping_norm)[0] for m in models]
  return flower_add_noise(flower_weighted_average(clipped, num_examples),
                          noise_multiplier, clipping_norm,
                          num_sampled_clients, rng)


def flower_client_side_fixed(current, models, num_examples,
                             noise_multiplier, clipping_norm,
                             num_sampled_clients, rng):
  """``fixedclipping_mod`` (flwr/client/mod/centraldp_mods.py) clips on
  each client, then ``DifferentialPrivacyClientSideFixedClipping
  .aggregate_fit`` (flwr/server/strategy/dp_fixed_clipping.py) averages
  with ``FedAvg`` and adds noise."""
  sent = [flower_clip(m, current, clipping_norm)[0] for m in models]
  return flower_add_noise(flower_weighted_average(sent, num_examples),
                          noise_multiplier, clipping_norm,
                          num_sampled_clients, rng)


class FlowerAdaptiveClipping:
  """``DifferentialPrivacyServerSideAdaptiveClipping`` (``client_side``
  False) and ``DifferentialPrivacyClientSideAdaptiveClipping`` with
  ``adaptiveclipping_mod`` (True), around ``FedAvg``
  (flwr/server/strategy/dp_adaptive_clipping.py, ``aggregate_fit`` and
  ``_update_clip_norm``; flwr/client/mod/centraldp_mods.py).

  The server side clips with C, counts the clipped results, steps C, then
  averages; the client side clips with the C it was sent, the server
  averages, then steps C. Both step C <- C exp(-lr ((count + N(0,
  sigma_b^2)) / m - target)), m the number of results, and then add noise
  of standard deviation compute_stdv(sigma_dw, C, num_sampled_clients)
  with the stepped C.
  """

  def __init__(self, noise_multiplier, num_sampled_clients,
               initial_clipping_norm, target_clipped_quantile, clip_norm_lr,
               clipped_count_stddev=None, client_side=False):
    self.num_sampled_clients = num_sampled_clients
    self.clipping_norm = initial_clipping_norm
    self.target = target_clipped_quantile
    self.lr = clip_norm_lr
    self.client_side = client_side
    self.count_stddev, self.noise_multiplier = flower_adaptive_noise_params(
        noise_multiplier, num_sampled_clients, clipped_count_stddev)

  def _step(self, bits, rng):
    noised = rng.normal(float(sum(bits)), self.count_stddev)
    self.clipping_norm *= np.exp(
        -self.lr * (noised / len(bits) - self.target))

  def aggregate_fit(self, current, models, num_examples, rng):
    results = [flower_clip(m, current, self.clipping_norm) for m in models]
    clipped = [model for model, _ in results]
    bits = [bit for _, bit in results]
    if self.client_side:
      aggregated = flower_weighted_average(clipped, num_examples)
      self._step(bits, rng)
    else:
      self._step(bits, rng)
      aggregated = flower_weighted_average(clipped, num_examples)
    return flower_add_noise(aggregated, self.noise_multiplier,
                            self.clipping_norm, self.num_sampled_clients,
                            rng)


# ---------------------------------------------------------------------------
# Helpers.


@functools.lru_cache(maxsize=None)
def _jitted(name, items=()):
  rule = getattr(aggregators, name)(**dict(items))
  return rule, jax.jit(rule.aggregate)


def _run(name, global_params, clients, info, state=None, **kwargs):
  rule, aggregate = _jitted(name, tuple(sorted(kwargs.items())))
  state = rule.init(global_params) if state is None else state
  return aggregate(global_params, clients, info, state)


def _cohort(seed, mask, nan_counts=False, scale=1.0):
  """``garbage_cohort`` plus Flower's view of it: the m real models [m, P]
  and their example counts, in cohort order. With ``nan_counts`` the
  padding rows' counts are NaN (1e9 otherwise)."""
  global_params, clients, info, _, counts = garbage_cohort(seed, mask,
                                                           scale=scale)
  real = np.flatnonzero(np.asarray(mask))
  if nan_counts:
    info = info._replace(num_examples=jnp.where(
        info.mask > 0, info.num_examples, jnp.nan))
  models = list(tu.flat_rows(clients)[real])
  return global_params, clients, info, models, list(counts)


def _zero_updates(num_params, mask, seed=4):
  global_params = {"w": jnp.zeros((num_params,), jnp.float32)}
  clients = {"w": jnp.zeros((len(mask), num_params), jnp.float32)}
  counts = np.arange(1, len(mask) + 1, dtype=np.float64)
  return global_params, clients, tu.make_info(np.arange(len(mask)), counts,
                                              mask, seed=seed)


# ---------------------------------------------------------------------------
# Krum.


KRUM_CASES = [(mask, f, s) for mask in MASKS
              for f, s in [(0, 1), (1, 2), (1, 3), (2, 2), (0, K)]
              if s <= sum(mask)]


@pytest.mark.parametrize("mask,num_byzantine,num_selected", KRUM_CASES)
def test_krum_flower_compatible_is_flowers_multikrum(mask, num_byzantine,
                                                     num_selected):
  global_params, clients, info, models, counts = _cohort(
      40 + sum(mask), mask, nan_counts=num_byzantine == 1)
  out, _, metrics = _run("krum", global_params, clients, info,
                         num_byzantine=num_byzantine,
                         num_selected=num_selected, flower_compatible=True)
  expected = flower_multikrum(models, counts, num_byzantine, num_selected)
  np.testing.assert_allclose(flat(out), expected, rtol=1e-5, atol=1e-6)
  assert int(metrics["num_selected"]) == num_selected
  if num_selected == 1:  # Flower's Krum (num_clients_to_keep = 0) too
    np.testing.assert_allclose(
        flat(out), flower_multikrum(models, counts, num_byzantine, 0),
        rtol=1e-5, atol=1e-6)


def test_krum_switch_changes_only_the_weights():
  mask = [1, 0, 1, 1, 1, 1]
  global_params, clients, info, models, counts = _cohort(47, mask)
  kwargs = dict(num_byzantine=1, num_selected=3)
  paper, _, paper_metrics = _run("krum", global_params, clients, info,
                                 **kwargs)
  flower, _, flower_metrics = _run("krum", global_params, clients, info,
                                   flower_compatible=True, **kwargs)
  # Off: Blanchard et al.'s uniform mean (test_robust_rules' reference).
  updates = np.stack(models) - flat(global_params)
  expected, _ = np_krum(updates, 1, 3)
  np.testing.assert_allclose(flat(paper) - flat(global_params), expected,
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(flower_metrics["krum_selected"],
                                paper_metrics["krum_selected"])
  assert np.abs(flat(flower) - flat(paper)).max() > 1e-3
  # With equal counts the two weightings agree.
  equal = info._replace(num_examples=jnp.full((K,), 7.0))
  flower_equal, _, _ = _run("krum", global_params, clients, equal,
                            flower_compatible=True, **kwargs)
  np.testing.assert_allclose(flat(flower_equal), flat(paper), rtol=1e-6,
                             atol=1e-6)


# ---------------------------------------------------------------------------
# DP-FedAvg with a fixed clip norm.


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("clip_norm", [0.3, 5.0])
def test_dp_fixed_flower_compatible_is_flowers_wrappers(mask, clip_norm):
  # num_sampled_clients (5, m from 1 to 6) only scales the noise.
  expected_clients = 5.0
  global_params, clients, info, models, counts = _cohort(
      50 + sum(mask), mask, nan_counts=clip_norm > 1)
  out, state, metrics = _run(
      "dp_fedavg", global_params, clients, info, clip_norm=clip_norm,
      noise_multiplier=0.0, expected_clients=expected_clients,
      flower_compatible=True)
  current = flat(global_params)
  for reference in (flower_server_side_fixed, flower_client_side_fixed):
    expected = reference(current, models, counts, 0.0, clip_norm,
                         expected_clients, np.random.default_rng(0))
    np.testing.assert_allclose(flat(out), expected, rtol=1e-5, atol=1e-6)
  norms = np.linalg.norm(np.stack(models) - current, axis=1)
  np.testing.assert_allclose(metrics["fraction_clipped"],
                             np.mean(norms > clip_norm))
  assert float(metrics["noise_stddev"]) == 0.0
  np.testing.assert_allclose(state.clip_norm, clip_norm, rtol=1e-7)


def test_dp_switch_off_is_still_the_papers_rule():
  # McMahan et al. Alg. 1 with D = qN: sum_k clipped dw_k / qN.
  mask = [1, 0, 1, 1, 0, 1]
  global_params, clients, info, models, _ = _cohort(56, mask)
  out, _, _ = _run("dp_fedavg", global_params, clients, info, clip_norm=3.0,
                   noise_multiplier=0.0, expected_clients=5.0)
  updates = np.stack(models) - flat(global_params)
  norms = np.linalg.norm(updates, axis=1)
  clipped = updates * np.minimum(1.0, 3.0 / norms)[:, None]
  np.testing.assert_allclose(flat(out) - flat(global_params),
                             clipped.sum(0) / 5.0, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("clip_norm,noise_multiplier", [(2.0, 1.5),
                                                        (0.1, 0.7)])
def test_dp_fixed_flower_noise_is_z_c_over_num_sampled_clients(
    clip_norm, noise_multiplier):
  # m = 3 results, num_sampled_clients 5: compute_stdv divides by 5.
  global_params, clients, info = _zero_updates(100_000, [1, 1, 0, 1, 0])
  kwargs = dict(clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                expected_clients=5.0, flower_compatible=True)
  out, _, metrics = _run("dp_fedavg", global_params, clients, info, **kwargs)
  expected = flower_stdv(noise_multiplier, clip_norm, 5.0)
  noise = np.asarray(out["w"], np.float64)
  assert abs(noise.mean()) < 5 * expected / np.sqrt(noise.size)
  assert abs(noise.var() / expected**2 - 1) < 5 * np.sqrt(2 / noise.size)
  np.testing.assert_allclose(metrics["noise_stddev"], expected, rtol=1e-6)


@pytest.mark.parametrize("adaptive", [False, True])
def test_dp_flower_empty_round_adds_no_noise(adaptive):
  # Flower's FedAvg returns no parameters without results, so its DP
  # wrappers add no noise; the papers' rule adds the noise it accounts for.
  global_params = {"w": jnp.zeros((1000,), jnp.float32)}
  clients = {"w": jnp.stack([jnp.full((1000,), v, jnp.float32)
                             for v in (np.nan, 1e30, np.nan)])}
  info = tu.make_info(np.arange(3), [np.nan, 1e9, 3.0], [0, 0, 0], seed=8)
  kwargs = dict(clip_norm=0.5, noise_multiplier=1.2, adaptive=adaptive,
                expected_clients=4.0, clipped_count_stddev=1.0)
  out, state, metrics = _run("dp_fedavg", global_params, clients, info,
                             flower_compatible=True, **kwargs)
  np.testing.assert_array_equal(out["w"], global_params["w"])
  assert float(state.clip_norm) == 0.5
  assert float(metrics["noise_stddev"]) == 0.0
  paper, _, _ = _run("dp_fedavg", global_params, clients, info, **kwargs)
  assert np.abs(np.asarray(paper["w"])).max() > 0.01


def test_dp_fixed_flower_streaming_form_equals_aggregate():
  rule = aggregators.dp_fedavg(clip_norm=0.7, noise_multiplier=1.3,
                               expected_clients=4.0, flower_compatible=True)
  assert rule.stream is not None
  streamed = jax.jit(functools.partial(tu.streamed_aggregate, rule))
  global_params, clients, info, _, _ = _cohort(57, [0, 1, 1, 0, 1, 1],
                                               nan_counts=True)
  state = rule.init(global_params)
  expected = jax.jit(rule.aggregate)(global_params, clients, info, state)
  tu.assert_trees_close(streamed(global_params, clients, info, state),
                        expected, rtol=2e-5, atol=2e-6)


# ---------------------------------------------------------------------------
# DP-FedAvg with adaptive clipping.


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("target_quantile", [0.3, 0.7])
def test_dp_adaptive_flower_compatible_is_flowers_wrappers(mask,
                                                           target_quantile):
  # Three rounds, noise off (z = 0, so Flower's sigma_b is 0 too): the
  # clipped-count step on the m results and the weighted mean, for the
  # server-side and the client-side wrapper.
  global_params, clients, info, models, counts = _cohort(
      60 + sum(mask), mask, nan_counts=target_quantile > 0.5)
  current = flat(global_params)
  clip_norm = float(np.median(np.linalg.norm(np.stack(models) - current,
                                             axis=1)))
  kwargs = dict(clip_norm=clip_norm, noise_multiplier=0.0, adaptive=True,
                target_quantile=target_quantile, clip_learning_rate=0.5,
                expected_clients=5.0, flower_compatible=True)
  # Flower's target_clipped_quantile is 1 - target_quantile.
  references = [FlowerAdaptiveClipping(0.0, 5.0, clip_norm,
                                       1.0 - target_quantile, 0.5,
                                       client_side=side)
                for side in (False, True)]
  rng = np.random.default_rng(0)
  rule, aggregate = _jitted("dp_fedavg", tuple(sorted(kwargs.items())))
  params, state = global_params, rule.init(global_params)
  for _ in range(3):
    used = references[0].clipping_norm
    params, state, metrics = aggregate(params, clients, info, state)
    expected = [ref.aggregate_fit(current, models, counts, rng)
                for ref in references]
    for model, ref in zip(expected, references, strict=True):
      np.testing.assert_allclose(flat(params), model, rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(state.clip_norm, ref.clipping_norm,
                                 rtol=1e-5)
    np.testing.assert_allclose(metrics["clip_norm"], used, rtol=1e-5)
    current = expected[0]


@pytest.mark.parametrize("scale,flower_sign", [(0.01, 1), (10.0, -1)])
def test_dp_adaptive_flower_moves_the_clip_norm_the_other_way(scale,
                                                              flower_sign):
  # Every |update| far below C = 1 (scale 0.01: none clipped) or far above
  # (10: all clipped). Andrew et al. shrink C in the first case and grow it
  # in the second; Flower, counting clipped clients, does the opposite.
  global_params, clients, info, _, _ = _cohort(61, [1, 1, 0, 1, 1, 1],
                                               scale=scale)
  kwargs = dict(clip_norm=1.0, noise_multiplier=0.0, adaptive=True,
                target_quantile=0.3, clip_learning_rate=0.2,
                expected_clients=5.0)
  _, paper, _ = _run("dp_fedavg", global_params, clients, info, **kwargs)
  _, flower, _ = _run("dp_fedavg", global_params, clients, info,
                      flower_compatible=True, **kwargs)
  clipped = 1.0 if flower_sign < 0 else 0.0
  np.testing.assert_allclose(flower.clip_norm,
                             np.exp(-0.2 * (clipped - 0.7)), rtol=1e-6)
  np.testing.assert_allclose(
      paper.clip_norm, np.exp(-0.2 * ((1 - clipped) * 5 / 5.0 - 0.3)),
      rtol=1e-6)
  assert np.sign(float(flower.clip_norm) - 1.0) == flower_sign
  assert np.sign(float(paper.clip_norm) - 1.0) == -flower_sign


@pytest.mark.parametrize("flower_compatible", [False, True])
def test_target_quantile_has_one_meaning_in_both_modes(flower_compatible):
  # Ten clients, three of them below C = 1: a fraction 0.3 unclipped. At
  # target_quantile 0.3 (no noise, D = m) both modes rest: C stays 1.
  # At 0.2 the paper's rule shrinks C (fewer should be unclipped) and
  # Flower's moves it the other way.
  global_params = {"w": jnp.zeros((4,), jnp.float32)}
  norms = np.array([0.1, 0.5, 0.9, 1.5, 2, 3, 4, 5, 6, 7], np.float32)
  clients = {"w": jnp.asarray(np.outer(norms, [1, 0, 0, 0]), jnp.float32)}
  info = tu.make_info(np.arange(10), np.full(10, 5.0))
  common = dict(clip_norm=1.0, noise_multiplier=0.0, adaptive=True,
                clip_learning_rate=0.5, expected_clients=10.0,
                flower_compatible=flower_compatible)
  _, rest, _ = _run("dp_fedavg", global_params, clients, info,
                    target_quantile=0.3, **common)
  np.testing.assert_allclose(rest.clip_norm, 1.0, rtol=1e-6)
  _, lower, _ = _run("dp_fedavg", global_params, clients, info,
                     target_quantile=0.2, **common)
  # (0.3 - 0.2) unclipped too many: the paper shrinks C by e^-0.05;
  # Flower, clipped 0.7 - 0.8, grows it by e^0.05.
  np.testing.assert_allclose(
      lower.clip_norm, np.exp(0.05 if flower_compatible else -0.05),
      rtol=1e-6)


def test_dp_adaptive_flower_noise_uses_the_stepped_clip_norm():
  # Zero updates: none clipped, so C' = C exp(-lr (N(0, sigma_b^2) / m -
  # (1 - gamma))), about C e^0.9 here (gamma = 0.1). Flower's noise has
  # standard deviation sigma_dw C' / num_sampled_clients, sigma_dw from
  # sigma_b = qN / 20.
  z, clip_norm, expected_clients = 0.3, 0.5, 4.0
  global_params, clients, info = _zero_updates(100_000, [1, 1, 1, 1])
  out, state, metrics = _run(
      "dp_fedavg", global_params, clients, info, clip_norm=clip_norm,
      noise_multiplier=z, adaptive=True, target_quantile=0.1,
      clip_learning_rate=1.0, expected_clients=expected_clients,
      flower_compatible=True)
  _, sigma_dw = flower_adaptive_noise_params(z, expected_clients)
  stepped = float(state.clip_norm)
  assert stepped > 2.0 * clip_norm
  expected = flower_stdv(sigma_dw, stepped, expected_clients)
  np.testing.assert_allclose(metrics["noise_stddev"], expected, rtol=1e-6)
  noise = np.asarray(out["w"], np.float64)
  assert abs(noise.var() / expected**2 - 1) < 5 * np.sqrt(2 / noise.size)
  np.testing.assert_allclose(metrics["clip_norm"], clip_norm)


def test_dp_adaptive_flower_count_noise_defaults_to_num_sampled_over_20():
  # The clipped count's noise, read back from C' over 200 keys (zero
  # updates: the count is 0), has Flower's default standard deviation
  # num_sampled_clients / 20 = 2, not the library's 5 z = 5.
  z, expected_clients, num_real, lr, target = 1.0, 40.0, 4, 0.1, 0.5
  global_params, clients, info = _zero_updates(8, [1] * num_real)
  kwargs = dict(clip_norm=1.0, noise_multiplier=z, adaptive=True,
                target_quantile=target, clip_learning_rate=lr,
                expected_clients=expected_clients, flower_compatible=True)
  rule, aggregate = _jitted("dp_fedavg", tuple(sorted(kwargs.items())))
  state = rule.init(global_params)
  counts = []
  for seed in range(200):
    _, new_state, _ = aggregate(global_params, clients,
                                info._replace(key=jax.random.key(seed)),
                                state)
    counts.append(num_real * ((1 - target)
                              - np.log(float(new_state.clip_norm))
                              / lr))
  counts = np.asarray(counts)
  sigma_b, _ = flower_adaptive_noise_params(z, expected_clients)
  assert sigma_b == 2.0
  assert abs(counts.mean()) < 5 * sigma_b / np.sqrt(counts.size)
  assert abs(counts.std() / sigma_b - 1) < 5 / np.sqrt(2 * counts.size)


# ---------------------------------------------------------------------------
# Arguments.


def test_flower_compatible_dp_needs_num_sampled_clients():
  with pytest.raises(ValueError, match="expected_clients"):
    aggregators.dp_fedavg(flower_compatible=True)
  # Flower's own check: z >= 2 sigma_b, sigma_b = num_sampled_clients / 20.
  with pytest.raises(ValueError, match="clipped_count_stddev"):
    aggregators.dp_fedavg(noise_multiplier=1.0, adaptive=True,
                          expected_clients=10.0, flower_compatible=True)
  with pytest.raises(ValueError):
    flower_adaptive_noise_params(1.0, 10.0)
  aggregators.dp_fedavg(noise_multiplier=1.0, adaptive=True,
                        expected_clients=10.0, clipped_count_stddev=0.6,
                        flower_compatible=True)


@pytest.mark.parametrize("factory", [aggregators.krum,
                                     aggregators.dp_fedavg])
def test_flower_compatible_must_be_a_bool(factory):
  with pytest.raises(TypeError, match="flower_compatible"):
    factory(flower_compatible=1)


def test_flower_compatible_dp_is_never_accounted():
  """Flower's weighting breaks the Gaussian mechanism's sensitivity, so
  the rule declares no noise multiplier and a run refuses to record an
  epsilon for it."""
  from fedjax_agg import simulation  # pylint: disable=g-import-not-at-top
  from fedjax_agg.config import Execution  # pylint: disable=g-import-not-at-top
  from fedjax_agg.config import Privacy  # pylint: disable=g-import-not-at-top
  from tests.test_engine import tiny_data  # pylint: disable=g-import-not-at-top
  from tests.test_engine import tiny_model  # pylint: disable=g-import-not-at-top
  flower = aggregators.dp_fedavg(noise_multiplier=1.0, expected_clients=5.0,
                                 flower_compatible=True)
  assert flower.noise_multiplier is None
  assert aggregators.dp_fedavg(noise_multiplier=1.0).noise_multiplier == 1.0
  data, x, y, _ = tiny_data()
  with pytest.raises(ValueError, match="noise"):
    simulation.run(tiny_model(), data, (x, y), flower, num_rounds=1,
                   execution=Execution(progress=False),
                   privacy=Privacy(delta=1e-5))
