"""FedBuff's asynchronous schedule: staleness against a brute-force
simulation, step times, determinism, resuming, bad arguments, termination
and the cost of 1,000 steps over 100,000 clients."""

import json
import math
import time

import numpy as np
import pytest

from fedjax_agg import systems


def _system(num_clients, availability=None, seed=0, sigma=1.0):
  profiles = systems.lognormal_profiles(num_clients, seed=seed,
                                        speed_sigma=sigma,
                                        uplink_sigma=sigma,
                                        downlink_sigma=sigma)
  availability = availability or systems.always(num_clients=num_clients)
  return systems.System(profiles, availability,
                        systems.Workload(300.0, 2e6, 1e6))


def _records(steps):
  return [(s.client_ids.tolist(), s.start_versions.tolist(),
           s.staleness.tolist(), s.time, s.num_dropped, s.num_stale)
          for s in steps]


def test_equal_speeds_and_c_equal_k_are_never_stale():
  system = _system(30, sigma=0.0)
  task = float(system.task_times([0])[0])
  schedule = systems.AsyncSchedule(system, concurrency=6, buffer_size=6,
                                   seed=1)
  for index, step in enumerate(schedule.steps(20), start=1):
    np.testing.assert_array_equal(step.staleness, 0)
    np.testing.assert_array_equal(step.start_versions, index - 1)
    assert step.version == index and len(set(step.client_ids)) == 6
    assert step.time == pytest.approx(index * task, rel=1e-12)
  assert schedule.version == 20 and schedule.time == pytest.approx(20 * task)


def _intervals(intervals, client, t):
  """(online at t, end of its session or t, next start >= t or inf)."""
  for start, end in intervals[client]:
    if start <= t < end:
      return True, end, t
    if start > t:
      return False, t, start
  return False, t, math.inf


def _reference(task, intervals, buffer_size, num_steps, max_staleness=None):
  """FedBuff with every client training whenever it is online (C = N).

  Written from the rules: a client starts when it comes online, or again
  when it finishes (still online); it drops when its session ends before
  its task; arrivals fill the buffer in (time, client id) order; the
  clients of one instant restart after all its arrivals and steps.
  """
  num_clients = len(task)
  pending = {}   # client -> (time, kind, start version, start time)
  version, buffer, steps = 0, [], []
  dropped = stale = 0

  def start(client, now):
    _, end, _ = _intervals(intervals, client, now)
    finish = now + task[client]
    if end < finish:
      pending[client] = (end, "drop", version, now)
    else:
      pending[client] = (finish, "finish", version, now)

  def come_back(client, now):
    _, _, back = _intervals(intervals, client, now)
    pending[client] = (back, "start", None, None)

  for client in range(num_clients):
    if _intervals(intervals, client, 0.0)[0]:
      start(client, 0.0)
    else:
      come_back(client, 0.0)
  while len(steps) < num_steps:
    now = min(event[0] for event in pending.values())
    restart = []
    for client in range(num_clients):   # this instant, in client id order
      when, kind, start_version, _ = pending[client]
      if when != now:
        continue
      if kind == "drop":
        dropped += 1
        come_back(client, now)
        continue
      restart.append(client)
      if kind == "start":
        continue
      if (max_staleness is not None
          and version - start_version > max_staleness):
        stale += 1
        continue
      buffer.append((client, start_version))
      if len(buffer) == buffer_size:
        steps.append(([c for c, _ in buffer], [v for _, v in buffer],
                      [version - v for _, v in buffer], now, dropped, stale))
        version += 1
        buffer, dropped, stale = [], 0, 0
    for client in restart:
      start(client, now)
  return steps[:num_steps]


def _random_sessions(rng, num_clients, horizon):
  sessions = []
  for _ in range(num_clients):
    edges = np.sort(rng.uniform(0, horizon, 2 * rng.integers(5, 20)))
    sessions.append(list(zip(edges[0::2], edges[1::2], strict=True)))
  return sessions


@pytest.mark.parametrize("seed, buffer_size, max_staleness", [
    (0, 2, None), (1, 3, None), (2, 1, None), (3, 2, 1), (4, 3, 0),
])
def test_staleness_matches_a_brute_force_simulation(seed, buffer_size,
                                                    max_staleness):
  rng = np.random.default_rng(seed)
  num_clients = 6
  sessions = _random_sessions(rng, num_clients, 1000.0)
  ids = [c for c, s in enumerate(sessions) for _ in s]
  starts = [a for s in sessions for a, _ in s]
  ends = [b for s in sessions for _, b in s]
  availability = systems.from_intervals(ids, starts, ends,
                                        num_clients=num_clients)
  system = _system(num_clients, availability, seed=seed)
  task = system.task_times(np.arange(num_clients)).tolist()
  expected = _reference(task, sessions, buffer_size, 25, max_staleness)
  schedule = systems.AsyncSchedule(system, num_clients, buffer_size,
                                   seed=seed, max_staleness=max_staleness)
  got = _records(schedule.steps(25))
  assert [g[:3] for g in got] == [e[:3] for e in expected]
  np.testing.assert_allclose([g[3] for g in got], [e[3] for e in expected],
                             rtol=1e-12)
  assert [g[4:] for g in got] == [e[4:] for e in expected]
  assert sum(e[4] for e in expected) > 0           # some clients dropped
  if max_staleness is None:
    assert max(max(e[2]) for e in expected) > 0    # some updates stale
  else:
    assert sum(e[5] for e in expected) > 0         # some discarded
    assert max(max(e[2]) for e in expected) <= max_staleness


def test_staleness_counts_the_steps_during_training():
  availability = systems.markov(400.0, 200.0, seed=3, num_clients=500)
  schedule = systems.AsyncSchedule(_system(500, availability), 40, 5, seed=2)
  steps = schedule.steps(150)
  step_times = np.array([s.time for s in steps])
  assert np.all(np.diff(step_times) >= 0)
  assert sum(s.num_dropped for s in steps) > 0
  for step in steps:
    assert step.time == step.arrival_times[-1]
    assert np.all(step.start_times < step.arrival_times)
    np.testing.assert_array_equal(step.staleness,
                                  step.version - 1 - step.start_versions)
    # Steps strictly inside (start, arrival): continuous times, no ties.
    during = [np.sum((step_times > s) & (step_times < a)) for s, a in
              zip(step.start_times, step.arrival_times, strict=True)]
    np.testing.assert_array_equal(step.staleness, during)


def test_deterministic_and_resumable():
  availability = systems.markov(300.0, 300.0, seed=5, num_clients=200)
  system = _system(200, availability)

  def run(seed, num_steps):
    return _records(systems.AsyncSchedule(system, 20, 4, seed).steps(
        num_steps))

  assert run(7, 40) == run(7, 40)
  assert run(7, 60)[:40] == run(7, 40)
  assert run(8, 40) != run(7, 40)
  # A snapshot through JSON continues exactly where the run was.
  schedule = systems.AsyncSchedule(system, 20, 4, 7)
  schedule.steps(25)
  state = json.loads(json.dumps(schedule.state()))
  fresh = systems.markov(300.0, 300.0, seed=5, num_clients=200)
  resumed = systems.AsyncSchedule.from_state(_system(200, fresh), state)
  assert resumed.time == schedule.time and resumed.version == 25
  assert resumed.num_running == schedule.num_running
  assert _records(resumed.steps(35)) == run(7, 60)[25:]
  with pytest.raises(ValueError, match="state is for 200 clients"):
    systems.AsyncSchedule.from_state(_system(10), state)
  with pytest.raises(ValueError, match=r"state lacks \['rng'\]"):
    systems.AsyncSchedule.from_state(
        system, {k: v for k, v in state.items() if k != "rng"})


def test_clients_are_chosen_uniformly():
  schedule = systems.AsyncSchedule(_system(50, sigma=0.0), 10, 10, seed=0)
  counts = np.bincount(np.concatenate(
      [s.client_ids for s in schedule.steps(500)]), minlength=50)
  # 5000 draws over 50 clients: 100 each, sd ~ 10.
  assert counts.min() > 60 and counts.max() < 140


def test_max_staleness_bounds_what_is_returned():
  schedule = systems.AsyncSchedule(_system(300, seed=1), 100, 2, seed=0,
                                   max_staleness=3)
  steps = schedule.steps(100)
  assert max(s.staleness.max() for s in steps) <= 3
  assert sum(s.num_stale for s in steps) > 0


@pytest.mark.parametrize("kwargs, error, message", [
    ({"concurrency": 3, "buffer_size": 4}, ValueError,
     r"concurrency \(C=3\) must be >= buffer_size \(K=4\)"),
    ({"buffer_size": 0}, ValueError, "buffer_size"),
    ({"concurrency": 0, "buffer_size": 0}, ValueError, "buffer_size"),
    ({"concurrency": 11}, ValueError, r"concurrency \(C=11\) must be <= "
     r"num_clients \(N=10\)"),
    ({"concurrency": 2.0}, TypeError, "concurrency"),
    ({"seed": -1}, ValueError, "seed"),
    ({"max_staleness": -1}, ValueError, "max_staleness"),
    ({"max_drops_per_step": 0}, ValueError, "max_drops_per_step"),
])
def test_refuses_bad_arguments(kwargs, error, message):
  arguments = {"system": _system(10), "concurrency": 4, "buffer_size": 2,
               "seed": 0, **kwargs}
  with pytest.raises(error, match=message):
    systems.AsyncSchedule(**arguments)


def test_nobody_online_raises_instead_of_hanging():
  for availability in (systems.diurnal(0.0, seed=0, num_clients=10),
                       systems.from_intervals([], [], [], num_clients=10)):
    with pytest.raises(ValueError, match="never brings any client online"):
      systems.AsyncSchedule(_system(10, availability), 2, 2, seed=0)
  # Sessions end for good: the run stops with an error, not a hang.
  ending = systems.from_intervals(np.arange(10), np.zeros(10),
                                  np.full(10, 100.0), num_clients=10)
  schedule = systems.AsyncSchedule(_system(10, ending), 4, 2, seed=0)
  with pytest.raises(RuntimeError, match="none will ever be online again"):
    schedule.steps(10_000)


def test_endless_drops_raise_after_the_bound():
  # Sessions of 0.1 h a day, tasks of hours: every client drops, forever.
  availability = systems.diurnal(0.1, seed=0, num_clients=20)
  system = systems.System(systems.constant_profiles(20, speed=0.01),
                          availability, systems.Workload(100.0))
  schedule = systems.AsyncSchedule(system, 5, 2, seed=0,
                                   max_drops_per_step=50)
  with pytest.raises(RuntimeError, match="max_drops_per_step=50"):
    schedule.next_step()
  assert schedule.time > 0


def test_waits_for_clients_to_come_online():
  availability = systems.from_intervals([0, 1, 2], [0.0, 50.0, 80.0],
                                        [1e6, 1e6, 1e6], num_clients=3)
  system = _system(3, availability, sigma=0.0)
  schedule = systems.AsyncSchedule(system, 3, 1, seed=0)
  assert schedule.num_running == 1
  steps = schedule.steps(30)
  assert {c for s in steps for c in s.client_ids} == {0, 1, 2}
  assert schedule.num_running == 3


def test_hundred_thousand_markov_clients():
  num_clients = 100_000
  availability = systems.markov(3600.0, 3600.0, seed=0,
                                num_clients=num_clients)
  system = _system(num_clients, availability)
  begin = time.perf_counter()
  schedule = systems.AsyncSchedule(system, concurrency=50, buffer_size=10,
                                   seed=0)
  steps = schedule.steps(1000)
  seconds = time.perf_counter() - begin
  print(f"\n100,000 Markov clients, C=50, K=10: 1,000 steps in "
        f"{seconds:.2f} s ({schedule.time:.0f} simulated s, "
        f"{sum(s.num_dropped for s in steps)} drops, max staleness "
        f"{max(s.staleness.max() for s in steps)})")
  assert steps[-1].version == 1000
