"""Synchronous rounds: selection among online clients, over-selection,
deadlines, dropouts and the round's end time, against direct computations."""

import numpy as np
import pytest

from fedjax_agg import systems

N = 40


def _system(availability=None, seed=0, examples=100.0):
  profiles = systems.lognormal_profiles(N, seed=seed)
  availability = availability or systems.always(num_clients=N)
  return systems.System(profiles, availability,
                        systems.Workload(examples, 2e6, 1e6))


def _task(system, ids):
  profiles, work = system.profiles, system.workload
  examples = np.broadcast_to(work.examples, (N,))[ids]
  return (examples / profiles.speed[ids] + work.down_bytes
          / profiles.downlink[ids] + work.up_bytes / profiles.uplink[ids])


def test_all_online_takes_the_order_and_waits_for_the_slowest():
  system = _system()
  order = np.random.default_rng(1).permutation(N)
  result = systems.sync_round_from_order(100.0, order, system, 8)
  np.testing.assert_array_equal(result.client_ids, order[:8])
  assert result.accepted.all() and result.num_dropped == 0
  assert result.start_time == 100.0
  np.testing.assert_allclose(result.finish_times,
                             100.0 + _task(system, order[:8]))
  assert result.end_time == pytest.approx(100 + _task(system, order[:8]).max())
  # A cohort drawn by another sampler, passed as the order.
  cohort = np.array([5, 17, 2])
  same = systems.sync_round_from_order(0.0, cohort, system, 3)
  np.testing.assert_array_equal(same.client_ids, cohort)


def test_sync_round_uses_a_permutation_of_its_rng():
  system = _system()
  result = systems.sync_round(0.0, np.random.default_rng(9), system, 6)
  order = np.random.default_rng(9).permutation(N)
  np.testing.assert_array_equal(result.client_ids, order[:6])


def test_over_selection_accepts_the_fastest():
  system = _system(seed=3)
  order = np.random.default_rng(2).permutation(N)
  result = systems.sync_round_from_order(0.0, order, system, 10,
                                         over_selection=0.3)
  selected = order[:13]
  np.testing.assert_array_equal(result.client_ids, selected)
  times = _task(system, selected)
  fastest = np.argsort(times)[:10]
  np.testing.assert_array_equal(np.flatnonzero(result.accepted),
                                np.sort(fastest))
  assert set(result.status[~result.accepted]) == {systems.SURPLUS}
  assert result.num_dropped == 0
  assert result.end_time == pytest.approx(np.sort(times)[9])


def test_num_selected():
  assert systems.num_selected(10, 0.1) == 11
  assert systems.num_selected(10, 0.0) == 10
  assert systems.num_selected(10, 0.25) == 13
  assert systems.num_selected(3, 1.0) == 6


def test_over_selection_is_bounded_by_name():
  """x must be finite and at most MAX_OVER_SELECTION = 100 (101 x the
  cohort), refused as a ValueError naming over_selection and the bound by
  every entry point, never by numpy allocating ceil(m (1 + x)) rows."""
  assert systems.MAX_OVER_SELECTION == 100.0
  assert systems.num_selected(3, 100.0) == 303
  system = _system()
  order = lambda r: np.random.default_rng(r).permutation(N)
  for bad in (1e300, 100.5, np.inf, np.nan):
    match = r"^over_selection must be .*\[0, MAX_OVER_SELECTION = 100\]"
    with pytest.raises(ValueError, match=match):
      systems.check_over_selection(bad)
    with pytest.raises(ValueError, match=match):
      systems.num_selected(3, bad)
    with pytest.raises(ValueError, match=match):
      systems.sync_round_from_order(0.0, order(0), system, 3,
                                    over_selection=bad)
    with pytest.raises(ValueError, match=match):
      systems.plan_rounds(system, order, 2, 3, over_selection=bad)


def test_over_selection_beyond_the_population_selects_every_online_client():
  """ceil(m (1 + x)) above N selects all N (the online ones): the plan is
  N rows wide, not ceil(m (1 + x)), and equals the plan that over-selects
  exactly N."""
  system = _system(seed=2)
  order = lambda r: np.random.default_rng(r).permutation(N)
  assert systems.num_selected(4, 100.0, N) == N
  assert systems.num_selected(4, 0.5, N) == 6
  beyond = systems.plan_rounds(system, order, 3, 4, over_selection=100.0)
  exactly = systems.plan_rounds(system, order, 3, 4, over_selection=9.0)
  assert beyond.client_ids.shape == (3, N)
  for got, want in zip(beyond, exactly, strict=True):
    np.testing.assert_array_equal(got, want)
  assert (beyond.mask.sum(axis=1) == 4).all()
  one = systems.sync_round_from_order(0.0, order(0), system, 4,
                                      over_selection=100.0)
  np.testing.assert_array_equal(one.client_ids, order(0))


def test_deadline_drops_exactly_the_late():
  system = _system(seed=4)
  order = np.arange(N)
  times = _task(system, order[:12])
  deadline = float(np.median(times))
  result = systems.sync_round_from_order(5.0, order, system, 12,
                                         deadline_s=deadline)
  late = times > deadline
  assert late.any() and not late.all()
  np.testing.assert_array_equal(result.status == systems.LATE, late)
  np.testing.assert_array_equal(result.accepted, ~late)
  assert result.num_dropped == late.sum()
  assert result.end_time == 5.0 + deadline
  # Everyone in time: the round ends at the slowest, before the deadline.
  relaxed = systems.sync_round_from_order(5.0, order, system, 12,
                                          deadline_s=10 * times.max())
  assert relaxed.accepted.all()
  assert relaxed.end_time == pytest.approx(5.0 + times.max())


def test_clients_going_offline_mid_task_are_dropped():
  profiles = systems.constant_profiles(N, speed=10.0, uplink=1e9,
                                       downlink=1e9)
  # Task: 100 examples at 10 / s = 10 s (+ 2 ms of transfers). Client c is
  # online on [0, 5 + c / 2): clients 0..10 leave before finishing.
  leave = 5.0 + np.arange(N) / 2
  availability = systems.from_intervals(np.arange(N), np.zeros(N), leave,
                                        num_clients=N)
  system = systems.System(profiles, availability,
                          systems.Workload(100.0, 1e6, 1e6))
  order = np.arange(20)
  result = systems.sync_round_from_order(0.0, order, system, 20)
  task = 10.0 + 2e6 / 1e9
  offline = leave[:20] < task
  np.testing.assert_array_equal(result.status == systems.OFFLINE, offline)
  np.testing.assert_array_equal(result.accepted, ~offline)
  assert result.num_dropped == offline.sum() == 11
  # Fewer than K reported: the round ends when every outcome is known.
  assert result.end_time == pytest.approx(task)
  # With over-selection the K first reports close the round.
  more = systems.sync_round_from_order(0.0, np.arange(N), system, 5,
                                       over_selection=3.0)
  assert more.accepted.sum() == 5 and more.num_dropped == 11
  assert more.end_time == pytest.approx(task)


def test_only_online_clients_are_selected():
  availability = systems.markov(10.0, 10.0, seed=5, num_clients=N)
  system = _system(availability)
  order = np.random.default_rng(0).permutation(N)
  result = systems.sync_round_from_order(50.0, order, system, 6)
  online = order[availability.online(order, 50.0)]
  np.testing.assert_array_equal(result.client_ids, online[:6])


def test_waits_until_someone_is_online():
  availability = systems.from_intervals([3, 7, 7], [40.0, 25.0, 60.0],
                                        [50.0, 30.0, 70.0], num_clients=N)
  system = _system(availability)
  result = systems.sync_round_from_order(10.0, np.arange(N), system, 2)
  assert result.start_time == 25.0
  np.testing.assert_array_equal(result.client_ids, [7])
  # Fewer online than wanted: the round takes those there are.
  result = systems.sync_round_from_order(45.0, np.arange(N), system, 2)
  np.testing.assert_array_equal(result.client_ids, [3])


def test_nobody_ever_online_raises():
  for availability in (systems.diurnal(0.0, seed=0, num_clients=N),
                       systems.from_intervals([], [], [], num_clients=N)):
    with pytest.raises(ValueError, match="never brings one online"):
      systems.sync_round(0.0, np.random.default_rng(0),
                         _system(availability), 4)
  late = systems.from_intervals([1], [0.0], [5.0], num_clients=N)
  with pytest.raises(ValueError, match="never"):
    systems.sync_round_from_order(6.0, np.arange(N), _system(late), 4)


def test_per_client_examples():
  examples = np.arange(1, N + 1) * 10.0
  system = _system(examples=examples)
  result = systems.sync_round_from_order(0.0, [4, 9], system, 2)
  np.testing.assert_allclose(result.finish_times, _task(system, [4, 9]))


@pytest.mark.parametrize("kwargs, error, name", [
    ({"cohort_size": 0}, ValueError, "cohort_size"),
    ({"cohort_size": 2.0}, TypeError, "cohort_size"),
    ({"over_selection": -0.1}, ValueError, "over_selection"),
    ({"deadline_s": 0.0}, ValueError, "deadline_s"),
    ({"deadline_s": np.inf}, ValueError, "deadline_s"),
    ({"t": -1.0}, ValueError, "t must"),
    ({"order": [1, 1, 2]}, ValueError, "order must hold distinct"),
    ({"order": [1, N]}, ValueError, "order"),
])
def test_refuses_bad_arguments(kwargs, error, name):
  arguments = {"t": 0.0, "order": np.arange(N), "system": _system(),
               "cohort_size": 3, **kwargs}
  with pytest.raises(error, match=name):
    systems.sync_round_from_order(**arguments)


def test_refuses_inconsistent_systems():
  system = _system()
  with pytest.raises(ValueError, match="availability covers 39"):
    systems.check_system(system._replace(
        availability=systems.always(num_clients=N - 1)))
  with pytest.raises(ValueError, match="workload.examples"):
    systems.check_system(system._replace(
        workload=systems.Workload(np.ones(N - 1))))
  with pytest.raises(ValueError, match="workload.up_bytes"):
    systems.check_system(system._replace(
        workload=systems.Workload(1.0, 0.0, -1.0)))
  with pytest.raises(TypeError, match="rng"):
    systems.sync_round(0.0, 0, system, 3)
