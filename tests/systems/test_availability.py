"""Availability models: the three queries agree with each other, diurnal
online fractions match their parameters, explicit intervals and the CSV
reader behave and refuse bad input.
"""

import math

import numpy as np
import pytest

from fedjax_agg import systems
from tests.systems._util import _online_time

N = 300


def _models():
  return {
      "always": systems.always(num_clients=N),
      "markov": systems.markov(50.0, 150.0, seed=1, num_clients=N),
      "diurnal": systems.diurnal(0.1, seed=2, period_s=1000.0,
                                 num_clients=N),
      "intervals": _random_intervals(np.random.default_rng(3)),
  }


def _random_intervals(rng):
  ids, starts, ends = [], [], []
  for client in range(N - 10):   # the last 10 clients are never online
    edges = np.sort(rng.uniform(0, 5000, 2 * rng.integers(1, 6)))
    ids += [client] * (edges.size // 2)
    starts += list(edges[0::2])
    ends += list(edges[1::2])
  return systems.from_intervals(ids, starts, ends, num_clients=N)


@pytest.mark.parametrize("name", ["always", "markov", "diurnal",
                                  "intervals"])
def test_queries_are_consistent(name):
  model = _models()[name]
  rng = np.random.default_rng(7)
  ids = rng.integers(0, N, 2000)
  t = rng.uniform(0, 6000, 2000)
  online = model.online(ids, t)
  until = model.online_until(ids, t)
  later = model.next_online(ids, t)
  assert online.dtype == bool and until.shape == later.shape == (2000,)
  # Online at t: online until a later time (offline then), next_online = t.
  np.testing.assert_array_equal(later[online], t[online])
  assert np.all(until[online] > t[online])
  finite = online & np.isfinite(until)
  assert not model.online(ids[finite], until[finite]).any()
  middle = (t + np.where(np.isfinite(until), until, t + 1.0)) / 2
  assert model.online(ids[online], middle[online]).all()
  # Offline at t: online_until = t, online at next_online, not before.
  np.testing.assert_array_equal(until[~online], t[~online])
  assert np.all(later[~online] > t[~online])
  back = ~online & np.isfinite(later)
  assert model.online(ids[back], later[back]).all()
  gap = (t + later) / 2
  assert not model.online(ids[back], gap[back]).any()
  # Vector and scalar times agree.
  np.testing.assert_array_equal(model.online(ids[:50], 123.0),
                                model.online(ids[:50], np.full(50, 123.0)))


def test_always():
  model = systems.always(num_clients=4)
  np.testing.assert_array_equal(model.online([0, 3], 5.0), [True, True])
  np.testing.assert_array_equal(model.online_until([0, 3], 5.0),
                                [np.inf, np.inf])
  np.testing.assert_array_equal(model.next_online([1], 5.0), [5.0])


def test_diurnal_online_fraction():
  model = systems.diurnal(6.0, seed=0, num_clients=50)
  ids = np.arange(50)
  online_time, _ = _online_time(model, ids, 3 * 86400.0)
  np.testing.assert_allclose(online_time, 3 * 6 * 3600.0, rtol=1e-9)
  samples = np.random.default_rng(1).uniform(0, 86400, 400)
  fraction = np.mean([model.online(ids, t).mean() for t in samples])
  assert abs(fraction - 0.25) < 0.02


def test_diurnal_edge_hours():
  never = systems.diurnal(0.0, seed=0, num_clients=3)
  assert not never.online([0, 1, 2], 10.0).any()
  np.testing.assert_array_equal(never.next_online([0], 10.0), [np.inf])
  ever = systems.diurnal(2.0, seed=0, period_s=7200.0, num_clients=3)
  assert ever.online([0, 1, 2], 10.0).all()
  np.testing.assert_array_equal(ever.online_until([0], 10.0), [np.inf])


def test_from_intervals_merges_and_orders():
  model = systems.from_intervals([1, 0, 0, 0], [3.0, 5.0, 0.0, 7.0],
                                 [4.0, 7.0, 2.0, 9.0], num_clients=3)
  ids = np.array([0, 0, 0, 1, 2])
  t = np.array([1.0, 2.0, 5.5, 3.5, 0.0])
  np.testing.assert_array_equal(model.online(ids, t),
                                [True, False, True, True, False])
  # [5, 7) and [7, 9) are one session: client 0 goes offline at 9.
  np.testing.assert_array_equal(model.online_until(ids, t),
                                [2.0, 2.0, 9.0, 4.0, 0.0])
  np.testing.assert_array_equal(model.next_online(ids, t),
                                [1.0, 5.0, 5.5, 3.5, np.inf])
  np.testing.assert_array_equal(model.next_online([0, 1], 9.0),
                                [np.inf, np.inf])


@pytest.mark.parametrize("arguments, error, message", [
    (([0, 2], [0, 0], [1, 1]), ValueError, "client_ids"),
    (([0, 1], [0, 1], [1, 1]), ValueError, r"end_s must be > start_s.*row 1"),
    (([0, 0], [0, 1], [2, 3]), ValueError, r"row \d: interval .* overlaps"),
    (([0], [np.nan], [1]), ValueError, "start_s must be finite"),
    (([0], [0], [np.inf]), ValueError, "end_s must be finite"),
    (([0], [0, 1], [1, 2]), ValueError, "start_s must have the shape"),
])
def test_from_intervals_refuses(arguments, error, message):
  with pytest.raises(error, match=message):
    systems.from_intervals(*arguments, num_clients=2)


def test_read_intervals(tmp_path):
  path = tmp_path / "intervals.csv"
  path.write_text("client_id,start_s,end_s\n0,10,20\n2,0,5\n0,30,40\n")
  model = systems.read_intervals(path, 3)
  np.testing.assert_array_equal(model.online([0, 0, 1, 2], [15, 25, 0, 4]),
                                [True, False, False, True])
  np.testing.assert_array_equal(model.next_online([0, 1], 25.0), [30, np.inf])


@pytest.mark.parametrize("rows, message", [
    ("0,0,1\n5,0,1\n", r"line 3, column client_id: unknown client id 5"),
    ("0,0,1\n1,3,3\n", r"line 3, column end_s: expected end_s > start_s"),
    ("0,0,10\n1,0,1\n0,5,15\n", r"line 4: interval \[5.0, 15.0\) of client 0 "
     r"overlaps \[0.0, 10.0\) \(.*line 2\)"),
    ("0,0,inf\n", r"line 2, column end_s: expected a finite number"),
    ("0,x,1\n", r"line 2, column start_s: expected a number"),
])
def test_read_intervals_errors(tmp_path, rows, message):
  path = tmp_path / "intervals.csv"
  path.write_text("client_id,start_s,end_s\n" + rows)
  with pytest.raises(ValueError, match=message) as error:
    systems.read_intervals(path, 3)
  assert "intervals.csv" in str(error.value)


@pytest.mark.parametrize("call, error, name", [
    (lambda m: m.online([0, 5], 1.0), ValueError, "client_ids"),
    (lambda m: m.online([[0]], 1.0), ValueError, "client_ids"),
    (lambda m: m.online([0.0], 1.0), TypeError, "client_ids"),
    (lambda m: m.online([0], -1.0), ValueError, "t must be"),
    (lambda m: m.online_until([0], np.nan), ValueError, "t must be"),
    (lambda m: m.next_online([0], math.inf), ValueError, "t must be"),
    (lambda m: m.online([0, 1], [1.0, 2.0, 3.0]), ValueError, "t must be"),
    (lambda m: m.online([0], "now"), TypeError, "t must be"),
])
def test_queries_refuse_bad_arguments(call, error, name):
  for model in (systems.always(num_clients=5),
                systems.markov(1.0, 1.0, 0, num_clients=5)):
    with pytest.raises(error, match=name):
      call(model)


@pytest.mark.parametrize("build, error, name", [
    (lambda: systems.markov(0.0, 1.0, 0, num_clients=3), ValueError,
     "mean_online_s"),
    (lambda: systems.markov(1.0, -1.0, 0, num_clients=3), ValueError,
     "mean_offline_s"),
    (lambda: systems.markov(1.0, 1.0, -3, num_clients=3), ValueError, "seed"),
    (lambda: systems.diurnal(25.0, 0, num_clients=3), ValueError,
     "online_hours"),
    (lambda: systems.diurnal(1.0, 0, period_s=0.0, num_clients=3),
     ValueError, "period_s"),
    (lambda: systems.always(num_clients=0), ValueError, "num_clients"),
])
def test_factories_refuse_bad_arguments(build, error, name):
  with pytest.raises(error, match=name):
    build()


def test_registry():
  model = systems.AVAILABILITY.build("markov", num_clients=10, seed=3,
                                     mean_online_s=2.0, mean_offline_s=1.0)
  reference = systems.markov(2.0, 1.0, 3, num_clients=10)
  np.testing.assert_array_equal(model.online_until(np.arange(10), 4.0),
                                reference.online_until(np.arange(10), 4.0))
  assert systems.AVAILABILITY.build("always", num_clients=4,
                                    seed=1).num_clients == 4
  assert set(systems.AVAILABILITY) == {"always", "markov", "diurnal",
                                       "intervals"}
