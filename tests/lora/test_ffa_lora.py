"""FFA-LoRA: the mean of B against NumPy, exact aggregation with the frozen
A, half FedIT's uplink on square layers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clock
from fedjax_agg import testing
from fedjax_agg.models import lora
from tests import agg_testutil
from tests.lora import _util


def _cohort_and_mean(seed, garbage):
  """A FFA-LoRA cohort (garbage in the padding rows ``garbage``) and its
  jitted stacked aggregation."""
  _, _, model = _util.lora_mlp(rank=3, freeze_a=True)
  global_params, clients, info = _util.cohort(model, 6, seed=seed,
                                              garbage=garbage)
  rule = aggregators.ffa_lora()
  out = jax.jit(rule.aggregate)(global_params, clients, info,
                                rule.init(global_params))
  return model, rule, (global_params, clients, info), out


def test_mean_of_b_equals_numpy_and_aggregation_is_exact():
  model, _, (_, clients, info), (out, _, metrics) = _cohort_and_mean(
      1, (0, 3))
  weights = _util.np_weights(info)
  np.testing.assert_allclose(metrics["client_weights"], weights, rtol=1e-6)
  frozen = lora.spec(model).frozen_a
  for path, node in _util.np_nodes(clients).items():
    b = np.where(weights[:, None, None] > 0, node["b"], 0.0)
    mean_b = np.einsum("k,kor->or", weights, b)
    got_b = np.asarray(out["lora"][path]["b"], np.float64)
    np.testing.assert_allclose(got_b, mean_b, rtol=1e-5, atol=1e-6)
    # Eq. (2): mean_k(B_k) A = mean_k(B_k A), A the model's frozen one.
    a = np.asarray(frozen[path], np.float64)
    np.testing.assert_allclose(
        got_b @ a, np.einsum("k,kor,ri->oi", weights, b, a), rtol=1e-5,
        atol=1e-6)
    assert set(out["lora"][path]) == {"b"}


def test_uplink_is_half_of_fedits_on_square_layers():
  base, variables, _ = _util.lora_mlp()
  fedit_model = lora.lora(base, variables, rank=2, targets=["fc1"],
                          key=jax.random.key(0))  # fc1 is 4 x 4
  ffa_model = lora.lora(base, variables, rank=2, targets=["fc1"],
                        freeze_a=True, key=jax.random.key(0))
  fedit_params = fedit_model.init(jax.random.key(1))
  ffa_params = ffa_model.init(jax.random.key(1))
  assert clock.model_bytes(fedit_params) == 4 * 2 * (4 + 4)
  assert clock.model_bytes(ffa_params) * 2 == clock.model_bytes(fedit_params)
  assert lora.uplink_bytes(ffa_params) == 4 * 2 * 4


def test_refuses_adapters_holding_a_naming_ffa_lora():
  _, _, model = _util.lora_mlp(rank=2)
  params = model.init(jax.random.key(0))
  stacked = jax.tree.map(lambda x: jnp.stack([x, x]), params)
  info = testing.make_info([0, 1], [1.0, 2.0])
  with pytest.raises(ValueError, match="ffa_lora"):
    aggregators.ffa_lora().aggregate(params, stacked, info, ())
  plain = testing.make_params(np.random.default_rng(0))
  with pytest.raises(ValueError, match="ffa_lora: global_params are not"):
    aggregators.ffa_lora().aggregate(
        plain, jax.tree.map(lambda x: jnp.stack([x, x]), plain), info, ())


def test_streaming_form_equals_the_stacked_mean():
  _, rule, (global_params, clients, info), (stacked, _, _) = (
      _cohort_and_mean(2, (1, 4)))
  streamed, _, _ = jax.jit(functools.partial(
      agg_testutil.streamed_aggregate, rule))(global_params, clients, info,
                                              ())
  for got, want in zip(jax.tree.leaves(streamed), jax.tree.leaves(stacked),
                       strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # The stream refuses what the stacked form refuses, naming the rule.
  _, _, with_a = _util.lora_mlp(rank=3)
  params = with_a.init(jax.random.key(0))
  with pytest.raises(ValueError, match="ffa_lora"):
    rule.stream.client_stats(params, params, info)


def test_secure_aggregation_of_the_b_updates_is_the_plain_run_within_levels():
  """FFA-LoRA's privacy-preserving setting: the server sees only the
  b-bit sum of the clients' B updates; the run equals the plain run to
  within the fixed point's levels, and FedIT (no streaming form) is
  refused naming the key."""
  from fedjax_agg import secagg  # pylint: disable=g-import-not-at-top
  from fedjax_agg import simulation  # pylint: disable=g-import-not-at-top
  from fedjax_agg.config import Execution, LocalTraining, Systems  # pylint: disable=g-import-not-at-top
  from tests.lora.test_run import _mlp_data  # pylint: disable=g-import-not-at-top
  _, _, model = _util.lora_mlp(rank=3, freeze_a=True)
  data, x, y = _mlp_data()
  training = LocalTraining(epochs=1, batch_size=4, learning_rate=0.5)
  bits, clip = 24, 1.0

  def run(systems, rule="ffa_lora", run_model=model):
    return simulation.run(run_model, data, (x, y), aggregators.get(rule),
                          num_rounds=2, participation=0.5, seed=3,
                          training=training, systems=systems,
                          execution=Execution(progress=False))

  plain = run(Systems())
  secure = run(Systems(secagg_bits=bits, secagg_clip=clip))
  rows = secure.history.rows
  assert all(row["secagg_clipped"] == 0 for row in rows[1:])
  assert all(row["secagg_overflow"] == 0 for row in rows[1:])
  # Each round moves B by the weighted mean of K = 3 encoded updates,
  # each off by less than one level clip / L; two rounds compound it
  # through training only slightly, so allow 4 levels per round.
  level = clip / secagg.levels(bits, 3)
  for got, want in zip(jax.tree.leaves(secure.state.params),
                       jax.tree.leaves(plain.state.params), strict=True):
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * level + 1e-6)
  assert any(np.any(np.asarray(got) != np.asarray(want)) for got, want in
             zip(jax.tree.leaves(secure.state.params),
                 jax.tree.leaves(plain.state.params), strict=True))
  _, _, fedit_model = _util.lora_mlp(rank=3)
  with pytest.raises(ValueError, match="systems.secagg_bits.*streaming"):
    run(Systems(secagg_bits=bits), "fedit", fedit_model)
