"""Markov on/off availability: online fractions and sojourns match the
parameters, and answers do not depend on the queries asked before.
"""

import numpy as np

from fedjax_agg import systems
from tests.systems._util import _online_time


def test_markov_online_fraction_and_sojourns():
  model = systems.markov(20.0, 60.0, seed=4, num_clients=1000)
  ids = np.arange(1000)
  # Stationary at every time: a quarter of the clients online.
  for t in (0.0, 37.0, 5000.0):
    assert abs(model.online(ids, t).mean() - 0.25) < 0.05
  # Long-run fraction of time online, pooled over 40 clients.
  online_time, cycles = _online_time(model, ids[:40], 20_000.0)
  assert abs(online_time.sum() / (40 * 20_000.0) - 0.25) < 0.02
  # Mean length of an online sojourn ~ 20 s (~ 10,000 sojourns).
  assert abs(online_time.sum() / cycles - 20.0) < 1.5


def test_markov_answers_do_not_depend_on_queries():
  ids = np.arange(200)
  fresh = systems.markov(5.0, 5.0, seed=9, num_clients=200)
  walked = systems.markov(5.0, 5.0, seed=9, num_clients=200)
  for t in np.linspace(0, 3000, 31):   # moves the cursors forward
    walked.online(ids[::3], t)
  walked.online(ids, 9000.0)           # and beyond
  for t in (2999.5, 0.0, 1234.5):      # backward queries start over
    np.testing.assert_array_equal(walked.online_until(ids, t),
                                  fresh.online_until(ids, t))
    np.testing.assert_array_equal(walked.next_online(ids, t),
                                  fresh.next_online(ids, t))
  other = systems.markov(5.0, 5.0, seed=10, num_clients=200)
  assert not np.array_equal(other.online_until(ids, 100.0),
                            fresh.online_until(ids, 100.0))
