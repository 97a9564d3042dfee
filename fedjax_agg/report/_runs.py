"""Reading run folders and history files back, and checking them.

What ``fedjax_agg.report`` reads: the curves of a run folder
(``load_run``: a single run, the members of a run, or a comparison of
algorithms), each history checked before it is used (rows of increasing
int rounds, numbers or null in the columns read) with a ``ValueError``
naming the file, the row and the column; the checks of the report's
arguments (a metric, a target, a path, curves given as Histories); and
the alignment of several runs' columns by round (``_aligned``).
"""

import json
import math
import numbers
import os
import re
from typing import Optional, Sequence

import numpy as np

from fedjax_agg.history import History
from fedjax_agg.plotting import axis_label


AXES = {axis: axis_label(axis)
        for axis in ("round", "sim_time_s", "uplink_bytes")}
"""The x axes a report draws, by history column, with their labels."""


# Columns that add up over the rounds (0 before the first).
_CUMULATIVE = ("sim_time_s", "uplink_bytes")


# A member folder (``sweep.member_name``): the point's last value is a number.
_MEMBER = re.compile(r"(?:(?P<point>.*\d)_)?seed\d+")


def _shown(path) -> str:
  """A path for a one-line message: as it is, or quoted with escapes
  where it holds a line break or another unprintable character."""
  path = str(path)
  # A line break in a folder name would split a one-line error, and could make
  # its second half read as a message of its own.
  return path if path.isprintable() else repr(path)


def _short(value) -> str:
  text = repr(value)
  return text if len(text) <= 40 else text[:37] + "..."


def _check_metric(metric) -> None:
  if not isinstance(metric, str):
    raise TypeError(f"metric must be a history column name (a str), got "
                    f"{_short(metric)}")
  if not metric:
    raise ValueError("metric must be a history column name, got ''")


def _check_target(target) -> None:
  if target is None:
    return
  if isinstance(target, (bool, np.bool_)) or not isinstance(
      target, numbers.Real):
    raise TypeError(f"target must be a finite number or None, got "
                    f"{_short(target)} ({type(target).__name__})")
  if not _is_number(target, finite=True):
    raise ValueError(f"target must be a finite number, got "
                     f"{_short(target)}")


def _is_number(value, finite: bool) -> bool:
  """A real number (a bool is not), finite if ``finite``."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, numbers.Real):
    return False
  try:
    value = float(value)
  except OverflowError:  # an int beyond float
    return False
  return math.isfinite(value) or not finite


def _check_history(run, where: str, columns: Sequence[str] = (),
                   finite: bool = True) -> None:
  """Raises naming ``where`` (a file, or the argument) unless ``run`` is a
  History whose rows are objects with increasing int rounds and whose
  ``columns`` hold numbers (finite ones if ``finite``: a saved history
  holds null for a non-finite value) or null."""
  if not isinstance(run, History):
    raise TypeError(f"{where}: expected a History, got "
                    f"{type(run).__name__}")
  if not isinstance(run.config, dict):
    raise ValueError(f"{where}: config: expected an object, got "
                     f"{_short(run.config)}")
  systems = run.config.get("systems")
  if systems is not None and not isinstance(systems, dict):
    raise ValueError(f"{where}: config['systems']: expected an object or "
                     f"null, got {_short(systems)}")
  if not isinstance(run.rows, list) or not run.rows:
    raise ValueError(f"{where}: rows: expected a list of rows, one per "
                     f"round, got {_short(run.rows)}")
  previous = -1
  for i, row in enumerate(run.rows):
    if not isinstance(row, dict):
      raise ValueError(f"{where}: rows[{i}]: expected an object of column "
                       f"values, got {_short(row)}")
    number = row.get("round")
    if (isinstance(number, (bool, np.bool_))
        or not isinstance(number, numbers.Integral)
        # Strictly increasing, so the rows align by round without ambiguity;
        # below 2**53, since ``_aligned`` holds rounds as float64 and larger
        # ints would collide.
        or not previous < number < 2**53):
      raise ValueError(f"{where}: rows[{i}]['round']: expected an int "
                       f"above the previous row's ({previous}), got "
                       f"{_short(number)}")
    previous = number
    for column in columns:
      value = row.get(column)
      if value is not None and not _is_number(value, finite):
        raise ValueError(
            f"{where}: rows[{i}][{column!r}]: expected a "
            + ("finite number or null (non-finite values are saved as "
               "null)" if finite else "number or None")
            + f", got {_short(value)}")


def _values(run: History, column: str) -> np.ndarray:
  """``run.column(column)`` with NaN for a non-finite value too."""
  values = run.column(column)
  # An in-memory History may hold inf; a saved one holds null. Either is a gap
  # in the curve, never a point.
  values[~np.isfinite(values)] = np.nan
  return values


def _check_recorded(run: History, where: str, metric: str) -> None:
  if np.isnan(_values(run, metric)).all():
    columns = sorted({key for row in run.rows for key in row})
    raise ValueError(f"{where}: metric {metric!r} is not recorded (no row "
                     f"holds a value for it; its columns: {columns})")


def _load(folder: str) -> History:
  """The history in ``folder``, checked (``_check_history``)."""
  path = _shown(os.path.join(folder, "history.json"))
  try:
    run = History.load(folder)
  except RecursionError:
    raise ValueError(f"{path}: not a saved history (nested too "
                     "deeply)") from None
  _check_history(run, path, tuple(AXES))
  return run


def _has_history(folder: str) -> bool:
  return os.path.isfile(os.path.join(folder, "history.json"))


def _subfolders(folder: str) -> list[str]:
  try:
    names = sorted(os.listdir(folder))
  except OSError as error:
    raise ValueError(f"{_shown(folder)}: cannot be read "
                     f"({error.strerror})") from None
  return [name for name in names
          if os.path.isdir(os.path.join(folder, name))]


def async_tag(run: History) -> str:
  """The suffix " (async, C=...)" of a FedBuff run's label, else ""."""
  systems = run.config.get("systems") or {}
  concurrency = systems.get("concurrency")
  return "" if concurrency is None else f" (async, C={concurrency})"


def _run_curves(folder: str, name: str) -> dict[str, list[tuple]]:
  """Curve label -> (folder, History) of each seed, for ``folder`` if it
  holds a run (a history, or member folders only), else {}."""
  holders = [sub for sub in _subfolders(folder)
             if _has_history(os.path.join(folder, sub))]
  if _has_history(folder):
    # Both a history and member histories: which one is the run is ambiguous, so
    # the folder is refused rather than half read.
    if holders:
      raise ValueError(
          f"{_shown(folder)}: holds a history.json and runs in its "
          f"sub-folders ({', '.join(map(_shown, holders[:4]))}); move "
          "the one or the others to a folder of its own")
    run = _load(folder)
    return {name + async_tag(run): [(folder, run)]}
  # Sub-folders with other names are not a run's members: the folder is then
  # read as a comparison, one algorithm per sub-folder.
  if not holders or not all(_MEMBER.fullmatch(sub) for sub in holders):
    return {}
  groups = {}
  for member in holders:
    path = os.path.join(folder, member)
    run = _load(path)
    point = _MEMBER.fullmatch(member).group("point")
    label = f"{name} {point}" if point else name
    groups.setdefault(label + async_tag(run), []).append((path, run))
  return groups


def _add_curve(curves: dict, label: str, runs: list) -> str:
  """Adds ``runs`` as ``label``, primed (') until the label is new."""
  while label in curves:
    label += "'"
  curves[label] = runs
  return label


def _folder_curves(run_dir) -> dict[str, list[tuple]]:
  """``load_run``, with the folder each History was read from."""
  if not os.path.isdir(run_dir):
    raise ValueError(f"{_shown(run_dir)}: not a folder")
  name = os.path.basename(os.path.abspath(run_dir)) or str(run_dir)
  curves = _run_curves(run_dir, name)
  if not curves:  # a comparison: one sub-folder per algorithm
    # In the order its record gives them (as the run's curves.png draws
    # them), then any others by name.
    order = list((recorded_config(run_dir) or {}).get("algorithms") or ())
    folders = _subfolders(run_dir)
    for algorithm in sorted(folders, key=lambda f: (
        order.index(f) if f in order else len(order), f)):
      for label, runs in _run_curves(os.path.join(run_dir, algorithm),
                                     algorithm).items():
        _add_curve(curves, label, runs)
  if not curves:
    raise ValueError(f"{_shown(run_dir)}: holds no run (no history.json "
                     "in it or in its sub-folders)")
  return curves


def recorded_config(run_dir) -> Optional[dict]:
  """The experiment ``run_dir``'s ``config.json`` records (without its
  provenance), or None where it has none that reads as one (it is only
  read, never run: names in it import nothing)."""
  path = os.path.join(run_dir, "config.json")
  try:
    # The record only orders the curves: one too large or unreadable falls back
    # to the folders' names, never to an error.
    if os.path.getsize(path) > 16 << 20:
      return None
    with open(path, encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError, RecursionError):
    return None
  if not isinstance(record, dict) or not isinstance(
      record.get("algorithms"), dict):
    return None
  return {key: value for key, value in record.items()
          if key != "provenance"}


def load_run(run_dir: str) -> dict[str, list[History]]:
  """Curve label -> the Histories (one per seed) of run folder ``run_dir``
  (module docstring); ValueError naming the folder if it holds no run,
  or naming the file of a history that is not one."""
  run_dir = _check_path("run_dir", run_dir)
  return {label: [run for _, run in runs]
          for label, runs in _folder_curves(run_dir).items()}


def _check_curves(curves, metric: str, recorded: bool) -> None:
  """Raises naming the entry unless ``curves`` maps labels to non-empty
  lists of Histories (holding ``metric`` if ``recorded``)."""
  if not isinstance(curves, dict):
    raise TypeError(f"curves must be a dict of curve label -> list of "
                    f"History, got {type(curves).__name__}")
  for label, runs in curves.items():
    where = f"curves[{label!r}]"
    if not isinstance(runs, (list, tuple)):
      raise TypeError(f"{where}: expected a list of History, got "
                      f"{type(runs).__name__}")
    if not runs:
      raise ValueError(f"{where}: a curve has at least one run")
    for i, run in enumerate(runs):
      _check_history(run, f"{where}[{i}]", (metric, *AXES), finite=False)
      if recorded:
        _check_recorded(run, f"{where}[{i}]", metric)


def _aligned(runs: Sequence[History], column: str):
  """The rounds any of ``runs`` ran ``[T]`` (sorted), each run's
  ``column`` at them ``[S, T]`` (NaN: blank, or not run; a cumulative
  column's blank first row: 0) and whether it ran them ``[S, T]``."""
  rounds = np.array(sorted({row["round"] for run in runs
                            for row in run.rows}), np.float64)
  values = np.full((len(runs), len(rounds)), np.nan)
  ran = np.zeros((len(runs), len(rounds)), bool)
  for s, run in enumerate(runs):
    # ``rounds`` is the sorted union of every run's rounds, so each row has an
    # exact position in it.
    at = np.searchsorted(rounds, [row["round"] for row in run.rows])
    values[s, at] = _values(run, column)
    ran[s, at] = True
    if column in _CUMULATIVE and np.isnan(values[s, at[0]]):
      # Cumulative columns: the first row (the initial model) leaves them
      # blank; it is at 0 where the run records the column at all.
      if not np.isnan(values[s, at]).all():
        values[s, at[0]] = 0.0
  return rounds, values, ran


def _check_path(name: str, path) -> str:
  """``path`` (a str or path object) as a str; TypeError/ValueError
  naming ``name`` otherwise."""
  if not isinstance(path, (str, os.PathLike)) or not isinstance(
      os.fspath(path), str):
    raise TypeError(f"{name} must be a folder path (a str), got "
                    f"{_short(path)}")
  path = os.fspath(path)
  if not path:
    raise ValueError(f"{name} must be a folder path, got ''")
  return path
