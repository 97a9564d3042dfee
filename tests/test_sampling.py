"""Cohort sampling: draws without replacement (permutation, rejection) and
Poisson cohorts, against their laws.
"""

import collections

import jax
import numpy as np
import pytest

from fedjax_agg import rounds as rounds_lib
from fedjax_agg import sampling


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


def test_poisson_cohort_draws_each_client_with_the_rate():
  num_clients, rate, capacity = 50, 0.2, 30
  draws = [sampling.poisson_cohort(jax.random.key(i), num_clients, rate,
                                   capacity) for i in range(400)]
  joined = np.zeros(num_clients)
  for ids, mask, count in draws:
    ids, mask, count = np.asarray(ids), np.asarray(mask), int(count)
    real = ids[mask > 0]
    assert len(real) == count and len(set(real.tolist())) == count
    assert list(real) == sorted(real)
    joined[real] += 1
  freq = joined / len(draws)
  # Every client's frequency near q (binomial sd = 0.02 for 400 draws).
  assert np.all(np.abs(freq - rate) < 0.1), freq
  assert abs(freq.mean() - rate) < 0.01


def test_poisson_capacity_covers_the_draws():
  assert sampling.poisson_capacity(1000, 0.1) == 158  # 100 + 6 * 9.49
  assert sampling.poisson_capacity(10, 1.0) == 10
