"""When each client is online: availability models with vectorised queries.

A client is online on a union of half-open intervals ``[start, end)`` of
simulated time (seconds, t >= 0). Every model answers three queries for a
[K] vector of client ids and a time t (a scalar or one time per client):

* ``online(ids, t)``: [K] bool;
* ``online_until(ids, t)``: [K] float64, for a client online at t the end
  of its current interval (the time it goes offline; inf if never), for a
  client offline at t, t itself (it is online on the empty ``[t, t)``);
* ``next_online(ids, t)``: [K] float64, the earliest time >= t at which the
  client is online: t if online at t, the start of its next interval
  otherwise, inf if it never comes online again.

The three are consistent by construction: a client is online at
``next_online(ids, t)`` whenever that is finite, and offline at
``online_until(ids, t)`` (intervals of one client are merged, so one ends
where no other begins).

Models (the registry ``AVAILABILITY``; each takes the population size
``num_clients`` as a keyword and refuses ids outside [0, N)):

* ``always``: every client online all the time;
* ``markov`` (module ``_markov``): a two-state continuous-time Markov chain
  per client with exponential online / offline sojourns;
* ``diurnal``: online ``online_hours`` per period (a day by default), from a
  random per-client phase;
* ``from_intervals`` / ``read_intervals``: explicit intervals, from arrays or
  a CSV file ``client_id,start_s,end_s``; a client without rows is never
  online.
"""

import numpy as np

from fedjax_agg import checks
from fedjax_agg.systems import _common

__all__ = ["INTERVAL_COLUMNS", "Availability", "always", "diurnal",
    "from_intervals", "read_intervals"]

INTERVAL_COLUMNS = ("client_id", "start_s", "end_s")
"""The header of an availability CSV file (``read_intervals``): client id, start
and end of an online interval in seconds."""


class Availability:
  """Base class: subclasses implement ``_window`` for checked arguments."""

  def __init__(self, num_clients: int):
    _common.check_num_clients(num_clients)
    self.num_clients = int(num_clients)

  def _window(self, ids: np.ndarray, t: np.ndarray):
    """([K] online at t, [K] end of the interval if online else next start)."""
    raise NotImplementedError

  def _query(self, client_ids, t):
    ids = _common.as_client_ids("client_ids", client_ids, self.num_clients)
    times = _common.as_times("t", t, ids.shape[0])
    is_online, boundary = self._window(ids, times)
    return times, is_online, boundary

  def online(self, client_ids, t) -> np.ndarray:
    """[K] bool: whether each client is online at t (scalar or [K])."""
    return self._query(client_ids, t)[1]

  def online_until(self, client_ids, t) -> np.ndarray:
    """[K] float64: when each client online at t goes offline (inf: never);
    t itself for a client offline at t."""
    times, is_online, boundary = self._query(client_ids, t)
    return np.where(is_online, boundary, times)

  def next_online(self, client_ids, t) -> np.ndarray:
    """[K] float64: earliest time >= t at which each client is online (inf:
    never)."""
    times, is_online, boundary = self._query(client_ids, t)
    return np.where(is_online, times, boundary)


class _Always(Availability):

  def _window(self, ids, t):
    return np.ones(ids.shape, bool), np.full(ids.shape, np.inf)


def always(*, num_clients: int) -> Availability:
  """Every client online at every time."""
  return _Always(num_clients)


class _Diurnal(Availability):
  """Online on [phase + m P, phase + m P + window) for every integer m."""

  def __init__(self, num_clients, window_s, period_s, phase):
    super().__init__(num_clients)
    self.window_s = window_s
    self.period_s = period_s
    self.phase = phase

  def _start(self, ids, cycle):
    # The one expression for a window's start, so that the boundaries this
    # model returns land exactly where its own queries switch.
    return self.phase[ids] + cycle * self.period_s

  def _window(self, ids, t):
    # A window that fills the period touches the next one: the formula
    # below would report the client going offline at its end, which it
    # never does (inf). An empty window is never online.
    if self.window_s >= self.period_s:
      return np.ones(ids.shape, bool), np.full(ids.shape, np.inf)
    if self.window_s <= 0:
      return np.zeros(ids.shape, bool), np.full(ids.shape, np.inf)
    cycle = np.floor((t - self.phase[ids]) / self.period_s)
    cycle += t >= self._start(ids, cycle + 1)   # undo rounding of the floor
    cycle -= t < self._start(ids, cycle)
    start = self._start(ids, cycle)
    is_online = t < start + self.window_s
    return is_online, np.where(is_online, start + self.window_s,
                               self._start(ids, cycle + 1))


def diurnal(online_hours: float, seed: int, period_s: float = 86400.0, *,
            num_clients: int) -> Availability:
  """Each client online ``online_hours`` per period, from a random phase.

  Client c is online on ``[phase_c + m * period_s, phase_c + m * period_s +
  3600 * online_hours)`` for every integer m, with ``phase_c`` uniform in
  [0, period_s) (``np.random.default_rng(seed)``). Its long-run online
  fraction is ``3600 * online_hours / period_s``.

  Args:
    online_hours: hours online per period, in [0, period_s / 3600] (0: never
      online, the whole period: always online).
    seed: int >= 0, for the phases.
    period_s: the period in seconds (> 0), a day by default.
    num_clients: N.
  """
  _common.check_num_clients(num_clients)
  _common.check_seed(seed)
  checks.check_range("period_s", period_s, 0, low_open=True)
  checks.check_range("online_hours", online_hours, 0, period_s / 3600.0,
                     expected=f"in [0, period_s / 3600 = {period_s / 3600}]")
  phase = np.random.default_rng(seed).uniform(0.0, period_s, num_clients)
  return _Diurnal(num_clients, 3600.0 * float(online_hours), float(period_s),
                  phase)


def segment_search(values: np.ndarray, low: np.ndarray, high: np.ndarray,
                   t: np.ndarray) -> np.ndarray:
  """Per query i, the first index in [low_i, high_i) with values > t_i.

  ``values`` is sorted within each segment and every index in the segments
  is valid; a vectorised bisection over the K queries (O(K log L) for
  segments of at most L values). high_i where no value exceeds t_i.
  """
  low, high = low.copy(), high.copy()
  while True:
    active = low < high
    if not active.any():
      return low
    middle = (low + high) // 2
    # Finished queries index 0, a valid position, so the gather stays in bounds;
    # their result is masked out by ``active``.
    right = values[np.where(active, middle, 0)] <= t
    low = np.where(active & right, middle + 1, low)
    high = np.where(active & ~right, middle, high)


class _Intervals(Availability):
  """Client c's intervals are ``starts, ends[offsets[c]:offsets[c + 1]]``,
  sorted and disjoint; one sentinel [inf, inf) closes the arrays."""

  def __init__(self, num_clients, starts, ends, offsets):
    super().__init__(num_clients)
    self.starts = np.append(starts, np.inf)
    self.ends = np.append(ends, np.inf)
    self.offsets = offsets

  def _window(self, ids, t):
    low, high = self.offsets[ids], self.offsets[ids + 1]
    after = segment_search(self.starts, low, high, t)   # first start > t
    # The interval that may hold t is the last one starting at or before t;
    # ``after == low`` means none does (the clamp only keeps the index valid).
    ends = self.ends[np.maximum(after - 1, 0)]
    is_online = (after > low) & (t < ends)
    # ``after`` may be ``high``, the next client's first row or the sentinel: a
    # valid index, whose start only counts within the client's segment.
    next_start = np.where(after < high, self.starts[after], np.inf)
    return is_online, np.where(is_online, ends, next_start)


def _build_intervals(num_clients, ids, starts, ends, describe):
  """Sorts, checks and merges intervals; ``describe(row)`` names a row."""
  order = np.lexsort((starts, ids))
  ids, starts, ends = ids[order], starts[order], ends[order]
  same = ids[1:] == ids[:-1]
  overlap = np.flatnonzero(same & (starts[1:] < ends[:-1]))
  if overlap.size:
    first, second = order[overlap[0]], order[overlap[0] + 1]
    raise ValueError(f"{describe(second)}: interval [{starts[overlap[0] + 1]},"
                     f" {ends[overlap[0] + 1]}) of client {ids[overlap[0]]} "
                     f"overlaps [{starts[overlap[0]]}, {ends[overlap[0]]}) "
                     f"({describe(first)})")
  # Touching intervals [a, b), [b, c) become [a, c): online_until must be
  # the time the client really goes offline.
  keep = np.ones(ids.shape, bool)
  keep[1:] = ~(same & (starts[1:] == ends[:-1]))
  group = np.cumsum(keep) - 1
  merged_ends = np.zeros(int(keep.sum()))
  np.maximum.at(merged_ends, group, ends)
  ids, starts = ids[keep], starts[keep]
  offsets = np.zeros(num_clients + 1, np.int64)
  np.add.at(offsets, ids + 1, 1)
  return _Intervals(num_clients, starts, merged_ends, np.cumsum(offsets))


def from_intervals(client_ids, start_s, end_s, *,
                   num_clients: int) -> Availability:
  """Clients online on given intervals ``[start_s[i], end_s[i])``.

  Args:
    client_ids: [R] int, the client of each interval (several per client
      allowed, in any order; clients without one are never online).
    start_s, end_s: [R] finite seconds, end > start; intervals of one client
      must not overlap (touching ones are merged).
    num_clients: N.

  Raises:
    ValueError: naming the argument and the row at fault.
  """
  _common.check_num_clients(num_clients)
  ids = _common.as_client_ids("client_ids", client_ids, num_clients)
  bounds = []
  for name, value in (("start_s", start_s), ("end_s", end_s)):
    array = np.asarray(value, dtype=np.float64)
    if array.shape != ids.shape:
      raise ValueError(f"{name} must have the shape of client_ids "
                       f"{ids.shape}, got {array.shape}")
    if not np.isfinite(array).all():
      row = np.flatnonzero(~np.isfinite(array))[0]
      raise ValueError(f"{name} must be finite, got {array[row]} at row {row}")
    bounds.append(array)
  starts, ends = bounds
  if (ends <= starts).any():
    row = np.flatnonzero(ends <= starts)[0]
    raise ValueError(f"end_s must be > start_s, got [{starts[row]}, "
                     f"{ends[row]}) at row {row}")
  return _build_intervals(num_clients, ids, starts, ends,
                          lambda row: f"row {row}")


def read_intervals(path, num_clients: int) -> Availability:
  """Intervals from a CSV file with header ``client_id,start_s,end_s``.

  Several rows per client, in any order; a client without rows is never
  online. Times are finite seconds with end_s > start_s; intervals of one
  client must not overlap (touching ones are merged).

  Raises:
    ValueError: naming the file, the line and the column: wrong header,
      non-integer id, unknown id, non-numeric or non-finite time,
      end_s <= start_s, overlapping intervals of one client (both lines).
  """
  _common.check_num_clients(num_clients)
  where = str(path)
  table = _common.read_table(path, INTERVAL_COLUMNS)
  _common.check_table_ids(where, table, "client_id", num_clients)
  starts, ends = table.values[:, 0], table.values[:, 1]
  if (ends <= starts).any():
    row = np.flatnonzero(ends <= starts)[0]
    raise ValueError(f"{where}, line {table.lines[row]}, column end_s: "
                     f"expected end_s > start_s = {starts[row]}, got "
                     f"{ends[row]}")
  return _build_intervals(num_clients, table.ids, starts, ends,
                          lambda row: f"{where}, line {table.lines[row]}")
