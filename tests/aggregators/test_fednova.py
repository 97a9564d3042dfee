"""FedNova (Wang, Liu, Liang, Joshi & Poor, NeurIPS 2020).

Golden tests against an independent numpy computation of normalised
averaging (the normalisers written as the sums of the local solvers'
gradient weights a_i, not their closed forms; padding rows hold NaN or
1e30; unequal client sizes; heterogeneous step counts), the streaming form
against the stacked one, the identity with FedAvg when every client takes
the same number of steps, and one round of real local training with
stragglers against numpy on the models the clients trained.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg import engine
from fedjax_agg import rounds
from fedjax_agg import secagg
from fedjax_agg import tree_math
from fedjax_agg.aggregators._fednova import normalizer
from fedjax_agg.config import LocalTraining
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

K = 6
MASKS = [[1] * K, [1, 0, 1, 1, 0, 1], [0, 0, 0, 1, 0, 0]]


def np_solver_weights(tau, momentum=0.0, eta_mu=0.0):
  """a_i, the weight each of the tau local gradients carries in the
  client's cumulative update (x - x_i = eta sum_s a_s g_s), summed
  step by step as the solver runs: momentum rho puts
  (1 - rho^(tau - s)) / (1 - rho) on the gradient of step s; a proximal
  term shrinks the earlier gradients by (1 - eta mu) per later step."""
  weights = []
  for s in range(tau):
    later = tau - 1 - s
    if momentum > 0:
      weights.append(sum(momentum ** j for j in range(later + 1)))
    else:
      weights.append((1.0 - eta_mu) ** later)
  return np.array(weights, np.float64)


def np_fednova(global_flat, models, counts, steps, momentum=0.0,
               eta_mu=0.0, tau_eff="normalized"):
  """Normalised averaging in float64 over the real clients' rows;
  ``tau_eff`` "steps" takes sum_i p_i tau_i for Eq. (b)."""
  p = counts / counts.sum()
  norms = np.array([np_solver_weights(int(t), momentum, eta_mu).sum()
                    for t in steps])
  updates = models - global_flat[None]
  d = np.where(norms[:, None] > 0,
               updates / np.where(norms > 0, norms, 1.0)[:, None], 0.0)
  lengths = norms if tau_eff == "normalized" else np.asarray(steps, float)
  effective = np.sum(p * lengths)
  return global_flat + effective * np.sum(p[:, None] * d, axis=0), effective


def garbage_cohort(seed, mask, steps):
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, K, scale=0.2)
  mask = np.asarray(mask)
  real = np.flatnonzero(mask)
  models = tu.flat_rows(clients)[real]
  counts = rng.integers(1, 40, size=K).astype(np.float64)
  padding = np.flatnonzero(mask == 0)

  real_counts = counts[real].copy()
  steps = np.asarray(steps)
  real_steps = steps[real].copy()
  counts[padding] = 1e9
  steps = steps.copy()
  steps[padding] = 10**6
  info = tu.make_info(np.arange(K), counts, mask, num_steps=steps)
  return (global_params, tu.spoil_rows(clients, padding), info, models,
          real_counts, real_steps)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("momentum,mu", [(0.0, 0.0), (0.9, 0.0),
                                         (0.0, 0.1)])
def test_fednova_matches_numpy(mask, momentum, mu):
  steps = [5, 1, 12, 3, 8, 2]
  lr = 0.5
  g, clients, info, models, counts, real_steps = garbage_cohort(
      3, mask, steps)
  kwargs = dict(momentum=momentum, proximal_mu=mu, learning_rate=lr)
  out, _, metrics = tu.run_rule("fednova", g, clients, info, **kwargs)
  expected, tau_eff = np_fednova(tu.flat(g), models, counts, real_steps,
                                 momentum, lr * mu)
  np.testing.assert_allclose(tu.flat(out), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(metrics["tau_eff"]), tau_eff, rtol=1e-5)
  # The streaming form gives the same model.
  rule = aggregators.fednova(**kwargs)
  streamed, _, stream_metrics = jax.jit(
      lambda *a: tu.streamed_aggregate(rule, *a))(g, clients, info,
                                                  rule.init(g))
  np.testing.assert_allclose(tu.flat(streamed), expected, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_allclose(stream_metrics["update_weights"],
                             metrics["update_weights"], rtol=1e-6)
  assert np.all(np.asarray(metrics["update_weights"])[np.asarray(mask)
                                                      == 0] == 0)


@pytest.mark.parametrize("mask", MASKS[:2])
@pytest.mark.parametrize("momentum,mu", [(0.9, 0.0), (0.0, 0.1),
                                         (0.0, 0.0)])
def test_fednova_steps_tau_eff_matches_numpy(mask, momentum, mu):
  """``tau_eff="steps"`` (Eq. (b'), the FedNova authors' code with a
  proximal term): the same normalised updates d_i, scaled by sum_i p_i
  tau_i; with a proximal term or momentum it differs from Eq. (b), with
  plain SGD it is the same rule."""
  steps = [5, 1, 12, 3, 8, 2]
  lr = 0.5
  g, clients, info, models, counts, real_steps = garbage_cohort(
      4, mask, steps)
  kwargs = dict(momentum=momentum, proximal_mu=mu, learning_rate=lr)
  out, _, metrics = tu.run_rule("fednova", g, clients, info,
                                tau_eff="steps", **kwargs)
  expected, effective = np_fednova(tu.flat(g), models, counts, real_steps,
                                   momentum, lr * mu, tau_eff="steps")
  np.testing.assert_allclose(tu.flat(out), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(metrics["tau_eff"]), effective,
                             rtol=1e-6)
  p = counts / counts.sum()
  assert effective == pytest.approx(np.sum(p * real_steps))
  # The metrics' update weights follow the same tau_eff.
  norms = np.array([np_solver_weights(int(t), momentum, lr * mu).sum()
                    for t in real_steps])
  real = np.flatnonzero(np.asarray(mask))
  np.testing.assert_allclose(np.asarray(metrics["update_weights"])[real],
                             effective * p / norms, rtol=1e-5)
  normalized, _, _ = tu.run_rule("fednova", g, clients, info, **kwargs)
  if momentum == 0 and mu == 0:
    np.testing.assert_allclose(tu.flat(out), tu.flat(normalized),
                               rtol=1e-6, atol=1e-7)
  else:
    assert not np.allclose(tu.flat(out), tu.flat(normalized), rtol=1e-3)
  rule = aggregators.fednova(tau_eff="steps", **kwargs)
  streamed, _, _ = jax.jit(
      lambda *a: tu.streamed_aggregate(rule, *a))(g, clients, info,
                                                  rule.init(g))
  np.testing.assert_allclose(tu.flat(streamed), expected, rtol=1e-5,
                             atol=1e-6)


def test_tau_eff_is_checked_by_name():
  for bad in ("Steps", "tau", None, 1.0):
    with pytest.raises(ValueError, match="tau_eff must be one of"):
      aggregators.fednova(tau_eff=bad)


def test_secure_aggregation_refusal_leads_with_its_cause():
  """Under a secure sum FedNova's refusal says so first, not that
  info.num_steps is None; a direct call without steps keeps its own."""
  rng = np.random.default_rng(0)
  g = tu.make_params(rng)
  clients = tu.make_clients(rng, g, 3)
  info = tu.make_info(np.arange(3), [4.0, 2.0, 6.0], num_steps=[3, 1, 2])
  rule = secagg.secure_aggregation(aggregators.fednova(), bits=16, clip=1.0,
                                   cohort_size=3, max_examples=6.0)
  with pytest.raises(ValueError) as error:
    jax.jit(rule.aggregate)(g, clients, info, rule.init(g))
  assert str(error.value).startswith(
      "secure aggregation cannot run fednova: "), str(error.value)
  plain = aggregators.fednova()
  with pytest.raises(ValueError) as error:
    plain.aggregate(g, clients, info._replace(num_steps=None),
                    plain.init(g))
  assert str(error.value).startswith("fednova reads info.num_steps")


def test_normalizers_are_the_sums_of_the_solver_weights():
  for tau in (0, 1, 2, 7, 40):
    for rho in (0.0, 0.5, 0.9):
      np.testing.assert_allclose(
          float(normalizer(tau, momentum=rho)),
          np_solver_weights(tau, momentum=rho).sum(), rtol=1e-5)
    np.testing.assert_allclose(
        float(normalizer(tau, proximal_mu=0.2, learning_rate=0.5)),
        np_solver_weights(tau, eta_mu=0.1).sum(), rtol=1e-5)
  # Plain SGD: exactly tau (the identity with FedAvg needs it).
  assert float(normalizer(13)) == 13.0


@settings(max_examples=EXAMPLES, deadline=None)
@given(steps=st.integers(1, 50), seed=st.integers(0, 1000),
       momentum=st.sampled_from([0.0, 0.9]))
def test_equal_steps_are_fedavg(steps, seed, momentum):
  rng = np.random.default_rng(seed)
  g = tu.make_params(rng)
  clients = tu.make_clients(rng, g, K)
  mask = np.array([1, 1, 0, 1, 1, 1])
  info = tu.make_info(np.arange(K), rng.integers(1, 30, K), mask,
                      num_steps=np.where(mask > 0, steps, 0))
  nova, _, _ = tu.run_rule("fednova", g, clients, info, momentum=momentum)
  avg, _, _ = tu.run_rule("fedavg", g, clients, info)
  tu.assert_trees_close(nova, avg, rtol=2e-6, atol=2e-6)


def test_a_client_without_steps_adds_nothing_but_its_weight():
  rng = np.random.default_rng(0)
  g = tu.make_params(rng)
  clients = tu.make_clients(rng, g, 3, zero_rows=(2,))
  info = tu.make_info(np.arange(3), [10.0, 10.0, 20.0],
                      num_steps=[4, 2, 0])
  out, _, metrics = tu.run_rule("fednova", g, clients, info)
  models = tu.flat_rows(clients)
  expected, tau_eff = np_fednova(tu.flat(g), models,
                                 np.array([10.0, 10.0, 20.0]),
                                 np.array([4, 2, 0]))
  np.testing.assert_allclose(tu.flat(out), expected, rtol=1e-5, atol=1e-6)
  assert tau_eff == pytest.approx(1.5)
  assert float(metrics["update_weights"][2]) == 0.0


def test_refusals():
  with pytest.raises(ValueError, match="momentum"):
    aggregators.fednova(momentum=1.0)
  with pytest.raises(ValueError, match="proximal_mu"):
    aggregators.fednova(proximal_mu=-0.1)
  with pytest.raises(ValueError, match="both"):
    aggregators.fednova(momentum=0.5, proximal_mu=0.1)
  with pytest.raises(ValueError, match="learning_rate \\* proximal_mu"):
    aggregators.fednova(proximal_mu=3.0, learning_rate=0.5)
  rng = np.random.default_rng(0)
  g = tu.make_params(rng)
  clients = tu.make_clients(rng, g, 2)
  info = tu.make_info([0, 1], [1.0, 2.0])._replace(num_steps=None)
  rule = aggregators.fednova()
  with pytest.raises(ValueError, match="info.num_steps"):
    rule.aggregate(g, clients, info, rule.init(g))


def test_a_round_with_stragglers_is_numpy_fednova_of_the_trained_models():
  """The round hands the rule the steps each client really took: with a
  straggler policy cutting clients short, the round's new model is numpy
  FedNova of the models the engine trains alone with those steps."""
  model = tiny_model()
  data = tiny_data(sizes=(9, 4, 15, 6, 11))[0]
  steps_fn = lambda key, full: jnp.maximum(
      1, full - jax.random.randint(key, full.shape, 0, 3))
  training = LocalTraining(batch_size=2, epochs=2, learning_rate=0.1,
                           steps_fn=steps_fn)
  rule = aggregators.fednova(learning_rate=0.1)
  params = model.init(jax.random.key(0))
  state = rounds.init_state(params, rule, seed=1)
  cohort = jnp.array([0, 2, 3, 4, 1], jnp.int32)
  mask = jnp.array([1.0, 1.0, 1.0, 0.0, 1.0])
  round_fn = rounds.make_round_fn(model, rule, training)
  new_state, out = round_fn(state, data, cohort, mask)
  _, train_key, info, num_steps, lrs = rounds.round_inputs(
      state, data, cohort, mask, training)
  local = engine.make_local_trainer(model, training)(
      params, data, cohort, lrs, num_steps, train_key)
  taken = np.asarray(out.steps_taken)
  np.testing.assert_array_equal(taken, np.asarray(local.steps_taken))
  full = np.asarray(engine.full_steps(data, cohort, 2, 2))
  assert np.all(taken[:3] <= full[:3]) and np.any(taken != full * (
      np.asarray(mask) > 0))
  real = np.asarray(mask) > 0
  expected, tau_eff = np_fednova(
      tu.flat(params), tu.flat_rows(local.client_params)[real],
      np.asarray(data.num_examples)[np.asarray(cohort)][real], taken[real])
  np.testing.assert_allclose(tu.flat(new_state.params), expected,
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(out.metrics["tau_eff"]), tau_eff,
                             rtol=1e-5)
  del info
  assert tree_math.tree_norm(jax.tree.map(
      jnp.subtract, new_state.params, params)) > 0

