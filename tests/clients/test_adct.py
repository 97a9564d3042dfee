"""ADCT: the one-call grid search equals Algorithm 1's sequential loop."""

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import objectives
from fedjax_agg.clients._adct import ADCTState
from fedjax_agg.clients._adct import adct
from fedjax_agg.clients._adct import search_mask
from fedjax_agg.clients._adct import select_configs
from fedjax_agg import validation
from fedjax_agg import drivers
from tests.clients._util import _tuner
from tests.clients._util import BATCH
from tests.clients._util import GRID
from tests.clients._util import learnable_data
from tests.clients._util import np_accuracy
from tests.clients._util import rows_of
from tests.test_engine import reference_client
from tests.test_engine import tiny_model

def sequential_adct(model, params, x, y, train_ix, val_ix, key, target,
                    searching, previous):
  """Algorithm 1 lines 16-24 for one client, a Python loop over the grid."""
  def train(c):
    lr, epochs = GRID[c]
    trained, _ = reference_client(model, params, x, y, train_ix, key, lr,
                                  BATCH, epochs, 10**6,
                                  objectives.cross_entropy(), optax.sgd)
    return trained, np_accuracy(model, trained, x, y, val_ix)

  if not searching:
    return (previous,) + train(previous)
  tried = []
  for c in range(len(GRID)):
    trained, acc = train(c)
    if acc >= target:
      return c, trained, acc
    tried.append((acc, -c, trained))
  acc, neg_c, trained = max(tried, key=lambda t: t[:2])
  return -neg_c, trained, acc


@hypothesis.given(st.data())
def test_select_configs_equals_the_loop(draw):
  num_clients, num_configs = draw.draw(st.integers(1, 5)), draw.draw(
      st.integers(1, 6))
  # Few distinct values, so ties and exact hits of the target occur.
  acc = np.array(draw.draw(st.lists(
      st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
      min_size=num_clients * num_configs,
      max_size=num_clients * num_configs)), np.float32).reshape(
          num_clients, num_configs)
  target = draw.draw(st.sampled_from([0.0, 0.25, 0.5, 0.6, 1.0]))
  searching = np.array(draw.draw(st.lists(
      st.booleans(), min_size=num_clients, max_size=num_clients)))
  previous = np.array(draw.draw(st.lists(
      st.integers(0, num_configs - 1), min_size=num_clients,
      max_size=num_clients)), np.int32)
  got = jax.jit(select_configs)(acc, jnp.float32(target), searching,
                                         previous)
  for k in range(num_clients):
    expected = previous[k]
    if searching[k]:
      expected = int(np.argmax(acc[k]))  # best, first of equals
      for c in range(num_configs):
        if acc[k, c] >= target:
          expected = c
          break
    assert int(got[k]) == expected


def _setup():
  data, x, y = learnable_data()
  train_data, val_data = validation.holdout_split(data, 0.3, seed=1)
  model = tiny_model()
  params = model.init(jax.random.key(0))
  return model, params, x, y, train_data, val_data


def test_round_equals_sequential_reference_and_keeps_configs():
  model, params, x, y, train_data, val_data = _setup()
  tuner = _tuner()
  train_ix, val_ix = rows_of(train_data), rows_of(val_data)
  # Clients 0, 2 and 4 have a configuration and a high last accuracy, so only
  # client 0 (accuracy below the 50% threshold) and the new ones search.
  state = ADCTState(
      config_index=jnp.array([1, -1, 3, -1, 0], jnp.int32),
      accuracy=jnp.array([0.4, 0.0, 0.9, 0.0, 0.8], jnp.float32),
      mean_accuracy=jnp.float32(0.8))
  cohort = jnp.array([2, 0, 3, 4, 1])
  mask = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0])  # client 1 is padding
  key = jax.random.key(5)
  out, new_state, metrics = tuner.train(state, params, train_data, val_data,
                                        cohort, mask, jnp.int32(3), key)
  np.testing.assert_array_equal(out.searched, [False, True, True, False,
                                               False])
  assert int(metrics["adct_num_searching"]) == 2
  for k, cid in enumerate(np.asarray(cohort)[:4]):
    config, trained, acc = sequential_adct(
        model, params, x, y, train_ix[cid], val_ix[cid],
        jax.random.fold_in(key, cid), 0.8, bool(out.searched[k]),
        int(state.config_index[cid]))
    assert int(out.config_index[k]) == config
    assert out.learning_rate[k] == np.float32(GRID[config][0])
    assert int(out.local_epochs[k]) == GRID[config][1]
    np.testing.assert_allclose(out.accuracy[k], acc, rtol=1e-6)
    got = jax.tree.map(lambda a, k=k: a[k], out.local.client_params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(
        a, b, rtol=2e-5, atol=2e-6), got, trained)
  # Non-searchers keep their configuration; the state records the round.
  np.testing.assert_array_equal(np.asarray(out.config_index)[[0, 3]], [3, 0])
  kept = np.asarray(new_state.config_index)
  np.testing.assert_array_equal(kept[[2, 0, 3, 4]], out.config_index[:4])
  assert kept[1] == -1 and float(new_state.accuracy[1]) == 0.0
  np.testing.assert_allclose(new_state.mean_accuracy,
                             np.mean(np.asarray(out.accuracy)[:4]), rtol=1e-6)
  # One searcher stops at a later configuration, one reaches no target and
  # keeps the best (first of equals); untrained candidates are NaN.
  np.testing.assert_array_equal(np.asarray(out.config_index)[1:3], [1, 0])
  assert np.isnan(out.candidate_accuracy[0, 0])
  assert not np.any(np.isnan(out.candidate_accuracy[1]))
  # At t mod s == 0 every participant searches.
  out5, _, _ = tuner.train(state, params, train_data, val_data, cohort, mask,
                           jnp.int32(5), key)
  np.testing.assert_array_equal(out5.searched, [True] * 4 + [False])


def test_search_mask_threshold_modes_and_step():
  previous = jnp.array([0, 1, 2, 3, -1], jnp.int32)
  accuracy = jnp.array([0.3, 0.6, 0.9, 0.45, 0.95])
  mask = jax.jit(search_mask, static_argnums=(4, 5, 6))
  # Absolute: Acc <= 0.5; a client without configuration always searches.
  np.testing.assert_array_equal(
      mask(previous, accuracy, 0.8, 3, 50.0, 5, "absolute"),
      [True, False, False, True, True])
  # Relative: Acc <= 0.5 * 0.8 = 0.4.
  np.testing.assert_array_equal(
      mask(previous, accuracy, 0.8, 4, 50.0, 5, "relative"),
      [True, False, False, False, True])
  assert mask(previous, accuracy, 0.8, 10, 50.0, 5, "absolute").all()
  assert mask(previous, accuracy, 0.8, 10, 0.0, 5, "relative").all()
  # Mean (Algorithm 1 as printed, the default): Acc <= 0.8, gamma unused.
  for gamma in (0.0, 50.0, 100.0):
    np.testing.assert_array_equal(
        mask(previous, accuracy, 0.8, 3, gamma, 5, "mean"),
        [True, True, False, True, True])
  # No mean yet (NaN before round 1): only the clients without a
  # configuration, or the step, trigger.
  np.testing.assert_array_equal(
      mask(previous, accuracy, jnp.nan, 3, 50.0, 5, "mean"),
      [False, False, False, False, True])
  assert mask(previous, accuracy, jnp.nan, 5, 50.0, 5, "mean").all()


def test_round_one_searches_the_whole_grid_and_keeps_the_best():
  model, params, x, y, train_data, val_data = _setup()
  tuner = adct(model, grid=GRID, batch_size=BATCH, clients_per_step=8)
  state = tuner.init(5)
  assert np.isnan(state.mean_accuracy)
  out, new_state, _ = tuner.train(state, params, train_data, val_data,
                                  jnp.arange(5), jnp.ones(5), jnp.int32(1),
                                  jax.random.key(3))
  assert np.asarray(out.searched).all()
  np.testing.assert_array_equal(
      out.config_index, np.argmax(np.asarray(out.candidate_accuracy), 1))
  assert len(set(np.asarray(out.config_index).tolist())) > 1 or (
      int(out.config_index[0]) != 0)  # not everyone locked to grid[0]
  assert np.isfinite(new_state.mean_accuracy)
  # The legacy reading keeps grid[0] for everyone.
  legacy, _, _ = _tuner().train(_tuner().init(5), params, train_data,
                                val_data, jnp.arange(5), jnp.ones(5),
                                jnp.int32(1), jax.random.key(3))
  np.testing.assert_array_equal(legacy.config_index, 0)


def test_trigger_on_global_model_accuracy():
  model, params, x, y, train_data, val_data = _setup()
  state = ADCTState(jnp.array([0, 1, 2, 3, 0], jnp.int32), jnp.zeros(5),
                    jnp.float32(0.4))
  out, _, _ = _tuner(trigger_accuracy="global").train(
      state, params, train_data, val_data, jnp.arange(5), jnp.ones(5),
      jnp.int32(2), jax.random.key(0))
  global_acc = np.array([np_accuracy(model, params, x, y, ix)
                         for ix in rows_of(val_data)])
  assert 0 < np.sum(global_acc <= 0.5) < 5  # both branches occur
  np.testing.assert_array_equal(out.searched, global_acc <= 0.5)


def test_bad_arguments_are_named():
  model = tiny_model()
  with pytest.raises(ValueError, match="accuracy_threshold"):
    adct(model, accuracy_threshold=150)
  with pytest.raises(ValueError, match="search_step"):
    adct(model, search_step=0)
  with pytest.raises(ValueError, match="grid"):
    adct(model, grid=[(0.1, 0)])
  with pytest.raises(ValueError, match="threshold_mode"):
    adct(model, threshold_mode="x")
  with pytest.raises(ValueError, match="trigger_accuracy"):
    adct(model, trigger_accuracy="x")
  with pytest.raises(ValueError, match="round_one"):
    adct(model, round_one="last")
  data, x, y = learnable_data()
  with pytest.raises(ValueError, match="measure.on"):
    drivers.run_adct(model, data, (x, y), aggregators.fedavg(), _tuner(),
        num_rounds=1, measure=drivers.ADCTMeasure("test"))
  with pytest.raises(TypeError, match="keyword argument .measure_on."):
    drivers.run_adct(model, data, (x, y), aggregators.fedavg(), _tuner(),
        num_rounds=1, measure_on="train")
