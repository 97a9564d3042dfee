"""Asynchronous buffered aggregation on a simulated clock (host-side events).

FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous
Aggregation", AISTATS 2022): ``concurrency`` C clients train at once, each
from the global model version current when it started; the server keeps
their updates in a buffer and steps (version += 1) whenever the buffer holds
``buffer_size`` K of them. FedAsync (Xie et al., 2019) is K = 1.

The simulation (``AsyncSchedule``):

* At t = 0, C clients online at 0 are sampled uniformly without
  replacement and start from version 0.
* A client starting at s finishes at ``s + task_time`` (``System``). If it
  goes offline before (``online_until(s) < finish``) it is dropped at the
  time it goes offline; events are ordered by (time, client id).
* At a finish, the update enters the buffer tagged with its start version;
  whenever the buffer holds K updates the server steps. Once every event of
  that instant is processed (simultaneous finishes enter the buffer in
  client id order, and any steps they fill are taken), replacements start
  from the current version: clients sampled uniformly without replacement
  among those idle (not training, the ones just finished included) and
  online, until C train again. A drop is replaced likewise, at the drop's
  time. So a step and the replacements of its own instant never overlap:
  with C = K and equal task times every update has staleness 0.
* If fewer than C idle clients are online, those that are start and a wake
  event at the earliest ``next_online`` of the idle clients tops the pool up
  again then.

A step's record holds the K clients in arrival order, their start versions
and staleness ``s = version_before_step - start_version`` (the number of
steps taken while the client trained), and the step's time.

Staleness is unbounded in general (a slow client may train while any number
of steps happen). A run loop that keeps a ring of the last V global models
passes ``max_staleness = V - 1``: an update older than that is discarded at
arrival (its client's slot is refilled as after a drop) and counted in the
step's ``num_stale``.

Termination. Simulated time never goes backwards, every task takes a
positive time and every drop happens after its client's start. A step
that needs more than ``max_drops_per_step`` drops and discarded stale
updates raises RuntimeError, and so does a run in which no client is
training and none will ever be online again; a population in which no
client is ever online raises ValueError at construction.

Sampling cost. Idle online clients are drawn by rejection (uniform ids,
rejecting busy, repeated and offline ones, in vectorised batches of 16 to
8192 candidates); after four batches without enough, one vectorised pass
over all N clients picks the rest. Per event the cost is independent of N
unless few idle clients are online.

Resuming. The sequence of steps is a deterministic function of the system
(built from its seeds), C, K, ``max_staleness`` and ``seed``: the first n
steps of a longer run equal a run of n steps. ``state()`` returns a
JSON-serialisable snapshot and ``AsyncSchedule.from_state(system, state)``
continues from it, with the same steps as the uninterrupted run.
"""

import heapq
import math
from typing import Any, NamedTuple, Optional

import numpy as np

from fedjax_agg import checks
from fedjax_agg.systems import _common
from fedjax_agg.systems._sync import check_system
from fedjax_agg.systems._sync import System

__all__ = ["AsyncSchedule", "AsyncStep"]

# Events are heap tuples (time, client, kind, start version, start time): ties
# in time go by client id, and a wake carries id N so that it comes after every
# client event of its instant.
_FINISH, _DROP, _WAKE = 0, 1, 2
# Growing batches: small ones are cheap while most clients are idle and online,
# large ones cut the retries when few are.
_BATCHES = (16, 128, 1024, 8192)
_STATE_KEYS = ("num_clients", "concurrency", "buffer_size", "max_staleness",
               "max_drops_per_step", "time", "version", "rng", "events",
               "buffer", "wakes", "dropped", "stale", "started")


class AsyncStep(NamedTuple):
  """One server step of the asynchronous schedule.

  Attributes:
    client_ids: [K] int64, the buffered clients in arrival order.
    start_versions: [K] int64, the global version each started from.
    staleness: [K] int64, ``version - 1 - start_versions`` (>= 0).
    start_times: [K] float64, when each started.
    arrival_times: [K] float64, when each update arrived.
    time: the step's time (the last arrival).
    version: the version this step produces (1 for the first step).
    num_dropped: clients dropped offline since the previous step.
    num_stale: updates discarded as older than ``max_staleness`` since the
      previous step.
  """
  client_ids: np.ndarray
  start_versions: np.ndarray
  staleness: np.ndarray
  start_times: np.ndarray
  arrival_times: np.ndarray
  time: float
  version: int
  num_dropped: int
  num_stale: int


class AsyncSchedule:
  """FedBuff's event simulation (see the module docstring).

  Args:
    system: the population's ``System``.
    concurrency: C, clients training at once, in [buffer_size, N].
    buffer_size: K >= 1, updates per server step.
    seed: int >= 0, for the choice of clients.
    max_staleness: optional int >= 0; older updates are discarded.
    max_drops_per_step: drops plus discarded updates allowed before one
      step before RuntimeError (>= 1).

  Raises:
    ValueError: a bad argument (named); C < K (naming both); no client is
      ever online.
  """

  def __init__(self, system: System, concurrency: int, buffer_size: int,
               seed: int, *, max_staleness: Optional[int] = None,
               max_drops_per_step: int = 100_000):
    self._configure(system, concurrency, buffer_size, max_staleness,
                    max_drops_per_step)
    _common.check_seed(seed)
    first = np.min(system.availability.next_online(
        np.arange(system.num_clients), 0.0))
    if not math.isfinite(first):
      raise ValueError("system.availability never brings any client online: "
                       "no step can happen")
    # Only the choice of clients is random here; task times and availability
    # come from the system's own seeds, so they do not move with ``seed``.
    self._rng = np.random.default_rng(np.random.SeedSequence(seed))
    self._time, self._version = 0.0, 0
    self._events, self._buffer, self._wakes = [], [], set()
    self._dropped = self._stale = self._started = 0
    self._fill()

  def _configure(self, system, concurrency, buffer_size, max_staleness,
                 max_drops_per_step):
    check_system(system)
    checks.check_int("buffer_size", buffer_size, 1)
    checks.check_int("concurrency", concurrency, 1)
    if concurrency < buffer_size:
      raise ValueError(f"concurrency (C={concurrency}) must be >= buffer_size"
                       f" (K={buffer_size}): fewer clients than a buffer "
                       "would never fill it")
    if concurrency > system.num_clients:
      raise ValueError(f"concurrency (C={concurrency}) must be <= "
                       f"num_clients (N={system.num_clients})")
    if max_staleness is not None:
      checks.check_int("max_staleness", max_staleness, 0)
    checks.check_int("max_drops_per_step", max_drops_per_step, 1)
    self.system = system
    self.concurrency, self.buffer_size = int(concurrency), int(buffer_size)
    self.max_staleness = None if max_staleness is None else int(max_staleness)
    self.max_drops_per_step = int(max_drops_per_step)
    self._running = np.zeros(system.num_clients, bool)
    self._num_running = 0
    self._task_times = system.task_times(np.arange(system.num_clients))
    if not np.all(self._task_times > 0):
      client = int(np.flatnonzero(self._task_times <= 0)[0])
      raise ValueError(f"system.workload gives client {client} a task time "
                       "of 0 s: examples, down_bytes or up_bytes must be > 0")

  @property
  def time(self) -> float:
    """Simulated seconds so far (the time of the last event processed)."""
    return self._time

  @property
  def version(self) -> int:
    """The current global model version (steps taken)."""
    return self._version

  @property
  def num_started(self) -> int:
    """Tasks started so far (each downloaded the model once)."""
    return self._started

  @property
  def num_running(self) -> int:
    """Clients training now."""
    return self._num_running

  def _sample_idle(self, count: int, now: float):
    """Up to ``count`` distinct idle clients online at ``now``, uniformly.

    The first ``count`` distinct eligible values of an i.i.d. uniform
    sequence of ids, then (if the batches run out) a uniform choice among
    all remaining eligible clients: a uniform sample without replacement.

    Returns:
      ([M] client ids, [M] the time each goes offline), M <= count.
    """
    query = self.system.availability._query   # (times, online, until)
    num_clients = self.system.num_clients
    chosen, until = np.zeros((0,), np.int64), np.zeros((0,))
    for batch in _BATCHES:
      candidates = self._rng.integers(0, num_clients, max(batch, 4 * count))
      candidates = candidates[~self._running[candidates]]
      # Duplicates are dropped keeping the order of the draws: np.unique alone
      # would sort by id and favour small ids when the batch is cut to ``take``.
      _, first = np.unique(candidates, return_index=True)
      candidates = candidates[np.sort(first)]
      candidates = candidates[~np.isin(candidates, chosen)]
      _, online, ends = query(candidates, now)
      take = slice(0, count - chosen.shape[0])
      chosen = np.concatenate([chosen, candidates[online][take]])
      until = np.concatenate([until, ends[online][take]])
      if chosen.shape[0] == count:
        return chosen, until
    idle = np.flatnonzero(~self._running)
    idle = idle[~np.isin(idle, chosen)]
    _, online, ends = query(idle, now)
    eligible = np.flatnonzero(online)
    pick = self._rng.choice(eligible, min(count - chosen.shape[0],
                                          eligible.shape[0]), replace=False)
    return (np.concatenate([chosen, idle[pick]]),
            np.concatenate([until, ends[pick]]))

  def _fill(self) -> None:
    """Starts idle online clients until C train, or schedules a wake."""
    now = self._time
    need = self.concurrency - self._num_running
    if need <= 0:
      return
    new, until = self._sample_idle(need, now)
    if new.shape[0]:
      finish = now + self._task_times[new]
      self._running[new] = True
      self._num_running += new.shape[0]
      self._started += new.shape[0]
      for client, end, gone in zip(new.tolist(), finish.tolist(),
                                   until.tolist(), strict=True):
        # A client that goes offline before its task ends is dropped then; only
        # one of its two events is ever queued.
        if gone < end:
          heapq.heappush(self._events, (gone, client, _DROP, self._version,
                                        now))
        else:
          heapq.heappush(self._events, (end, client, _FINISH, self._version,
                                        now))
    if new.shape[0] < need:
      # Every idle client online now has started: the others are offline.
      idle = np.flatnonzero(~self._running)
      wake = float(np.min(self.system.availability.next_online(idle, now),
                          initial=math.inf))
      # One pending wake at or before this time already refills the pool; more
      # would only repeat the work.
      if math.isfinite(wake) and not any(w <= wake for w in self._wakes):
        self._wakes.add(wake)
        heapq.heappush(self._events, (wake, self.system.num_clients, _WAKE,
                                      -1, wake))

  def next_step(self) -> AsyncStep:
    """Simulates until the next server step and returns its record."""
    while True:
      if not self._events:
        raise RuntimeError(f"no client is training at t={self._time} and "
                           "none will ever be online again: the schedule "
                           "cannot take another step")
      time, client, kind, start_version, start_time = heapq.heappop(
          self._events)
      self._time = time
      record = None
      if kind == _WAKE:
        self._wakes.discard(time)
      else:
        self._running[client] = False
        self._num_running -= 1
        if kind == _DROP:
          self._dropped += 1
        # The server keeps the last V = max_staleness + 1 models: an update from
        # an older version has no base model left and is discarded at arrival.
        elif (self.max_staleness is not None
              and self._version - start_version > self.max_staleness):
          self._stale += 1
        else:
          self._buffer.append((client, start_version, start_time, time))
          if len(self._buffer) == self.buffer_size:
            record = self._step()
      if not self._events or self._events[0][0] > time:
        self._fill()   # the instant is over: start the replacements
      if record is not None:
        return record
      if self._dropped + self._stale > self.max_drops_per_step:
        raise RuntimeError(
            f"{self._dropped} drops and {self._stale} stale updates since "
            f"the last step exceed max_drops_per_step="
            f"{self.max_drops_per_step} (t={self._time}): clients go offline "
            "before finishing (or arrive too stale) faster than the buffer "
            "fills")

  def _step(self) -> AsyncStep:
    clients, versions, starts, arrivals = (np.asarray(column) for column in
                                           zip(*self._buffer, strict=True))
    record = AsyncStep(
        client_ids=clients.astype(np.int64),
        start_versions=versions.astype(np.int64),
        staleness=(self._version - versions).astype(np.int64),
        start_times=starts.astype(np.float64),
        arrival_times=arrivals.astype(np.float64),
        time=self._time, version=self._version + 1,
        num_dropped=self._dropped, num_stale=self._stale)
    self._version += 1
    self._buffer, self._dropped, self._stale = [], 0, 0
    return record

  def steps(self, num_steps: int) -> list[AsyncStep]:
    """The next ``num_steps`` steps' records."""
    checks.check_int("num_steps", num_steps, 0)
    return [self.next_step() for _ in range(num_steps)]

  def state(self) -> dict[str, Any]:
    """A JSON-serialisable snapshot (Python ints, floats, lists, dicts)."""
    return {
        "num_clients": self.system.num_clients,
        "concurrency": self.concurrency,
        "buffer_size": self.buffer_size,
        "max_staleness": self.max_staleness,
        "max_drops_per_step": self.max_drops_per_step,
        "time": self._time,
        "version": self._version,
        "rng": self._rng.bit_generator.state,
        "events": [list(event) for event in self._events],
        "buffer": [list(entry) for entry in self._buffer],
        "wakes": sorted(self._wakes),
        "dropped": self._dropped,
        "stale": self._stale,
        "started": self._started,
    }

  @classmethod
  def from_state(cls, system: System, state: dict[str, Any]
                 ) -> "AsyncSchedule":
    """Continues a schedule from ``state()`` over the same ``system``."""
    if not isinstance(state, dict):
      raise TypeError(f"state must be a dict from AsyncSchedule.state(), got "
                      f"{type(state).__name__}")
    missing = sorted(set(_STATE_KEYS) - set(state))
    if missing:
      raise ValueError(f"state lacks {missing}: pass a dict from "
                       "AsyncSchedule.state()")
    if state["num_clients"] != getattr(system, "num_clients", None):
      raise ValueError(f"state is for {state.get('num_clients')} clients, the"
                       f" system has {getattr(system, 'num_clients', None)}")
    schedule = cls.__new__(cls)
    schedule._configure(system, state["concurrency"], state["buffer_size"],
                        state["max_staleness"], state["max_drops_per_step"])
    schedule._rng = np.random.default_rng()
    schedule._rng.bit_generator.state = state["rng"]
    schedule._time = float(state["time"])
    schedule._version = int(state["version"])
    schedule._events = [(float(t), int(c), int(k), int(v), float(s))
                        for t, c, k, v, s in state["events"]]
    # The saved list is the heap's array; heapify restores the invariant
    # whatever order the serialiser kept.
    heapq.heapify(schedule._events)
    schedule._buffer = [(int(c), int(v), float(s), float(a))
                        for c, v, s, a in state["buffer"]]
    schedule._wakes = {float(w) for w in state["wakes"]}
    schedule._dropped = int(state["dropped"])
    schedule._stale = int(state["stale"])
    schedule._started = int(state["started"])
    # The running clients are exactly those with a finish or drop queued.
    for _, client, kind, _, _ in schedule._events:
      if kind != _WAKE:
        schedule._running[client] = True
        schedule._num_running += 1
    return schedule
