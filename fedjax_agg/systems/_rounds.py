"""A run's rounds on the simulated clock, planned up front.

Who takes part in round r, when it ends and what it moves depend only on
the seeds (the cohort order, the population's profiles and availability),
never on training, so a run plans all its rounds before the first one:
resuming from a checkpoint or extending a finished run replays the same
plan. ``plan_rounds``: synchronous rounds, round r starting when round
r - 1 ends. ``plan_async``: FedBuff's server steps (``AsyncSchedule``),
each a "round" of the run whose cohort is the K buffered clients.
"""

from typing import Callable, NamedTuple, Optional

import numpy as np

from fedjax_agg.systems import _async
from fedjax_agg.systems import _sync


class RoundPlan(NamedTuple):
  """R planned rounds of M cohort rows each.

  Attributes:
    client_ids: [R, M] int32 cohort rows (padding rows: id 0).
    mask: [R, M] float32, 1 for the clients the round aggregates.
    sim_time_s: [R] float64, when each round ends (seconds since the start).
    dropped: [R] int64, selected clients that went offline or were late.
    uplink_bytes: [R] int64, cumulative bytes the aggregated clients sent.
    downlink_bytes: [R] int64, cumulative bytes of the models sent to the
      selected clients.
  """
  client_ids: np.ndarray
  mask: np.ndarray
  sim_time_s: np.ndarray
  dropped: np.ndarray
  uplink_bytes: np.ndarray
  downlink_bytes: np.ndarray

  def metrics(self, r: int) -> dict:
    """Round r's (0-based) history columns."""
    return _clock_columns(self, r)


def _clock_columns(plan, r: int) -> dict:
  """The columns every plan records after its r-th (0-based) round."""
  return {"sim_time_s": float(plan.sim_time_s[r]),
          "uplink_bytes": int(plan.uplink_bytes[r]),
          "downlink_bytes": int(plan.downlink_bytes[r]),
          "dropped": int(plan.dropped[r])}


def _zeroed_columns(num_rounds: int, width: int, row_dtypes: tuple,
                    round_dtypes: tuple) -> list:
  """A plan's arrays before its rounds fill them in.

  Args:
    num_rounds: R.
    width: M, the cohort rows of a round.
    row_dtypes: the dtype of each [R, M] array, in order.
    round_dtypes: the dtype of each [R] array, in order.

  Returns:
    Zeroed arrays: the [R, M] ones, then the [R] ones.
  """
  return ([np.zeros((num_rounds, width), dtype) for dtype in row_dtypes]
          + [np.zeros(num_rounds, dtype) for dtype in round_dtypes])


def plan_rounds(system: _sync.System, order: Callable[[int], np.ndarray],
                num_rounds: int, cohort_size: int, *,
                over_selection: float = 0.0,
                deadline_s: Optional[float] = None) -> RoundPlan:
  """Plans ``num_rounds`` synchronous rounds (module docstring).

  Args:
    system: the population (its workload's ``down_bytes``/``up_bytes`` are
      the model's and the update message's bytes).
    order: ``order(r)`` -> round r's candidate client ids in their random
      order (the run's seeded cohort, or a seeded permutation of all ids).
    num_rounds: R.
    cohort_size: m, the clients a round aggregates at most.
    over_selection, deadline_s: as ``systems.sync_round_from_order``.

  Returns:
    The ``RoundPlan``; M = ceil(m (1 + over_selection)), at most N (an
    over-selection beyond the population selects every online client).
  """
  _sync.check_system(system)
  width = _sync.num_selected(cohort_size, over_selection, system.num_clients)
  ids, mask, end, dropped, up, down = _zeroed_columns(
      num_rounds, width, row_dtypes=(np.int32, np.float32),
      # Every round has the same M rows (a compiled round's shape): a round that
      # selects fewer leaves its last rows at id 0, mask 0.
      round_dtypes=(np.float64, np.int64, np.int64, np.int64))
  up_bytes = np.asarray(system.workload.up_bytes, np.int64)
  down_bytes = np.asarray(system.workload.down_bytes, np.int64)
  t = 0.0
  for r in range(num_rounds):
    planned = _sync.sync_round_from_order(
        t, order(r), system, cohort_size, over_selection=over_selection,
        deadline_s=deadline_s)
    count = planned.client_ids.shape[0]
    ids[r, :count] = planned.client_ids
    mask[r, :count] = planned.accepted
    # The next round starts when this one closes, not when its slowest selected
    # client would have finished.
    t = end[r] = planned.end_time
    dropped[r] = planned.num_dropped
    accepted = planned.client_ids[planned.accepted]
    up[r] = _total(up_bytes, accepted)
    down[r] = _total(down_bytes, planned.client_ids)
  return RoundPlan(ids, mask, end, dropped, np.cumsum(up), np.cumsum(down))


def _total(per_client: np.ndarray, ids: np.ndarray) -> int:
  """Bytes of ``ids``' messages: a scalar per client or [N] by id."""
  return int(per_client[ids].sum() if per_client.ndim
             else per_client * ids.shape[0])


class AsyncPlan(NamedTuple):
  """R planned server steps of FedBuff's schedule, K clients each.

  Attributes:
    client_ids: [R, K] int32, the buffered clients in arrival order.
    start_versions: [R, K] int32, the global version each trained from.
    staleness: [R, K] int32, versions the server moved on meanwhile.
    sim_time_s: [R] float64, when each step happens.
    dropped: [R] int64, clients that went offline since the last step.
    stale: [R] int64, updates discarded as older than ``max_staleness``.
    uplink_bytes: [R] int64, cumulative bytes of every update that arrived
      (discarded stale ones included).
    downlink_bytes: [R] int64, cumulative bytes of the models sent to every
      client that started a task (at the step's instant included).
  """
  client_ids: np.ndarray
  start_versions: np.ndarray
  staleness: np.ndarray
  sim_time_s: np.ndarray
  dropped: np.ndarray
  stale: np.ndarray
  uplink_bytes: np.ndarray
  downlink_bytes: np.ndarray

  def metrics(self, r: int) -> dict:
    """Step r's (0-based) history columns."""
    return {**_clock_columns(self, r),
            "stale": int(self.stale[r]),
            "staleness_mean": float(self.staleness[r].mean()),
            "staleness_max": int(self.staleness[r].max())}


def plan_async(system: _sync.System, num_steps: int, concurrency: int,
               buffer_size: int, seed: int, *,
               max_staleness: Optional[int] = None) -> AsyncPlan:
  """Plans ``num_steps`` server steps of ``AsyncSchedule``.

  Args:
    system: the population; its workload's ``up_bytes`` and ``down_bytes``
      must be scalars (one model, one message size).
    num_steps: R.
    concurrency, buffer_size, seed, max_staleness: as ``AsyncSchedule``.

  Returns:
    The ``AsyncPlan``: the first n steps of a longer plan are the plan of n
    steps (the schedule is a deterministic function of its arguments).
  """
  schedule = _async.AsyncSchedule(system, concurrency, buffer_size, seed,
                                  max_staleness=max_staleness)
  up_bytes = np.asarray(system.workload.up_bytes, np.int64)
  down_bytes = np.asarray(system.workload.down_bytes, np.int64)
  if up_bytes.ndim or down_bytes.ndim:
    raise ValueError("system.workload: plan_async needs one up_bytes and "
                     "one down_bytes for every client (scalars)")
  ids, versions, staleness, times, dropped, stale, arrived, started = (
      _zeroed_columns(num_steps, buffer_size, row_dtypes=(np.int32,) * 3,
                      round_dtypes=(np.float64,) + (np.int64,) * 4))
  for r in range(num_steps):
    step = schedule.next_step()
    ids[r], versions[r] = step.client_ids, step.start_versions
    staleness[r] = step.staleness
    times[r], dropped[r], stale[r] = step.time, step.num_dropped, (
        step.num_stale)
    # A discarded stale update was still uploaded. ``num_started`` is already a
    # running total, so only the arrivals are summed below.
    arrived[r] = buffer_size + step.num_stale
    started[r] = schedule.num_started
  return AsyncPlan(ids, versions, staleness, times, dropped, stale,
                   np.cumsum(arrived) * up_bytes, started * down_bytes)
