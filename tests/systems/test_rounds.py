"""A run's rounds planned up front: the plan is a function of the seed, and
a shorter plan is a prefix of a longer one.
"""

import numpy as np

from fedjax_agg import systems as systems_lib


def test_the_plan_is_a_function_of_the_seed_and_prefix_stable():
  population = systems_lib.System(
      systems_lib.lognormal_profiles(50, 1), systems_lib.markov(
          5.0, 5.0, 2, num_clients=50),
      systems_lib.Workload(np.full(50, 20.0), 100.0, 100.0))
  long = systems_lib.plan_async(population, 12, 8, 3, seed=4,
                                max_staleness=6)
  short = systems_lib.plan_async(population, 5, 8, 3, seed=4,
                                 max_staleness=6)
  for a, b in zip(long, short, strict=True):
    np.testing.assert_array_equal(a[:5], b)
  other = systems_lib.plan_async(population, 5, 8, 3, seed=5,
                                 max_staleness=6)
  assert not np.array_equal(other.client_ids, short.client_ids)
  assert long.staleness.max() <= 6
