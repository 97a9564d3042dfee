"""``clients.lora_ranks``: each client trains and sends only its own rank
components; rank self-pruning; refusals."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import clients
from fedjax_agg import federated
from fedjax_agg import objectives
from fedjax_agg.config import LocalTraining
from tests.lora import _util

TRAINING = LocalTraining(epochs=2, batch_size=4, learning_rate=0.5,
                         compute_losses=False)
RANKS = [1, 3, 2, 3]


def _data(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(32, 4)).astype(np.float32)
  y = rng.integers(0, 3, size=32)
  parts = [np.arange(8 * k, 8 * k + 8) for k in range(4)]
  return federated.from_partition(x, y, parts)


def _round(update, params, data, state, learning_rate=0.5,
           ids=(0, 1, 2, 3), mask=(1, 1, 1, 1)):
  step = jax.jit(update.update)
  return step(state, params, data, jnp.asarray(ids, jnp.int32),
              jnp.asarray(mask, jnp.float32), jnp.full(4, learning_rate),
              jnp.full(4, 1000, jnp.int32), jnp.asarray(1),
              jax.random.key(0))


def test_clients_train_and_send_only_their_components():
  _, _, model = _util.lora_mlp(rank=3)
  params = _util.random_adapters(model, seed=1, scale=0.3)
  update = clients.lora_ranks(model, RANKS, TRAINING)
  state = update.init(4)
  result, new_state, metrics = _round(update, params, _data(), state)
  np.testing.assert_array_equal(new_state.ranks, RANKS)
  np.testing.assert_array_equal(metrics["client_ranks"], RANKS)
  for path, node in _util.np_nodes(result.client_params).items():
    start = _util.np_nodes(params)[path]
    for k, rank in enumerate(RANKS):
      assert not np.any(node["a"][k, rank:]) and not np.any(
          node["b"][k, :, rank:])
      # Its own components trained.
      assert not np.allclose(node["b"][k, :, :rank], start["b"][:, :rank])


def test_without_a_local_objective_past_the_rank_nothing_moves():
  # FedProx reads the client's own truncated start, so the zero
  # components feel no pull (and the sent ones are truncated anyway).
  _, _, model = _util.lora_mlp(rank=3)
  params = _util.random_adapters(model, seed=2, scale=0.3)
  training = dataclasses.replace(TRAINING, objective=objectives.fedprox(1.0))
  update = clients.lora_ranks(model, RANKS, training)
  result, _, _ = _round(update, params, _data(), update.init(4))
  for node in _util.np_nodes(result.client_params).values():
    assert np.all(np.isfinite(node["a"]))
    assert not np.any(node["a"][0, 1:])


def test_self_pruning_shrinks_the_ranks_whose_tail_shrank():
  # A strong regulariser (Eq. (3)) wins over the data: every client's last
  # components shrink during local training, so each prunes to
  # max(floor(gamma r_k), 1).
  _, _, model = _util.lora_mlp(rank=3)
  params = _util.random_adapters(model, seed=3, scale=0.3)
  update = clients.lora_ranks(model, RANKS, TRAINING, self_pruning=0.5,
                              pruning_strength=1.0)
  result, state, metrics = _round(update, params, _data(), update.init(4),
                                  learning_rate=0.05)
  want = [max(int(np.floor(0.5 * r)), 1) for r in RANKS]
  np.testing.assert_array_equal(state.ranks, want)
  np.testing.assert_array_equal(metrics["client_ranks"], want)
  for node in _util.np_nodes(result.client_params).values():
    for k, rank in enumerate(want):
      assert not np.any(node["a"][k, rank:])
  # A padding row (mask 0) repeating client 1's id neither prunes client
  # 2 nor overwrites client 1's new rank.
  _, state, _ = _round(update, params, _data(), update.init(4),
                       learning_rate=0.05, ids=(0, 1, 1, 3), mask=(1, 1, 0, 1))
  np.testing.assert_array_equal(state.ranks, [want[0], want[1], RANKS[2],
                                              want[3]])
  # From B = 0 the tail starts at norm 0 and cannot shrink: no pruning.
  fresh = model.init(jax.random.key(0))
  _, state, _ = _round(update, fresh, _data(), update.init(4),
                       learning_rate=0.05)
  np.testing.assert_array_equal(state.ranks, RANKS)


def test_refusals_name_the_argument():
  _, _, model = _util.lora_mlp(rank=3)
  with pytest.raises(ValueError, match="ranks must lie in"):
    clients.lora_ranks(model, [1, 4], TRAINING)
  with pytest.raises(TypeError, match="ranks"):
    clients.lora_ranks(model, [1.5, 2.0], TRAINING)
  with pytest.raises(ValueError, match="num_clients=5"):
    clients.lora_ranks(model, RANKS, TRAINING).init(5)
  with pytest.raises(ValueError, match="self_pruning"):
    clients.lora_ranks(model, RANKS, TRAINING, self_pruning=1.0)
  with pytest.raises(ValueError, match="objective must be None"):
    clients.lora_ranks(model, RANKS, dataclasses.replace(
        TRAINING, objective=objectives.fedprox(0.1)), self_pruning=0.5)
  _, _, frozen = _util.lora_mlp(rank=3, freeze_a=True)
  with pytest.raises(ValueError, match="lora_ranks"):
    clients.lora_ranks(frozen, RANKS, TRAINING)
  with pytest.raises(TypeError, match="model must be built by"):
    clients.lora_ranks(_util.mlp(), RANKS, TRAINING)
