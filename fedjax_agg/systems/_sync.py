"""Synchronous rounds on a simulated clock.

A round starting at time t:

1. Selection. Candidates are taken in a random order of client ids
   (``sync_round`` draws a permutation of all N with its ``rng``;
   ``sync_round_from_order`` takes one already drawn, e.g. the cohort of the
   run loop's own sampler) and the first ``M = ceil(cohort_size * (1 +
   over_selection))`` that are online at t are selected: a uniform sample
   without replacement of the candidates online at t. If fewer than M are
   online, all online ones are selected (M shrinks). If none is, the round
   starts later, at the earliest ``next_online`` of any candidate; if no
   candidate is ever online again, ValueError.
2. Work. Selected client c finishes at ``t + task_time(c)`` (download,
   train, upload; ``System.task_times``). Its status is
   * ``OFFLINE`` if it goes offline before (``online_until < finish``);
   * ``LATE`` if a deadline is given and it finishes after ``t +
     deadline_s`` (a finish exactly at the deadline counts);
   * otherwise it reports in time: the first ``cohort_size`` of those by
     finish time (ties: selection order) are ``ACCEPTED``, the rest
     ``SURPLUS`` (over-selected clients not needed).
3. End. The server closes the round as soon as it holds ``cohort_size``
   accepted reports (the last accepted finish time). Otherwise it waits
   until it knows every selected client's outcome (its report, or its
   dropping offline, known at ``online_until``), but no longer than the
   deadline: ``end = min(t + deadline_s, latest outcome)``.

``num_dropped`` counts OFFLINE and LATE clients (not SURPLUS ones). With
every client online, no over-selection and no deadline, the round is the
first ``cohort_size`` ids of the order, all accepted, ending at
``t + max task time``.
"""

import math
from typing import NamedTuple, Optional

import numpy as np

from fedjax_agg import checks
from fedjax_agg.systems import _common
from fedjax_agg.systems import _profiles
from fedjax_agg.systems._availability import Availability

__all__ = ["ACCEPTED", "LATE", "MAX_OVER_SELECTION", "OFFLINE",
    "STATUS_NAMES", "SURPLUS", "SyncRound", "System", "Workload",
    "check_over_selection", "check_system", "num_selected", "sync_round",
    "sync_round_from_order"]

ACCEPTED = 0
"""Status code of a selected client whose report the round uses: it
reported in time, among the first ``cohort_size`` to finish."""
SURPLUS = 1
"""Status code of a selected client that reported in time but was not
needed (over-selection: ``cohort_size`` others finished first)."""
OFFLINE = 2
"""Status code of a selected client that went offline before it
finished."""
LATE = 3
"""Status code of a selected client that finished after the deadline."""
STATUS_NAMES = ("accepted", "surplus", "offline", "late")
"""The names of the status codes, indexed by code: ``STATUS_NAMES[ACCEPTED]`` is
"accepted"."""
MAX_OVER_SELECTION = 100.0
"""The largest ``over_selection`` x: a round selects at most 1 + x = 101
times its cohort, and never more than the population."""


class Workload(NamedTuple):
  """What one client's task (a round's or an asynchronous job's) moves.

  Attributes:
    examples: examples a client processes (local steps x batch size): a
      scalar, or [N] indexed by client id; finite, >= 0.
    down_bytes: bytes downloaded (the model), scalar or [N] by client id.
    up_bytes: bytes uploaded (the update), scalar or [N] by client id.
  """
  examples: object
  down_bytes: object = 0.0
  up_bytes: object = 0.0


class System(NamedTuple):
  """A population's system model: who is fast, who is online, what a task is.

  Attributes:
    profiles: per-client speed and bandwidths (``ClientProfiles``, [N]).
    availability: an ``Availability`` over the same N clients.
    workload: a ``Workload``.
  """
  profiles: _profiles.ClientProfiles
  availability: Availability
  workload: Workload

  @property
  def num_clients(self) -> int:
    return self.profiles.num_clients

  def task_times(self, client_ids) -> np.ndarray:
    """[K] seconds each client needs for its task (``task_time``)."""
    ids = _common.as_client_ids("client_ids", client_ids, self.num_clients)
    work = [np.asarray(value, np.float64) for value in self.workload]
    work = [value[ids] if value.ndim else value for value in work]
    return _profiles.task_time(self.profiles, ids, *work)


def check_system(system: System) -> None:
  """Raises unless the three parts agree on N and hold valid values."""
  if not isinstance(system, System):
    raise TypeError(f"system must be a System, got {type(system).__name__}")
  _profiles.check_profiles(system.profiles)
  num_clients = system.num_clients
  if not isinstance(system.availability, Availability):
    raise TypeError(f"system.availability must be an Availability, got "
                    f"{type(system.availability).__name__}")
  if system.availability.num_clients != num_clients:
    raise ValueError(f"system.availability covers "
                     f"{system.availability.num_clients} clients but the "
                     f"profiles {num_clients}")
  if not isinstance(system.workload, Workload):
    raise TypeError(f"system.workload must be a Workload, got "
                    f"{type(system.workload).__name__}")
  for name, value in zip(system.workload._fields, system.workload,
                         strict=True):
    _common.per_client(f"workload.{name}", value, num_clients,
                       positive=False)


class SyncRound(NamedTuple):
  """One synchronous round (see the module docstring).

  Attributes:
    client_ids: [M] int64, the selected clients in selection order.
    accepted: [M] bool, the clients whose updates the round aggregates
      (at most ``cohort_size``).
    end_time: when the round closes (seconds).
    num_dropped: selected clients that went offline or missed the deadline.
    status: [M] int8, ``ACCEPTED``, ``SURPLUS``, ``OFFLINE`` or ``LATE``.
    finish_times: [M] float64, ``start_time + task time`` (when the client
      would report; an OFFLINE client never does).
    start_time: when the round starts: t, or later if nobody was online.
  """
  client_ids: np.ndarray
  accepted: np.ndarray
  end_time: float
  num_dropped: int
  status: np.ndarray
  finish_times: np.ndarray
  start_time: float


def check_over_selection(over_selection) -> None:
  """Raises ValueError (TypeError) naming ``over_selection`` unless it is a
  number in [0, ``MAX_OVER_SELECTION``]."""
  checks.check_range(
      "over_selection", over_selection, 0, MAX_OVER_SELECTION,
      expected=f"in [0, MAX_OVER_SELECTION = {MAX_OVER_SELECTION:g}] (at "
      f"most {1 + MAX_OVER_SELECTION:g} x the cohort selected)")


def num_selected(cohort_size: int, over_selection: float,
                 num_clients: Optional[int] = None) -> int:
  """ceil(cohort_size * (1 + over_selection)), exact for decimal inputs.

  The product is rounded to 9 decimals first, so that 10 x 1.1 is 11, not
  the 12 its binary value 11.000000000000002 would give.

  Args:
    cohort_size: m >= 1.
    over_selection: x in [0, ``MAX_OVER_SELECTION``]
      (``check_over_selection``).
    num_clients: N, the population: the width is at most N (a round cannot
      select more clients than there are). None: not capped.
  """
  checks.check_int("cohort_size", cohort_size, 1)
  check_over_selection(over_selection)
  width = math.ceil(round(cohort_size * (1.0 + over_selection), 9))
  if num_clients is None:
    return width
  checks.check_int("num_clients", num_clients, 1)
  return min(width, int(num_clients))


def _first_online(availability, order, t, wanted):
  """The first ``wanted`` ids of ``order`` online at t, scanning in chunks."""
  # Doubling chunks: when most clients are online the first chunk suffices, and
  # querying all N candidates at once would cost O(N) every round.
  found, count, begin, chunk = [], 0, 0, max(2 * wanted, 256)
  while begin < order.shape[0] and count < wanted:
    ids = order[begin:begin + chunk]
    found.append(ids[availability.online(ids, t)])
    count += found[-1].shape[0]
    begin += chunk
    chunk *= 2
  return np.concatenate(found)[:wanted] if found else order[:0]


def sync_round_from_order(t: float, order, system: System,
                          cohort_size: int, *, over_selection: float = 0.0,
                          deadline_s: Optional[float] = None) -> SyncRound:
  """One synchronous round whose candidates are ``order``, in that order.

  Args:
    t: the round's earliest start, seconds (finite, >= 0).
    order: [L] distinct client ids, a random order (a permutation of all
      ids, or a cohort already drawn by another sampler).
    system: the population's ``System``.
    cohort_size: K >= 1, the updates the round aggregates at most.
    over_selection: fraction of extra clients selected, in [0,
      ``MAX_OVER_SELECTION``].
    deadline_s: optional limit on the round's length, seconds (> 0).

  Returns:
    The ``SyncRound``.

  Raises:
    ValueError: a bad argument (named), or no candidate ever online at or
      after t.
  """
  check_system(system)
  ids = _common.as_client_ids("order", order, system.num_clients)
  if np.unique(ids).shape[0] != ids.shape[0]:
    raise ValueError("order must hold distinct client ids")
  start = float(_common.as_times("t", t, 1)[0])
  checks.check_int("cohort_size", cohort_size, 1)
  check_over_selection(over_selection)
  if deadline_s is not None:
    checks.check_range("deadline_s", deadline_s, 0, low_open=True)
  availability = system.availability
  wanted = num_selected(cohort_size, over_selection, system.num_clients)
  selected = _first_online(availability, ids, start, wanted)
  if selected.shape[0] == 0:
    start = float(np.min(availability.next_online(ids, start), initial=np.inf))
    if not math.isfinite(start):
      raise ValueError(f"no client of order is online at or after t={t}: the "
                       "availability model never brings one online")
    # Nobody online at t: the round waits for the first candidate to come
    # online, then selects among those online at that new start.
    selected = _first_online(availability, ids, start, wanted)
    if selected.shape[0] == 0:
      raise RuntimeError(f"availability is inconsistent: next_online gave "
                         f"{start} but no client is online then")
  finish = start + system.task_times(selected)
  reports = availability.online_until(selected, start) >= finish
  # Every reporting client starts as SURPLUS; the deadline then marks LATE ones,
  # and the first ``cohort_size`` in time become ACCEPTED.
  status = np.where(reports, SURPLUS, OFFLINE).astype(np.int8)
  deadline = math.inf if deadline_s is None else start + float(deadline_s)
  status[reports & (finish > deadline)] = LATE
  in_time = np.flatnonzero(status == SURPLUS)
  # lexsort's last key is the primary one: by finish time, ties by selection
  # order (the position in ``selected``).
  first = in_time[np.lexsort((in_time, finish[in_time]))][:cohort_size]
  status[first] = ACCEPTED
  if first.shape[0] == cohort_size:
    end = float(finish[first].max())
  else:
    # A dropped client's outcome is known when it goes offline, not when it
    # would have finished.
    outcome = np.where(reports, finish,
                       availability.online_until(selected, start))
    end = min(deadline, float(outcome.max()))
  return SyncRound(client_ids=selected, accepted=status == ACCEPTED,
                   end_time=end,
                   num_dropped=int(np.sum((status == OFFLINE)
                                          | (status == LATE))),
                   status=status, finish_times=finish, start_time=start)


def sync_round(t: float, rng: np.random.Generator, system: System,
               cohort_size: int, *, over_selection: float = 0.0,
               deadline_s: Optional[float] = None) -> SyncRound:
  """One synchronous round over all N clients, in an order drawn by ``rng``.

  ``sync_round_from_order(t, rng.permutation(N), ...)``: the selected
  clients are a uniform sample without replacement of those online at the
  round's start (see the module docstring).

  Args:
    t: the round's earliest start, seconds.
    rng: a ``np.random.Generator`` (advanced by one permutation of N).
    system, cohort_size, over_selection, deadline_s: as in
      ``sync_round_from_order``.
  """
  if not isinstance(rng, np.random.Generator):
    raise TypeError(f"rng must be a np.random.Generator, got "
                    f"{type(rng).__name__}")
  check_system(system)
  return sync_round_from_order(t, rng.permutation(system.num_clients), system,
                               cohort_size, over_selection=over_selection,
                               deadline_s=deadline_s)
