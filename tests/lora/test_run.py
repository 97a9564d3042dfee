"""Runs of LoRA models through ``simulation.run``, with no engine change:
the base stays bit-identical, the run's params are the adapters (counted by
hand), and the adapters train."""

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import federated
from fedjax_agg import simulation
from fedjax_agg.config import Checkpointing
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.models import lora
from tests.lora import _util

TRAINING = LocalTraining(epochs=2, batch_size=4, learning_rate=0.5)
RANKS = [3, 2, 3, 1, 3, 2]


def _frozen_copy(model):
  return jax.tree.map(np.array, lora.spec(model).base_variables)


def _assert_base_unchanged(model, copy):
  now = jax.tree.map(np.asarray, lora.spec(model).base_variables)
  assert jax.tree.structure(now) == jax.tree.structure(copy)
  for got, want in zip(jax.tree.leaves(now), jax.tree.leaves(copy),
                       strict=True):
    np.testing.assert_array_equal(got, want)  # bit for bit


def test_three_rounds_of_fedit_on_a_tiny_transformer():
  base = _util.transformer()
  model = lora.lora(base, base.init(jax.random.key(0)), rank=2,
                    targets=lora.TRANSFORMER_TARGETS, key=jax.random.key(1))
  copy = _frozen_copy(model)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, _util.VOCAB, size=(40, _util.LENGTH + 1))
  x, y = tokens[:, :-1].astype(np.int32), tokens[:, 1:].astype(np.int32)
  data = federated.from_partition(
      x, y, [np.arange(8 * k, 8 * k + 8) for k in range(5)])
  result = simulation.run(model, data, (x, y), aggregators.fedit(),
                          num_rounds=3, participation=0.6, seed=0,
                          training=TRAINING,
                          execution=Execution(progress=False))
  # (a) The base is bit-identical after the run.
  _assert_base_unchanged(model, copy)
  # (b) The run's params are the adapters: r (d_in + d_out) per targeted
  # kernel, by hand (w = 8: q, k, v, out are w x w; the MLP w -> 4w -> w).
  w, r = _util.WIDTH, 2
  want = {"_Block_0/MultiHeadDotProductAttention_0/" + name: (w, w)
          for name in ("query", "key", "value", "out")}
  want.update({"_Block_0/Dense_0": (w, 4 * w), "_Block_0/Dense_1": (4 * w, w)})
  params = result.state.params
  assert set(params) == {"lora"} and set(params["lora"]) == set(want)
  for path, (d_in, d_out) in want.items():
    assert params["lora"][path]["a"].shape == (r, d_in)
    assert params["lora"][path]["b"].shape == (d_out, r)
  total = sum(leaf.size for leaf in jax.tree.leaves(params))
  assert total == sum(r * (d_in + d_out) for d_in, d_out in want.values())
  assert total == model.num_params() == lora.num_trainable(model)
  # (c) It trains: the test loss falls; FedIT reports its inexactness.
  rows = result.history.rows
  assert rows[-1]["test_loss"] < rows[0]["test_loss"] - 0.1
  assert all(0 < row["inexact_aggregation"] < 1 for row in rows[1:])


def _mlp_data(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(48, 4)).astype(np.float32)
  y = (x[:, 0] + x[:, 1] > 0).astype(np.int32) + (x[:, 2] > 1)
  parts = [np.arange(8 * k, 8 * k + 8) for k in range(6)]
  return federated.from_partition(x, y, parts), x, y


@pytest.mark.parametrize("rule,kwargs,ranks", [
    ("ffa_lora", {"freeze_a": True}, None),
    ("flora", {"merged": True}, [1, 2, 3, 3, 2, 1]),
    ("hetlora", {}, [1, 2, 3, 3, 2, 1]),
])
def test_adapter_rules_run_and_train_with_a_frozen_base(rule, kwargs, ranks):
  _, _, model = _util.lora_mlp(rank=3, **kwargs)
  copy = _frozen_copy(model)
  data, x, y = _mlp_data()
  local_update = (None if ranks is None else
                  clients.lora_ranks(model, ranks, TRAINING))
  result = simulation.run(model, data, (x, y), aggregators.get(rule),
                          num_rounds=3, participation=0.5, seed=1,
                          training=TRAINING, local_update=local_update,
                          execution=Execution(progress=False))
  _assert_base_unchanged(model, copy)
  rows = result.history.rows
  assert rows[-1]["test_loss"] < rows[0]["test_loss"]
  assert lora.is_adapters(result.state.params)
  if rule == "flora":
    assert np.any(result.state.params["lora"]["fc1"]["merged"])
    assert not np.any(result.state.params["lora"]["fc1"]["b"])


def test_checkpoints_hold_the_adapters_and_the_clients_ranks(tmp_path):
  # A run of 2 rounds, checkpointed and resumed to 3, ends where a run of
  # 3 does: adapters, pruned ranks (client state) and all.
  _, _, model = _util.lora_mlp(rank=3)
  data, x, y = _mlp_data(seed=2)

  training = LocalTraining(epochs=2, batch_size=4, learning_rate=0.05)

  def run(num_rounds, checkpointing=None):
    local_update = clients.lora_ranks(model, RANKS, training,
                                      self_pruning=0.5, pruning_strength=1.0)
    return simulation.run(model, data, (x, y), aggregators.hetlora(),
                          num_rounds=num_rounds, participation=0.5, seed=3,
                          training=training, local_update=local_update,
                          checkpointing=checkpointing,
                          execution=Execution(progress=False))

  whole = run(3)
  run(2, Checkpointing(directory=str(tmp_path), every=1))
  resumed = run(3, Checkpointing(directory=str(tmp_path), every=1,
                                 resume=True))
  for got, want in zip(jax.tree.leaves(_raw(resumed.state)),
                       jax.tree.leaves(_raw(whole.state)), strict=True):
    np.testing.assert_array_equal(got, want)
  assert lora.is_adapters(resumed.state.params)
  # Some clients pruned (so the ranks resumed are not the initial ones).
  assert np.any(np.asarray(whole.state.client_state.ranks) < RANKS)


def _raw(tree):
  """``tree`` with its typed PRNG keys as their raw data."""
  def leaf(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return jax.random.key_data(x)
    return x
  return jax.tree.map(leaf, tree)
