"""What a run records: one row of scalars per round, plus per-client arrays.

``History.rows[0]`` is the initial model's evaluation; row r holds round
r's scalars (training loss, the aggregator's scalar metrics, the count of
excluded non-finite clients and, at evaluated rounds, the test metrics).
``History.client_rows[r - 1]`` holds round r's per-client arrays (cohort,
losses, steps, the aggregator's per-client metrics).

Files. ``History.save`` writes ``history.csv`` (rows) and ``history.json``
(config, rows and client rows); both are written to a temporary file and
renamed, and the JSON is strict (NaN and infinities become ``null``).
``HistoryWriter`` is a round callback that rewrites them after every round,
so a run that dies keeps what it computed.

The output layout, the same for every entry point (``simulation.run``'s
caller, ``sweep``, the command line, ``experiment.run_config`` and the
``experiments/`` scripts): one folder per run, holding its
``config.json``; a run of one member writes ``history.csv|json`` in it, a
run of S > 1 members (seeds x grid points) one subfolder per member
(``<run>/<member>/history.csv|json``, named by ``sweep.member_name``, e.g.
``seed0`` or ``alpha5_seed0``) and a ``summary.csv``. ``member_folder``
says where a member's files go, ``save_run`` writes them and
``load_saved`` reads one back.

Runs never overwrite runs, and the library deletes only files it wrote
and recorded (``manifest``): a folder that already holds a run is refused
by ``check_fresh`` and by ``save_run`` unless ``overwrite`` is given; an
overwrite removes exactly the earlier run's recorded, unchanged files
(so a sweep never mixes with an earlier single run's files) and refuses
where the folder holds anything else. A folder holding a run written
without a manifest is never cleared.
"""

import csv
import dataclasses
import os
import json
import math
from typing import Mapping, Optional, Sequence

import numpy as np

from fedjax_agg import jsonio
from fedjax_agg import manifest
from fedjax_agg.types import Callback

__all__ = ["History", "HistoryWriter", "RUN_FILES", "TensorBoardWriter",
           "check_fresh", "client_row", "earlier_run",
           "load_saved", "member_folder", "round_scalars",
           "rounds_to_target", "save_run", "write_run"]

RUN_FILES = ("config.json", "history.csv", "history.json", "summary.csv",
             "summary.json", "curves.png", "partition.png",
             "accuracy_by_time.png")
"""The files a run writes in its folder and its member folders; the first
five mark a folder as holding a run."""
_MARKERS = RUN_FILES[:5]
# Sub-folders a run keeps for itself (resume reads them).
_KEPT = ("checkpoint", "checkpoints")


def _run_files(run_dir: str, names) -> list[str]:
  """``names`` in ``run_dir`` and in its sub-folders (member folders, an
  algorithm's seeds), relative paths, sorted."""
  found = []
  if not os.path.isdir(run_dir):
    return found
  for folder, subfolders, files in os.walk(run_dir):
    # Checkpoint folders are orbax's (many files, none of them a run's record);
    # pruned in place, so ``os.walk`` never descends into them.
    subfolders[:] = sorted(d for d in subfolders if d not in _KEPT)
    relative = os.path.relpath(folder, run_dir)
    if relative != "." and relative.count(os.sep) >= 2:
      subfolders[:] = []  # <run>/<algorithm>/<member> is the deepest
    found += [os.path.normpath(os.path.join(relative, name))
              for name in sorted(files) if name in names]
  return found


def earlier_run(run_dir: str) -> list[str]:
  """The files of a run already in ``run_dir`` (``config.json``,
  ``history.csv|json``, ``summary.csv`` at its top or in its member
  folders), relative paths; [] for a fresh or missing folder."""
  return _run_files(run_dir, _MARKERS)


def check_fresh(run_dir: str, overwrite: bool = False,
                names: Sequence[str] = (),
                keep: Sequence[str] = ()) -> manifest.Plan:
  """Whether a run may write into ``run_dir``: refuses a folder holding a
  run unless ``overwrite`` (ValueError naming the folder and what is in
  it), and returns what the overwrite removes (``manifest.check``).

  Args:
    run_dir: the run's folder.
    overwrite: replace the recorded run there.
    names: the files the run writes, relative to ``run_dir`` (a user's
      file of one of these names is never replaced).
    keep: with ``overwrite``, files no run wrote that may stay.
  """
  # Strict: a truthy string ("false") must not turn on a removal.
  if not isinstance(overwrite, bool):
    raise TypeError(f"overwrite must be a bool, got {overwrite!r}")
  if os.path.isdir(run_dir) and manifest.read(run_dir) is None:
    # A run written without a manifest (by older code): its record at the
    # top of the folder (a user's files further down are not a run).
    files = [name for name in _MARKERS
             if os.path.isfile(os.path.join(run_dir, name))]
    if files:
      shown = ", ".join(files[:4]) + (" ..." if len(files) > 4 else "")
      if not overwrite:
        raise ValueError(
            f"{run_dir} already holds a run ({shown}); choose another "
            "folder, or overwrite it explicitly (--overwrite, "
            "overwrite=True)")
      # Refused even with ``overwrite``: without a manifest nothing says which
      # of these files the library wrote, and it deletes only what it recorded.
      raise ValueError(
          f"{run_dir} holds a run's files ({shown}) "
          f"but no record of what it wrote ({manifest.FILE}); the library "
          "never clears such a folder: move them or choose another folder")
  return manifest.check(run_dir, names, overwrite=overwrite, keep=keep)


@dataclasses.dataclass
class History:
  """One row of scalars per round (row 0 = the initial model), plus the
  per-round client-level arrays (cohort, weights, losses)."""
  rows: list[dict]
  client_rows: list[dict]
  config: dict

  def to_dataframe(self):
    """The rows as a pandas DataFrame: one row per round (needs pandas)."""
    import pandas as pd  # pylint: disable=g-import-not-at-top
    return pd.DataFrame(self.rows)

  def column(self, name: str) -> np.ndarray:
    """Column ``name`` over the rows: ``[R + 1]`` float64, NaN for a row
    without it (or with None)."""
    return np.array([np.nan if row.get(name) is None else row[name]
                     for row in self.rows], np.float64)

  @classmethod
  def load(cls, directory: str, name: str = "history") -> "History":
    """The History ``save`` wrote to ``directory`` (from its JSON)."""
    path = os.path.join(directory, f"{name}.json")
    try:
      saved = jsonio.load_json(path)
    except (OSError, ValueError, RecursionError) as error:
      why = ("nested too deeply" if isinstance(error, RecursionError)
             else error)
      raise ValueError(f"{path}: not a saved history ({why})") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("rows"),
                                                     list):
      raise ValueError(f"{path}: not a saved history (no rows)")
    # Non-finite numbers were saved as null; ``column`` reads them as NaN.
    return cls(saved["rows"], saved.get("clients") or [],
               saved.get("config") or {})

  def save(self, directory: str, name: str = "history") -> dict[str, str]:
    """Writes ``<name>.csv`` (rows) and ``<name>.json`` (everything)."""
    os.makedirs(directory, exist_ok=True)
    csv_path = os.path.join(directory, f"{name}.csv")
    json_path = os.path.join(directory, f"{name}.json")
    # Rows differ in keys (test metrics only at evaluated rounds): the header is
    # their union in first-seen order, and a missing value an empty cell.
    columns = list(dict.fromkeys(k for row in self.rows for k in row))
    lines = _CsvText()
    writer = csv.DictWriter(lines, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(self.rows)
    jsonio.write_text(csv_path, lines.text)
    # One line: with per-client arrays for every round the file is large, and
    # indentation would multiply it.
    jsonio.dump_json({"config": self.config, "rows": self.rows,
                      "clients": self.client_rows}, json_path, indent=None)
    return {"csv": csv_path, "json": json_path}


def check_output_dir(path: str, names: Sequence[str] = ()) -> str:
  """Makes sure results can be written to ``path``, before anything runs.

  Writes nothing: a missing ``path`` is created by the first file written
  into it, so a refused run leaves no folder behind.

  Args:
    path: the output folder.
    names: the files that will be written there, relative to ``path``
      (e.g. "history.csv", "FedAvg/seed0/history.json").

  Returns:
    ``path``.

  Raises:
    ValueError: naming the path: ``path`` is a file, cannot be created or
      is not writable; one of ``names``, or a folder on the way to it, is
      a directory where a file goes (or a file where a folder goes), or an
      existing file that cannot be overwritten.
  """
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{path} exists and is not a directory")
  # A missing folder is created by the first write, so what must be writable is
  # its nearest existing ancestor.
  existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise ValueError(f"cannot create {path}: {existing} is a file")
  if not os.access(existing, os.W_OK | os.X_OK):
    raise ValueError(f"{path} is not writable" if os.path.isdir(path) else
                     f"cannot create {path}: {existing} is not writable")
  for name in names:
    target = os.path.join(path, name)
    folder = path
    for part in os.path.normpath(name).split(os.sep)[:-1]:
      folder = os.path.join(folder, part)
      if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder} is a file; results go into a folder "
                         "of that name")
      if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{folder} is not writable")
    if os.path.isdir(target):
      raise ValueError(f"{target} is a directory; the file {name} is "
                       "written there")
    if os.path.exists(target) and not os.access(target, os.W_OK):
      raise ValueError(f"{target} exists and is not writable")
  _check_lengths(path, existing, names)
  return path


def _check_lengths(path: str, existing: str, names: Sequence[str]) -> None:
  """Refuses names the file system cannot hold (a component longer than
  its ``NAME_MAX`` or a path longer than ``PATH_MAX``), with the
  temporary names the atomic writes use, before anything runs."""
  try:
    name_max = os.pathconf(existing, "PC_NAME_MAX")
    path_max = os.pathconf(existing, "PC_PATH_MAX")
  # Not every platform or file system answers pathconf; fall back to the common
  # Linux limits.
  except (OSError, ValueError):
    name_max, path_max = 255, 4096
  temporary = manifest.TEMPORARY_OVERHEAD  # an atomic write's temporary
  for name in [""] + [os.path.normpath(n) for n in names]:
    full = os.path.abspath(os.path.join(path, name))
    parts = full.split(os.sep)
    for position, part in enumerate(parts):
      # Only a file's own name gains the temporary suffix of its atomic write;
      # the folders on the way keep their names.
      extra = temporary if position == len(parts) - 1 and name else 0
      if len(part.encode()) + extra > name_max:
        raise ValueError(
            f"{path}: the name {part[:40]!r}... ({len(part.encode())} "
            f"bytes{' + a temporary suffix' if extra else ''}) is longer "
            f"than the file system allows ({name_max} bytes)")
    # PATH_MAX counts the terminating NUL, hence ``>=``.
    if len(full.encode()) + temporary >= path_max:
      raise ValueError(f"{path}: the path of {name or 'the folder'} is "
                       f"longer than the file system allows ({path_max} "
                       "bytes)")

def member_folder(run_dir: str, member: str, num_members: int) -> str:
  """Where member ``member`` of a run of ``num_members`` writes its
  history files: the run's folder itself for one member, else
  ``<run_dir>/<member>``."""
  # bool is an int in Python; True must not pass as one member.
  if isinstance(num_members, bool) or not isinstance(num_members, int) or (
      num_members < 1):
    raise ValueError(f"num_members must be an int >= 1, got {num_members!r}")
  return run_dir if num_members == 1 else os.path.join(run_dir, member)


def save_run(run_dir: str, histories: Mapping[str, "History"],
             overwrite: bool = False) -> dict[str, dict[str, str]]:
  """Writes a run's member histories (member name -> History) in the one
  layout (module docstring). -> member -> its ``{"csv", "json"}`` paths.

  A folder that already holds a run is refused (``check_fresh``) unless
  ``overwrite``; then the earlier run's recorded files are removed first
  and the new ones recorded (``manifest``)."""
  if not histories:
    raise ValueError("histories: a run has at least one member")
  names = [os.path.relpath(os.path.join(member_folder(
      run_dir, name, len(histories)), f"history.{kind}"), run_dir)
           for name in histories for kind in ("csv", "json")]
  plan = check_fresh(run_dir, overwrite, names)
  with manifest.recording(run_dir, plan):
    return write_run(run_dir, histories)


def write_run(run_dir: str, histories: Mapping[str, "History"]
              ) -> dict[str, dict[str, str]]:
  """``save_run`` for an entry point that claimed ``run_dir`` when it
  started (``check_fresh``, then ``manifest.recording``):
  writes beside the files the run itself wrote, checking nothing."""
  if not histories:
    raise ValueError("histories: a run has at least one member")
  return {name: history.save(member_folder(run_dir, name, len(histories)))
          for name, history in histories.items()}


def load_saved(run_dir: str, member: str, num_members: int) -> dict:
  """One member's saved ``history.json``: its config, rows and client
  rows."""
  path = os.path.join(member_folder(run_dir, member, num_members),
                      "history.json")
  with open(path) as f:
    return json.load(f)


class _CsvText:
  """A file-like sink for ``csv.writer`` that keeps the text."""

  def __init__(self):
    self.parts = []

  def write(self, text: str) -> None:
    self.parts.append(text)

  @property
  def text(self) -> str:
    return "".join(self.parts)


class HistoryWriter(Callback):
  """Round callback that keeps ``<directory>/history.csv|json`` current.

  Args:
    directory: where to write (created).
    config: the run's resolved config, written into ``history.json``.
    every: rewrite every this many rounds; ``close`` (which the round
      loop calls when the run ends, also on an error) writes the rows of
      the rounds since the last rewrite.
  """

  def __init__(self, directory: str, config: Optional[dict] = None,
               every: int = 1):
    self.directory = directory
    self.config = dict(config or {})
    self.every = every
    self.rows, self.client_rows = [], []
    self._written = 0

  def __call__(self, row: dict, client: Optional[dict]) -> None:
    self.rows.append(row)
    if client is not None:
      self.client_rows.append(client)
    if row["round"] % self.every == 0:
      self.flush()

  def flush(self) -> None:
    """Rewrites ``history.csv|json`` in ``directory`` from the rows so
    far."""
    History(self.rows, self.client_rows, self.config).save(self.directory)
    self._written = len(self.rows)

  def close(self) -> None:
    """Writes the rows not written yet (none: nothing to do)."""
    if self.rows and self._written != len(self.rows):
      self.flush()


class TensorBoardWriter(Callback):
  """Round callback that writes every scalar of each row as a TensorBoard
  event (``tensorboard --logdir DIR``), step = round.

  Needs the optional ``tensorboardX`` package (``pip install
  'fedjax_agg[tensorboard]'``). ``close`` flushes the event file.
  """

  def __init__(self, logdir: str):
    try:
      import tensorboardX  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("TensorBoardWriter needs tensorboardX: pip install "
                        "'fedjax_agg[tensorboard]'") from e
    self.logdir = logdir
    self._writer = tensorboardX.SummaryWriter(logdir)

  def __call__(self, row: dict, client: Optional[dict]) -> None:
    del client
    step = int(row["round"])
    for name, value in row.items():
      # Only numbers are scalars to plot; bools are ints in Python but not
      # curves, and the round is the step itself.
      if name == "round" or isinstance(value, bool) or not isinstance(
          value, (int, float, np.number)):
        continue
      self._writer.add_scalar(name, float(value), step)

  def close(self) -> None:
    """Flushes and closes the event file (the loop calls it at the end)."""
    self._writer.flush()
    self._writer.close()


def rounds_to_target(history: History, target: float,
                     metric: str = "test_accuracy") -> Optional[int]:
  """First round whose ``metric`` reaches ``target`` (None if never)."""
  for row in history.rows:
    value = row.get(metric)
    # A round that was not evaluated lacks the metric (None) and a diverged one
    # holds NaN; neither reaches the target.
    if value is not None and not np.isnan(value) and value >= target:
      return int(row["round"])
  return None


def _finite_mean(values) -> float:
  """The mean of the finite entries (NaN when none is finite)."""
  # In the values' own dtype, so that a round with every row finite gives
  # the mean it always gave, to the bit.
  values = np.asarray(values)
  finite = np.isfinite(values)
  return float(np.mean(values[finite])) if finite.any() else math.nan


def round_scalars(out, with_losses: bool = True) -> dict[str, float]:
  """A round's scalar outputs (a ``rounds.RoundOutput`` on the host);
  ``with_losses``: the round computed per-client losses."""
  # Padding rows (mask 0) are not clients: a non-finite value there is not
  # counted as an excluded client.
  real = np.asarray(out.mask) > 0
  row = {"train_loss": float(out.train_loss)}
  if with_losses:
    # The mean over all K rows, padding included, as docs/history-columns.md
    # defines the column; changing it changes every saved history with a Poisson
    # cohort.
    # A client whose loss is not finite is excluded from the round (it is
    # counted in ``nonfinite_clients``), so it is left out of the mean too:
    # one such client must not turn the column into NaN.
    row["cohort_loss_before"] = _finite_mean(out.loss_before)
    row["cohort_loss_after"] = _finite_mean(out.loss_after)
  row["nonfinite_clients"] = int(np.sum(real & ~np.asarray(out.finite)))
  for name, value in out.metrics.items():
    # Scalar metrics go to the round's row; per-client [K] metrics go to its
    # client row (``client_row``).
    if np.ndim(value) == 0:
      row[name] = float(value)
  return row


def client_row(round_num: int, out, with_losses: bool = True) -> dict:
  """A round's per-client outputs, as ``History.client_rows`` holds them."""
  row = {"round": round_num, "client_ids": np.asarray(out.client_ids)}
  if with_losses:
    row["loss_before"] = np.asarray(out.loss_before)
    row["loss_after"] = np.asarray(out.loss_after)
  mask = np.asarray(out.mask)
  if (mask == 0).any():  # Padding rows (Poisson cohorts): say which.
    row["mask"] = mask
  row["steps_taken"] = np.asarray(out.steps_taken)
  row.update({k: np.asarray(v) for k, v in out.metrics.items()
              if np.ndim(v) > 0})
  return row
