"""Populations of 100,000+ clients: vectorised construction and sampling."""

import collections

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import federated
from fedjax_agg import sampling
from fedjax_agg import simulation
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg import rounds as rounds_lib

from tests.test_engine import tiny_model


def test_from_assignment_equals_from_partition():
  rng = np.random.default_rng(0)
  owner = rng.integers(-1, 6, size=40)
  owner[:6] = np.arange(6)  # every client holds one at least
  x = rng.normal(size=(40, 5)).astype(np.float32)
  y = rng.integers(0, 3, size=40)
  built = federated.from_assignment(x, y, owner, 6)
  parts = [np.flatnonzero(owner == c) for c in range(6)]
  expected = federated.from_partition(x, y, parts)
  for a, b in zip(built, expected, strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("owner, num_clients, match", [
    ([0, 1, 3], 3, "client_of_example"),
    ([0, -2, 1], 2, "client_of_example"),
    ([0, 0, 2], 3, "hold none"),
    ([0.0, 1.0, 1.0], 2, "integer"),
    ([0, 1], 2, "client_of_example"),
    ([0, 1, 1], 0, "num_clients"),
])
def test_from_assignment_rejects_bad_input(owner, num_clients, match):
  with pytest.raises(ValueError, match=match):
    federated.from_assignment(np.zeros((3, 2)), np.zeros(3, int),
                              np.asarray(owner), num_clients)


# Both builders over 3 examples and 2 clients, with labels ``y``.
BUILDERS = {
    "from_partition": lambda y: federated.from_partition(
        np.zeros((3, 2)), y, [np.array([0, 2]), np.array([1])]),
    "from_assignment": lambda y: federated.from_assignment(
        np.zeros((3, 2)), y, np.array([0, 1, 0]), 2),
}


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("y", [
    np.array([0.0, 2.7, 1.0]),  # would truncate to 2
    np.array([0.0, np.nan, 1.0]),
    np.array([0.0, np.inf, 1.0]),
    np.array([0, 2**32 + 3, 1], np.int64),  # would wrap to 3
    np.array([0, 2**31, 1], np.int64),
    np.array([0, -1, 1]),
    np.array([0.0, -2.0, 1.0]),
], ids=["fraction", "nan", "inf", "wraps", "int32_max_plus_1", "negative",
        "negative_float"])
def test_builders_refuse_labels_a_cast_would_change(builder, y):
  with pytest.raises(ValueError, match=r"^y must hold"):
    BUILDERS[builder](y)


@pytest.mark.parametrize("builder", BUILDERS)
def test_builders_keep_valid_labels_exactly(builder):
  for y in (np.array([0.0, 3.0, 1.0]), np.array([0, 3, 1], np.int64),
            np.array([0, 2**31 - 1, 1], np.uint64)):
    data = BUILDERS[builder](y)
    assert data.y.dtype == np.int32
    np.testing.assert_array_equal(data.y, y.astype(np.int64))
  with pytest.raises(TypeError, match="y must hold integer labels"):
    BUILDERS[builder](np.array(["a", "b", "c"]))


@pytest.mark.parametrize("method", ["permutation", "rejection"])
def test_samplers_draw_distinct_ids_uniformly(method):
  # 20,000 draws of 3 out of 6: every ordered triple (120 of them) is
  # equally likely; chi-square against the uniform law.
  keys = jax.random.split(jax.random.key(0), 20_000)
  draws = np.asarray(jax.vmap(
      lambda k: sampling.sample_without_replacement(k, 6, 3, method))(keys))
  assert draws.dtype == np.int32
  assert all(len(set(row)) == 3 for row in draws)
  assert draws.min() >= 0 and draws.max() < 6
  counts = collections.Counter(map(tuple, draws))
  assert len(counts) == 120
  expected = len(draws) / 120
  chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
  assert chi2 < 170, chi2  # 119 dof: P(chi2 > 170) < 0.002


def test_rejection_sampler_on_a_large_population_and_full_cohort():
  ids = np.asarray(sampling.sample_without_replacement(
      jax.random.key(1), 1_000_000, 5_000, "rejection"))
  assert len(set(ids.tolist())) == 5_000 and ids.max() < 1_000_000
  # Under vmap (sweeps draw every member's cohort at once) each row is the
  # draw of its key alone.
  keys = jax.random.split(jax.random.key(4), 3)
  batched = jax.vmap(lambda k: sampling.sample_without_replacement(
      k, 1_000, 400, "rejection"))(keys)
  for key, row in zip(keys, batched, strict=True):
    np.testing.assert_array_equal(row, sampling.sample_without_replacement(
        key, 1_000, 400, "rejection"))
  # k = N (every slot redrawn until the last id turns up).
  ids = np.asarray(sampling.sample_without_replacement(
      jax.random.key(2), 50, 50, "rejection"))
  assert sorted(ids.tolist()) == list(range(50))


def test_auto_method_and_bad_arguments():
  assert sampling.resolve_method(1000, 10) == "permutation"
  assert sampling.resolve_method(100_000, 100) == "rejection"
  assert sampling.resolve_method(100_000, 60_000) == "permutation"
  ids = rounds_lib.sample_cohort(jax.random.key(3), 1000, 10)
  np.testing.assert_array_equal(  # the historical cohorts are kept
      ids, jax.random.choice(jax.random.key(3), 1000, (10,), replace=False))
  for args, match in (((10, 11), "cohort_size"), ((0, 1), "num_clients"),
                      ((10, 2, "floyd"), "method")):
    with pytest.raises(ValueError, match=match):
      sampling.sample_without_replacement(jax.random.key(0), *args)


def test_one_round_over_a_population_of_100k_clients():
  num_clients, cohort = 100_000, 100
  rng = np.random.default_rng(0)
  sizes = rng.integers(1, 4, size=num_clients)  # 1-3 examples each
  owner = np.repeat(np.arange(num_clients), sizes)
  rng.shuffle(owner)
  x = rng.normal(size=(owner.size, 5)).astype(np.float32)
  y = rng.integers(0, 3, size=owner.size)
  data = federated.from_assignment(x, y, owner, num_clients)
  assert data.num_clients == num_clients and data.max_examples == 3
  np.testing.assert_array_equal(data.num_examples, sizes)
  result = simulation.run(tiny_model(), data, (x[:64], y[:64]),
      aggregators.get("fedadp", num_clients=num_clients), num_rounds=1,
      participation=cohort / num_clients,
      training=LocalTraining(batch_size=2, learning_rate=0.1),
      execution=Execution(progress=False), evaluation=Evaluation(clients=False))
  ids = result.history.client_rows[0]["client_ids"]
  assert len(set(ids.tolist())) == cohort
  assert result.history.config["cohort_size"] == cohort
  steps = result.history.client_rows[0]["steps_taken"]
  np.testing.assert_array_equal(steps, -(-sizes[ids] // 2))
  # FedAdp's per-client state moved exactly for the sampled clients.
  seen = np.asarray(result.state.aggregator_state.times_seen)
  assert seen.shape == (num_clients,)
  np.testing.assert_array_equal(np.flatnonzero(seen), np.sort(ids))
