"""The one round loop of every run: 1 member or S members stepped together.

``simulation.run`` (one member) and ``sweep.run_sweep`` (S vmapped
members) build their round, sampling and evaluation and hand them to the
same ``Driver``; what every run does besides the round lives here once:

* seeding: ``seed`` -> (model init key, run key); the cohort of round r is
  drawn from ``split(fold_in(run_key, 1), R)[r]`` (a prefix of the keys of
  a longer run, so a finished run can be extended) and the round's own keys
  from the state's key;
* the evaluation schedule (``config.Evaluation``), the history rows and
  client rows (``fedjax_agg.history``), the non-finite policy
  (``config.NonFinite``), checkpoints (``open_checkpoints`` and the
  ``Checkpoints`` callback; ``fingerprint`` says what a checkpoint must
  match), the progress bar and callbacks;
* the run's recorded settings (``base_config``).

Callbacks. Everything a run does besides its rounds and evaluation is a
callback with one interface, ``types.Callback`` (a plain function
``f(row, client_row)`` is one too), in a member's ``callbacks``: called
with every history row, ``after_round`` once per round with the whole
state, ``close`` at the end, and ``stop_requested`` to end the run early.
The history's config then says at which round and why (``stopped_by``).

The run's own cross-cutting parts are such callbacks: ``history``'s
``HistoryWriter`` (the history files as the run goes), ``Checkpoints``
(save and resume, ``config.Checkpointing``), ``PrivacyAccounting`` (the
``epsilon`` column and the end at a target epsilon, ``config.Privacy``),
``EarlyStopping`` (the end when a metric stops improving) and the
TensorBoard writer of the command line.
"""

import dataclasses
import math
import signal as signal_lib
import sys
import threading
import time
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm.auto as tqdm

from fedjax_agg import checkpoint
from fedjax_agg import checks
from fedjax_agg import fingerprint as fingerprint_lib
from fedjax_agg import history as history_lib
from fedjax_agg.config import Checkpointing, Evaluation, NonFinite
from fedjax_agg.types import Callback, Model, PAD_TARGET, Params, as_callback

__all__ = ["Driver", "EarlyStopping", "Interrupted", "MAX_SEED",
           "NonFiniteError", "STOPPING_MODES", "base_config", "check_labels",
           "Checkpoints", "PrivacyAccounting", "check_rounds", "cohort_keys",
           "drawn_cohorts", "fingerprint", "num_classes_of",
           "open_checkpoints", "seed_keys"]

class NonFiniteError(FloatingPointError):
  """A run met a non-finite value its ``config.NonFinite`` policy refuses."""


class Interrupted(Exception):
  """A run stopped by SIGINT (Ctrl-C) or SIGTERM (a scheduler's
  preemption) at the end of a round, after its callbacks wrote what they
  keep (history files, a checkpoint where the run checkpoints).

  Attributes:
    signal: "SIGINT" or "SIGTERM".
    round: the last finished round.
    num_rounds: the rounds the run was asked for.
    checkpointed: whether a checkpoint of ``round`` was saved (the run
      then resumes from it with ``resume=True`` / ``--resume``).
  """

  def __init__(self, signal_name: str, round_num: int, num_rounds: int,
               checkpointed: bool):
    self.signal = signal_name
    self.round = round_num
    self.num_rounds = num_rounds
    self.checkpointed = checkpointed
    how = ("rerun the same command with --resume (resume=True) to go on"
           if checkpointed else "it had no checkpoint folder, so a rerun "
           "starts again (the command line and run_config keep one by "
           "default; in Python, Checkpointing(directory) lets a run "
           "resume)")
    super().__init__(f"interrupted ({signal_name}) after round {round_num} "
                     f"of {num_rounds}; {how}")


class _Interrupts:
  """While open (in the main thread): the first SIGINT or SIGTERM is
  noted (``signal``) and the run ends after its round; the handlers before
  it are back at once, so a second signal stops the process as usual."""

  def __init__(self):
    self.signal = None
    self._previous = {}

  def _note(self, number, frame) -> None:
    del frame
    self.signal = signal_lib.Signals(number).name
    self._restore()
    print(f"\nfedjax_agg: {self.signal}: stopping after this round "
          "(again to stop at once)", file=sys.stderr, flush=True)

  def _restore(self) -> None:
    for number, handler in self._previous.items():
      signal_lib.signal(number, handler)
    self._previous = {}

  def __enter__(self) -> "_Interrupts":
    if threading.current_thread() is threading.main_thread():
      for number in (signal_lib.SIGINT, signal_lib.SIGTERM):
        self._previous[number] = signal_lib.signal(number, self._note)
    return self

  def __exit__(self, *exc) -> None:
    self._restore()


MAX_SEED = 2**32 - 1
"""The largest seed a run takes. Seeds are 32-bit: ``jax.random.key`` keeps
only the low 32 bits of a larger one (2**32 + 5 would silently be seed 5)
and overflows at 2**63."""


def seed_keys(seed: int) -> tuple[jax.Array, jax.Array]:
  """``seed`` (an int in [0, 2**32 - 1]) -> (model init key, run key)."""
  checks.check_int("seed", seed, 0, MAX_SEED)
  # The order of the two keys is part of every golden history: swapping them
  # changes every model init and every cohort.
  return tuple(jax.random.split(jax.random.key(int(seed))))


def cohort_keys(run_key: jax.Array, num_rounds: int) -> jax.Array:
  """[R] keys of the rounds' cohorts (prefix-stable in R)."""
  # fold_in keeps the cohorts apart from the rounds' own keys (the state's
  # key starts as the run key). split(k, R)[:R'] == split(k, R') is what
  # lets a finished run be extended.
  return jax.random.split(jax.random.fold_in(run_key, 1), max(num_rounds, 1))


def drawn_cohorts(run_key: jax.Array, num_rounds: int, num_clients: int,
                  cohort_size: int, sampler: str = "auto") -> np.ndarray:
  """[R, m] the cohorts a run with ``run_key`` draws, as its rounds draw
  them (``cohort_keys``, ``rounds.sample_cohort``)."""
  from fedjax_agg import rounds  # pylint: disable=g-import-not-at-top
  keys = cohort_keys(run_key, num_rounds)
  # At most ~2^24 ids in flight (the permutation sampler holds N per draw).
  batch = max(1, min(num_rounds, 2 ** 24 // num_clients))
  return np.asarray(jax.lax.map(
      lambda key: rounds.sample_cohort(key, num_clients, cohort_size,
                                       sampler), keys, batch_size=batch))


def num_classes_of(model: Model, params: Params, x) -> int:
  """The width of the model's outputs on ``x`` (classes for metrics)."""
  shape = jax.eval_shape(lambda p, xb: model.apply(p, xb, False)[0], params,
                         jax.ShapeDtypeStruct((1,) + tuple(x.shape[1:]),
                                              x.dtype))
  return int(shape.shape[-1])


def check_labels(y, num_classes: int, where: str) -> None:
  """Refuses labels outside [0, num_classes) naming ``where`` (per-token
  targets [M, T] may also be ``types.PAD_TARGET``, a padded position)."""
  y = np.asarray(y)
  bad = (y < 0) | (y >= num_classes)
  if y.ndim > 1:
    # Only per-token targets may pad; a padded single label would be a bug in
    # the data, not a masked position.
    bad &= y != PAD_TARGET
  if bad.any():
    raise ValueError(
        f"{where} holds labels outside [0, {num_classes}) (the model's "
        f"{num_classes} outputs): {sorted(set(y[bad].tolist()))[:10]}")


def open_checkpoints(checkpointing: Optional[Checkpointing],
                     fingerprint: Callable[[], dict], state, run_key,
                     num_rounds: int):
  """-> (checkpointer or None, snapshot or None) for a run of
  ``num_rounds`` rounds; refuses a checkpoint past ``num_rounds``.
  ``fingerprint()`` (called only with ``checkpointing``) describes what a
  checkpoint must match."""
  if checkpointing is None:
    return None, None
  checkpointer, snapshot = checkpoint.open_run(
      checkpointing.directory, checkpointing.every, checkpointing.resume,
      fingerprint_lib.describe(fingerprint()), state, run_key)
  # The checkpointer is closed before raising: its writer must not outlive the
  # refused run.
  if snapshot is not None and snapshot.round > num_rounds:
    checkpointer.close()
    raise checkpoint.CheckpointMismatchError(
        f"the checkpoint in {checkpointing.directory} is at round "
        f"{snapshot.round}, past num_rounds={num_rounds}")
  return checkpointer, snapshot


class Checkpoints(Callback):
  """The callback that saves a run as ``config.Checkpointing`` says: every
  ``every`` rounds, at the last round, at a round where callbacks end
  the run and, whatever ``every`` is (0 too), at the round where a signal
  stops it (``interrupted``, set by the loop), so that an interrupted run
  resumes (``pack`` turns the members' rows into what a checkpoint
  holds). ``close()`` releases the checkpointer."""
  interrupted = False
  saved_round = None

  def __init__(self, checkpointer, run_key, num_rounds: int, rows,
               client_rows, pack=lambda rows, client_rows: (
                   rows[0], client_rows[0])):
    self.checkpointer, self.run_key = checkpointer, run_key
    self.num_rounds, self.pack = num_rounds, pack
    self.rows, self.client_rows = rows, client_rows

  def __call__(self, row: dict, client: Optional[dict]) -> None:
    del row, client  # It saves whole rounds (after_round).

  def after_round(self, round_num: int, state, stopping: bool) -> None:
    """Saves the run after round ``round_num`` when it is due, or when the
    run ends there because callbacks asked (``stopping``)."""
    checkpointer = self.checkpointer
    if checkpointer.should_save(round_num, self.num_rounds) or (
        # An early stop is saved only where the run checkpoints at all
        # (every > 0), or where a signal ended it: there the save is what
        # makes it resumable.
        stopping and (checkpointer.every > 0 or self.interrupted)):
      checkpointer.save(round_num, state, self.run_key,
                        *self.pack(self.rows, self.client_rows))
      self.saved_round = round_num

  def close(self) -> None:
    """Releases the checkpointer (waits for its pending writes)."""
    self.checkpointer.close()


class PrivacyAccounting(Callback):
  """The callback of a run's privacy accounting (``config.Privacy``): it
  writes ``epsilon``, the privacy loss after the row's round
  (``epsilons[r - 1]``), into each row, and asks the run to end at
  ``final_round``, the last round whose epsilon stays within the target
  (None: no target, or the run ends first). It goes first in a member's
  callbacks, so that the others see the column."""

  def __init__(self, epsilons, final_round: Optional[int] = None):
    self.epsilons = np.asarray(epsilons, np.float64)
    self.final_round = final_round
    self.stop_requested = False

  def __call__(self, row: dict, client: Optional[dict]) -> None:
    del client
    round_num = int(row["round"])
    # Round 0 (the initial model) has spent no privacy: no epsilon column.
    if round_num >= 1:
      row["epsilon"] = float(self.epsilons[round_num - 1])
    self.stop_requested = (self.final_round is not None
                           and round_num >= self.final_round)


def check_rounds(num_rounds) -> None:
  """Refuses ``num_rounds`` unless it is an int >= 0 (ValueError)."""
  if isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or (
      num_rounds < 0):
    raise ValueError(f"num_rounds must be an int >= 0, got {num_rounds!r}")


@dataclasses.dataclass(kw_only=True, eq=False)
class Driver:
  """The round loop over ``num_members`` runs stepped together.

  Attributes:
    round_step: ``(state, cohorts) -> (state, outputs)`` for all members
      (outputs already on the host, numpy).
    sample: ``r -> cohorts`` of round r (0-based).
    evaluate: ``(state, with_clients) -> [one dict of test metrics per
      member]``; ``with_clients``: also the losses on the clients' data.
    member_output: ``(outputs, m) -> member m's RoundOutput``.
    member_state: ``(state, m) -> member m's ServerState`` (for the
      non-finite checks).
    num_members: M.
    nonfinite: the ``config.NonFinite`` policy.
    evaluation: the ``config.Evaluation`` schedule.
    progress: show a progress bar.
    callbacks: per member, called with each row (see the module docstring).
    with_losses: the rounds compute per-client losses (else the rows have
      no ``cohort_loss_*`` columns).
    stopped_at: set by ``loop``: the round at which callbacks ended the
      run (None: it ran to its end).
  """
  round_step: Callable
  sample: Callable
  evaluate: Callable
  member_output: Callable
  member_state: Callable
  num_members: int
  nonfinite: NonFinite
  evaluation: Evaluation
  progress: bool
  callbacks: Sequence[Sequence[Callback]]
  with_losses: bool = True
  stopped_at: Optional[int] = None

  def __post_init__(self):
    self.callbacks = [[as_callback(callback, f"callbacks[{i}]")
                       for i, callback in enumerate(callbacks)]
                      for callbacks in self.callbacks]

  def initial_rows(self, state, num_rounds: int) -> list[dict]:
    """The round-0 rows, one per member: the initial models' test metrics
    (and client losses if due), checked for non-finite values and handed
    to the callbacks."""
    if self.progress:
      # The bar appears after the first evaluation; say what runs first.
      print("fedjax_agg: evaluating the initial model, then compiling the "
            "round (the first round's time includes compilation) ...",
            file=sys.stderr, flush=True)
    with_clients = self.evaluation.clients_due(0, num_rounds)
    rows = [{"round": 0, "time_s": 0.0, **test}
            for test in self.evaluate(state, with_clients)]
    for m, row in enumerate(rows):
      self._check_model(row, state, m)
      for callback in self.callbacks[m]:
        callback(row, None)
    return rows

  def replay(self, rows: list[list[dict]],
             client_rows: list[list[dict]]) -> None:
    """Hands a resumed run's restored rows to the callbacks, in order, so
    that history writers start from the checkpoint's rows (a resumed run's
    files then hold every round, not only those after the resume)."""
    for m in range(self.num_members):
      for i, row in enumerate(rows[m]):
        client = client_rows[m][i - 1] if i > 0 else None
        for callback in self.callbacks[m]:
          callback(row, client)

  def _check_model(self, row: dict, state, m: int) -> None:
    """The global model (and its test loss) must stay finite."""
    if self.nonfinite.model == "record":
      return
    bad = []
    loss = row.get("test_loss")
    if loss is not None and not np.isfinite(loss):
      bad.append(f"test loss {loss}")
    params = self.member_state(state, m).params
    # Integer leaves cannot be non-finite. Each leaf's check waits for the
    # device; under "record" none runs.
    finite = all(bool(jnp.all(jnp.isfinite(leaf)))
                 for leaf in jax.tree.leaves(params)
                 if jnp.issubdtype(leaf.dtype, jnp.inexact))
    if not finite:
      bad.append("non-finite global parameters")
    if bad:
      member = f" (member {m})" if self.num_members > 1 else ""
      raise NonFiniteError(
          f"round {row['round']}{member}: {', '.join(bad)}; the model "
          "diverged (lower the learning rate, or pass "
          "NonFinite(model='record') to record it and go on)")

  def loop(self, state, first_round: int, num_rounds: int,
           rows: list[list[dict]], client_rows: list[list[dict]]):
    """Rounds ``first_round + 1 .. num_rounds``; appends to the rows;
    closes the callbacks when it ends."""
    self._interrupts = _Interrupts()
    try:
      with self._interrupts:
        state = self._loop(state, first_round, num_rounds, rows,
                           client_rows)
    # Callbacks close even when a round raises, so that the history files hold
    # every row written before the error.
    finally:
      for callback in self._each_once():
        callback.close()
    # Raised after close(): the checkpoint's pending writes are done and
    # ``saved_round`` says whether the stopping round was kept.
    if self._interrupts.signal is not None and self.stopped_at is not None:
      raise Interrupted(self._interrupts.signal, self.stopped_at,
                        num_rounds, any(
                            isinstance(c, Checkpoints)
                            and c.saved_round == self.stopped_at
                            for c in self._each_once()))
    return state

  def _each_once(self) -> list[Callback]:
    """Every member's callbacks, one shared by several members once."""
    seen = {}
    for callbacks in self.callbacks:
      for callback in callbacks:
        seen.setdefault(id(callback), callback)
    return list(seen.values())

  def _loop(self, state, first_round, num_rounds, rows, client_rows):
    desc = "rounds" if self.num_members == 1 else (
        f"rounds ({self.num_members} members)")
    if first_round < num_rounds and self._stop_requested():
      # The replayed rows restored the callbacks' state (e.g. EarlyStopping's
      # count), so a run resumed after an early stop runs no further round.
      self.stopped_at = first_round  # A resumed run that had stopped.
      return state
    bar = tqdm.trange(first_round, num_rounds, desc=desc,
                      disable=not self.progress or first_round >= num_rounds)
    shared = self._each_once()  # told after each round, once each
    for r in bar:
      start = time.perf_counter()
      state, outputs = self.round_step(state, self.sample(r))
      # ``round_step`` returns host (numpy) outputs, so this time includes the
      # device's work, not only its dispatch.
      elapsed = time.perf_counter() - start
      round_num = r + 1
      if self.evaluation.due(round_num, num_rounds):
        with_clients = self.evaluation.clients_due(round_num, num_rounds)
        new_rows = [{"round": round_num, "time_s": elapsed, **test}
                    for test in self.evaluate(state, with_clients)]
      else:
        new_rows = [{"round": round_num, "time_s": elapsed}
                    for _ in range(self.num_members)]
      for m, row in enumerate(new_rows):
        out = self.member_output(outputs, m)
        row.update(history_lib.round_scalars(out, self.with_losses))
        client = history_lib.client_row(round_num, out, self.with_losses)
        rows[m].append(row)
        client_rows[m].append(client)
        for callback in self.callbacks[m]:
          callback(row, client)
        # The checks come after the callbacks: the row of the round that fails
        # is already in the history when the error is raised.
        self._check_clients(out, round_num, m)
        # With "raise" the params are checked every round, evaluated or not, so
        # a divergence is reported at the round it happened.
        if "test_loss" in row or self.nonfinite.model == "raise":
          self._check_model(row, state, m)
      if "test_accuracy" in new_rows[0]:
        bar.set_postfix(acc=" ".join(f"{row['test_accuracy']:.4f}"
                                     for row in new_rows[:4]))
      interrupted = getattr(self, "_interrupts", None) is not None and (
          self._interrupts.signal is not None)
      # A stop asked at the last round is no early stop: nothing is recorded.
      stop = (self._stop_requested() or interrupted) and (
          round_num < num_rounds)
      for callback in shared:
        if isinstance(callback, Checkpoints):
          callback.interrupted = interrupted
        callback.after_round(round_num, state, stop)
      if stop:
        self.stopped_at = round_num
        bar.close()
        break
    return state

  def _stop_requested(self) -> bool:
    """Whether every member has a callback asking the run to end."""
    # Members are stepped together (one vmapped round): the run can end only
    # when all of them ask; the others keep recording until then.
    return all(any(callback.stop_requested for callback in callbacks)
               for callbacks in self.callbacks)

  def stop_record(self) -> dict:
    """What the history's config records of a stop by callbacks."""
    if self.stopped_at is None:
      return {}
    names = sorted({type(callback).__name__
                    for callbacks in self.callbacks for callback in callbacks
                    if callback.stop_requested})
    return {"stopped_by": ", ".join(names),
            "stopped_at_round": int(self.stopped_at)}

  def _check_clients(self, out, round_num: int, m: int) -> None:
    if self.nonfinite.clients != "raise":
      return
    # Rows of mask 0 are not participants of the round: a non-finite value
    # there is no client's failure.
    excluded = (np.asarray(out.mask) > 0) & ~np.asarray(out.finite)
    if excluded.any():
      member = f" (member {m})" if self.num_members > 1 else ""
      ids = np.asarray(out.client_ids)[excluded].tolist()
      raise NonFiniteError(
          f"round {round_num}{member}: clients {ids} returned non-finite "
          "models or losses (NonFinite(clients='raise'); 'exclude' drops "
          "them from the round instead)")




STOPPING_MODES = ("max", "min")
"""The modes of ``EarlyStopping``: whether a higher ("max") or lower
("min") metric is better."""


class EarlyStopping(Callback):
  """A callback that ends a run when a metric stops improving.

  After each row holding ``metric`` (the evaluated rounds), the run ends
  once the metric has not improved on its best by more than ``min_delta``
  for ``patience`` such rows in a row. A non-finite value never counts as
  an improvement. The history's config records ``stopped_by`` and
  ``stopped_at_round``; with checkpoints the stopping round is saved.

  Args:
    metric: a history column, e.g. "test_accuracy", "test_loss".
    mode: "max" (higher is better) or "min".
    patience: evaluated rows without improvement before stopping (>= 1).
    min_delta: the least change that counts as an improvement (>= 0).
  """

  def __init__(self, metric: str = "test_accuracy", mode: str = "max",
               patience: int = 5, min_delta: float = 0.0):
    if not isinstance(metric, str) or not metric:
      raise TypeError(f"metric must be a history column name, got "
                      f"{metric!r}")
    checks.check_choice("mode", mode, STOPPING_MODES)
    checks.check_int("patience", patience, 1)
    checks.check_range("min_delta", min_delta, 0)
    self.metric, self.mode = metric, mode
    self.patience, self.min_delta = patience, float(min_delta)
    self.best = -math.inf if mode == "max" else math.inf
    self.since_best = 0
    self.stop_requested = False

  def __call__(self, row: dict, client: Optional[dict]) -> None:
    del client
    if self.metric not in row:
      if row.get("round", 0) >= 1 and "test_loss" in row:
        # An evaluated round without it: a typo would never stop the run.
        raise ValueError(
            f"EarlyStopping: metric {self.metric!r} is not a column of the "
            f"history; columns of round {row['round']}: {sorted(row)}")
      return
    value = float(row[self.metric])
    gain = value - self.best if self.mode == "max" else self.best - value
    if math.isfinite(value) and gain > self.min_delta:
      self.best, self.since_best = value, 0
    else:
      self.since_best += 1
    self.stop_requested = self.since_best >= self.patience


def _data_fingerprint(data):
  if isinstance(data, (list, tuple)) and data and not hasattr(data[0],
                                                              "shape"):
    return [fingerprint_lib.data_fingerprint(d) for d in data]
  return fingerprint_lib.data_fingerprint(data)


def fingerprint(*, model, data, test_data, participation, training,
                evaluation, nonfinite, local_update, init_params, config,
                **specific) -> dict:
  """What must match for a checkpoint to continue a run: everything that
  decides its results (not how rounds are executed, nor R). ``data`` is
  one ``FederatedData`` or one per seed; ``specific``: the entry point's
  own (a run's seed, aggregator and privacy; a sweep's build, grid and
  seeds)."""
  return {"participation": participation, "training": training,
          "evaluation": evaluation, "model": model,
          "local_update": local_update, "nonfinite": nonfinite,
          "init_params": init_params, "data": _data_fingerprint(data),
          "test_data": fingerprint_lib.data_fingerprint(test_data),
          "config": config, **specific}


def base_config(*, num_rounds: int, participation: float, cohort_size: int,
                training, learning_rate, seed: int, num_clients: int,
                num_classes: int, num_devices: int,
                extra: Optional[dict] = None) -> dict:
  """The settings every history's config records (then ``extra``)."""
  config = {"num_rounds": num_rounds, "participation": participation,
            "cohort_size": cohort_size, "local_epochs": training.epochs,
            "batch_size": training.batch_size,
            "learning_rate": learning_rate, "seed": int(seed),
            "num_clients": num_clients, "num_classes": num_classes,
            "num_devices": num_devices}
  config.update(extra or {})
  return config
