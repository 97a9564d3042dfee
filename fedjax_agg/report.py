"""Compare finished runs: read run folders back, overlay them, tabulate.

``python -m fedjax_agg report RUN_DIR [RUN_DIR ...] --out DIR`` (or
``report.report(...)``) reads each run folder in the one output layout
(``fedjax_agg.history``) back into ``History`` objects and groups them
into curves:

* a single run (``history.json`` in the folder) is one curve;
* a run of several members (``<run>/<member>/history.json``, every
  sub-folder that holds a history named as ``sweep.member_name`` names a
  member: ``seed<k>``, or ``<point>_seed<k>`` with the point ending in a
  number, e.g. ``alpha5_seed0``) is one curve per grid point, its seeds
  averaged (a band of +- one standard deviation); only the seed varying,
  one curve named after the run;
* otherwise, a comparison of algorithms (``experiment.run_config``'s
  layout, ``<run>/<algorithm>/[seed<k>/]history.json``) is one curve per
  algorithm, whatever the algorithms are called (``FedProx_seed2`` beside
  ``FedAvg`` is an algorithm).

A folder holding both a ``history.json`` and runs in its sub-folders is
refused (which one was meant cannot be told).

A curve is named by its folder and what varies; an asynchronous run
(FedBuff, ``systems.concurrency``) says so in its name. The report plots
the metric against the round, and, where every run recorded them,
against simulated time (``sim_time_s``) and uplink bytes; it writes
``report.md`` and ``report.tex``: per curve the seeds, final and best
metric (mean and standard deviation over seeds, population convention
ddof = 0, as ``numpy.std``), and with ``target`` the rounds, simulated
seconds and uplink bytes to first reach it (mean over the seeds that
reached it, and how many did).

Each metric has a direction (``metric_direction``): lower is better for a
loss, an error, bytes or time, higher for the others (accuracy). "Best"
is the lowest or highest value of each seed, and a seed reaches the
target at its first row with the metric ``<=`` or ``>=`` it.

A seed's final value is its metric at its own last row that recorded it
(test metrics are recorded at the evaluated rounds). Seeds may end at
different rounds (early stopping): the table says at which rounds, and
the curves average each round over the seeds that ran it.

Names are escaped for Markdown and LaTeX. A history file that is not one
(unreadable, nested too deeply, rows that are not rows, a value that is
not a number) is refused with a ``ValueError`` naming the file, the row
and the column, before anything is written.

The report's files are recorded in ``out``'s manifest (``manifest``): a
later report replaces them, while a file of the same name that the
library did not write (or that changed since) is refused, and nothing
else in ``out`` is touched.
"""

import argparse
import math
import numbers
import os
import re
import sys
from typing import Optional, Sequence

import numpy as np

from fedjax_agg import jsonio
from fedjax_agg import manifest
from fedjax_agg import plotting
from fedjax_agg.history import History
from fedjax_agg.plotting import axis_label
from fedjax_agg.plotting import new_figure

__all__ = ["AXES", "DIRECTIONS", "async_tag", "curve_x", "load_run", "main",
           "metric_direction", "plot_curves", "report", "table_rows"]

AXES = {axis: axis_label(axis)
        for axis in ("round", "sim_time_s", "uplink_bytes")}
"""The x axes a report draws, by history column, with their labels."""

DIRECTIONS = ("max", "min")
"""What ``metric_direction`` returns: higher ("max") or lower ("min") is
better (the modes of ``loop.EarlyStopping``)."""

# Columns that add up over the rounds (0 before the first).
_CUMULATIVE = ("sim_time_s", "uplink_bytes")
# Words of a metric's name (split at "_") that make lower better.
_COST_WORDS = ("loss", "error", "bytes", "time", "seconds")
# A member folder (``sweep.member_name``): the point's last value is a number.
_MEMBER = re.compile(r"(?:(?P<point>.*\d)_)?seed\d+")


def metric_direction(metric: str) -> str:
  """"min" where a lower ``metric`` is better, else "max".

  Lower is better for a name ending in "loss" (``test_loss``,
  ``xentloss``) or holding one of the words "loss", "error", "bytes",
  "time", "seconds" between underscores (``cohort_loss_before``,
  ``uplink_bytes``, ``sim_time_s``); higher for the others
  (``test_accuracy``)."""
  _check_metric(metric)
  name = metric.lower()
  words = name.split("_")
  lower = name.endswith("loss") or any(w in _COST_WORDS for w in words)
  return "min" if lower else "max"


def _shown(path) -> str:
  """A path for a one-line message: as it is, or quoted with escapes
  where it holds a line break or another unprintable character."""
  path = str(path)
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
    if holders:
      raise ValueError(
          f"{_shown(folder)}: holds a history.json and runs in its "
          f"sub-folders ({', '.join(map(_shown, holders[:4]))}); move "
          "the one or the others to a folder of its own")
    run = _load(folder)
    return {name + async_tag(run): [(folder, run)]}
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
    for algorithm in _subfolders(run_dir):
      for label, runs in _run_curves(os.path.join(run_dir, algorithm),
                                     algorithm).items():
        _add_curve(curves, label, runs)
  if not curves:
    raise ValueError(f"{_shown(run_dir)}: holds no run (no history.json "
                     "in it or in its sub-folders)")
  return curves


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
    at = np.searchsorted(rounds, [row["round"] for row in run.rows])
    values[s, at] = _values(run, column)
    ran[s, at] = True
    if column in _CUMULATIVE and np.isnan(values[s, at[0]]):
      # Cumulative columns: the first row (the initial model) leaves them
      # blank; it is at 0 where the run records the column at all.
      if not np.isnan(values[s, at]).all():
        values[s, at[0]] = 0.0
  return rounds, values, ran


def curve_x(runs: Sequence[History], axis: str) -> np.ndarray:
  """The x of each round any of ``runs`` ran, on ``axis`` ``[T]``: the
  mean over the runs that have it, NaN where none does. Simulated time
  and bytes are cumulative, so a run's first row (the initial model,
  which leaves them blank) is at 0."""
  if not isinstance(runs, (list, tuple)) or not runs:
    raise TypeError(f"runs must be a non-empty list of History, got "
                    f"{type(runs).__name__}")
  for i, run in enumerate(runs):
    _check_history(run, f"runs[{i}]", (axis,), finite=False)
  rounds, xs, _ = _aligned(runs, axis)
  if axis == "round":
    return rounds
  x = np.full(len(rounds), np.nan)
  seen = ~np.isnan(xs).all(0)
  x[seen] = np.nanmean(xs[:, seen], 0)
  return x


def _plain(text: str) -> str:
  """``text`` as matplotlib draws it literally: "$" starts no formula, a
  leading "_" hides no legend entry."""
  text = _visible(text).replace("$", r"\$")
  return " " + text if text.startswith("_") else text


def plot_curves(curves: dict[str, list[History]], metric: str, axis: str,
                path: str, title: str = "") -> str:
  """Saves ``metric`` against history column ``axis`` (one of ``AXES``),
  mean and +- one sd band over each curve's runs (at each round, over
  the runs that ran it), to ``path``."""
  _check_metric(metric)
  if axis not in AXES:
    raise ValueError(f"axis must be one of {list(AXES)}, got {axis!r}")
  _check_curves(curves, metric, recorded=False)
  fig = new_figure((6, 4))
  ax = fig.add_subplot(1, 1, 1)
  scale = 1e-6 if axis == "uplink_bytes" else 1.0
  for label, runs in curves.items():
    _, values, ran = _aligned(runs, metric)
    x = curve_x(runs, axis) * scale
    # A round where a run that ran it has no value is left out.
    keep = ran.any(0) & ~(ran & np.isnan(values)).any(0) & ~np.isnan(x)
    mean = np.nanmean(values[:, keep], 0)
    sd = np.nanstd(values[:, keep], 0)
    ax.plot(x[keep], mean, marker=".", label=_plain(label))
    if len(runs) > 1:
      ax.fill_between(x[keep], mean - sd, mean + sd, alpha=0.2)
  ax.set_xlabel(AXES[axis])
  ax.set_ylabel(_plain(axis_label(metric)))
  ax.grid(alpha=0.3)
  ax.legend()
  fig.suptitle(_plain(title))
  fig.tight_layout()
  return plotting.save_figure(fig, path, dpi=120)


def _final(run: History, metric: str) -> tuple[int, float]:
  """(round, value) of the last row that recorded ``metric`` (NaN: it
  was not finite)."""
  last = [row for row in run.rows if metric in row][-1]
  value = np.nan if last[metric] is None else float(last[metric])
  return int(last["round"]), value if math.isfinite(value) else np.nan


def _reached(run: History, metric: str, target: float,
             direction: str) -> Optional[int]:
  """The index of the first row whose ``metric`` reaches ``target``."""
  values = _values(run, metric)
  with np.errstate(invalid="ignore"):
    hits = values >= target if direction == "max" else values <= target
  return int(np.argmax(hits)) if hits.any() else None


def table_rows(curves: dict[str, list[History]], metric: str,
               target: Optional[float] = None) -> list[dict]:
  """One dict per curve: seeds, each seed's final round, final and best
  ``metric`` (mean, sd over seeds, ddof 0; best in the metric's
  direction, ``metric_direction``) and, with ``target``, what it took
  to reach it."""
  _check_metric(metric)
  _check_target(target)
  _check_curves(curves, metric, recorded=True)
  target = None if target is None else float(target)
  direction = metric_direction(metric)
  best_of = np.nanmax if direction == "max" else np.nanmin
  rows = []
  for label, runs in curves.items():
    final_rounds, finals = zip(*(_final(run, metric) for run in runs),
                               strict=True)
    bests = np.array([best_of(_values(run, metric)) for run in runs])
    row = {"name": label, "seeds": len(runs),
           "final_rounds": list(final_rounds),
           "final_mean": float(np.mean(finals)),
           "final_sd": float(np.std(finals)),
           "best_mean": float(np.mean(bests)),
           "best_sd": float(np.std(bests))}
    if target is not None:
      reached = [(run, index) for run in runs
                 if (index := _reached(run, metric, target, direction))
                 is not None]
      for column, key in (("round", "rounds"), ("sim_time_s", "time_s"),
                          ("uplink_bytes", "uplink_bytes")):
        hits = [_aligned([run], column)[1][0, index]
                for run, index in reached]
        hits = [h for h in hits if not np.isnan(h)]
        row[f"{key}_to_target"] = float(np.mean(hits)) if hits else None
      row["reached"] = f"{len(reached)}/{len(runs)}"
    rows.append(row)
  return rows


def _visible(text: str) -> str:
  """``text`` with line breaks and other unprintable characters written
  as escapes (``\\n``), so a table cell stays on its line."""
  return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


# CommonMark: a backslash makes any ASCII punctuation literal. These would
# otherwise end a table cell (|) or start emphasis, code, a link, HTML, an
# entity, strike-through or a formula.
_MARKDOWN_SPECIALS = frozenset("\\|*_`[]<>&~$")
_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$",
    "&": r"\&", "%": r"\%", "#": r"\#", "_": r"\_",
    "^": r"\textasciicircum{}", "~": r"\textasciitilde{}",
    "|": r"\textbar{}", "<": r"\textless{}", ">": r"\textgreater{}",
    "±": r"$\pm$"}


def _markdown(text: str) -> str:
  return "".join("\\" + c if c in _MARKDOWN_SPECIALS else c
                 for c in _visible(text))


def _latex(text: str) -> str:
  return "".join(_LATEX_SPECIALS.get(c, c) for c in _visible(text))


def _cell(value, digits=4) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}g}"
  return str(value)


def _notes(rows: list[dict], metric: str, target, escape) -> list[str]:
  """The lines under a table; ``escape`` writes a name for its format."""
  words = escape(axis_label(metric))
  lower = metric_direction(metric) == "min"
  notes = ["mean ± standard deviation over seeds (population, ddof = 0); "
           f"final: each seed's last recorded {words}; best: its "
           f"{'lowest' if lower else 'highest'} {words}"]
  if target is not None:
    notes.append(f"a seed reaches the target at its first round with "
                 f"{words} {'<=' if lower else '>='} {target}; to-target "
                 "columns: mean over the seeds that reached it")
  for row in rows:
    if len(set(row["final_rounds"])) > 1:
      notes.append(f"{escape(row['name'])}: its seeds end at different "
                   f"rounds ({', '.join(map(str, row['final_rounds']))}); "
                   "the curves average each round over the seeds that "
                   "ran it")
  return notes


def _tables(rows: list[dict], metric: str, target) -> tuple[str, str]:
  words = axis_label(metric)
  heads = ["run", "seeds", "final round", f"final {words}",
           f"best {words}"]
  if target is not None:
    heads += [f"rounds to {target}", f"sim. s to {target}",
              f"uplink MB to {target}", "reached"]
  body = []
  for row in rows:
    first, last = min(row["final_rounds"]), max(row["final_rounds"])
    cells = [row["name"], str(row["seeds"]),
             str(last) if first == last else f"{first} to {last}",
             f"{row['final_mean']:.4f} ± {row['final_sd']:.4f}",
             f"{row['best_mean']:.4f} ± {row['best_sd']:.4f}"]
    if target is not None:
      uplink = row["uplink_bytes_to_target"]
      cells += [_cell(row["rounds_to_target"]), _cell(row["time_s_to_target"]),
                _cell(None if uplink is None else uplink / 1e6),
                row["reached"]]
    body.append(cells)
  markdown = "\n".join(
      ["| " + " | ".join(map(_markdown, heads)) + " |",
       "|" + " --- |" * len(heads)]
      + ["| " + " | ".join(map(_markdown, cells)) + " |" for cells in body]
      + [line for note in _notes(rows, metric, target, _markdown)
         for line in ("", note)] + [""])
  latex = "\n".join(
      ["% " + note for note in _notes(rows, metric, target, _visible)]
      + ["\\begin{tabular}{l" + "r" * (len(heads) - 1) + "}", "\\hline",
         " & ".join(map(_latex, heads)) + " \\\\", "\\hline"]
      + [" & ".join(map(_latex, cells)) + " \\\\" for cells in body]
      + ["\\hline", "\\end{tabular}", ""])
  return markdown, latex


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


def _plot_name(metric: str, axis: str) -> str:
  """The file of the plot of ``metric`` by ``axis``: the metric's
  letters, digits, "_", "." and "-", any other character (a path
  separator) as "_"."""
  part = re.sub(r"[^\w.-]", "_", metric, flags=re.ASCII).lstrip(".")
  return f"{part[:100]}_by_{axis}.png"


def _output_names(metric: str) -> list[str]:
  """The files a report of ``metric`` may write into its folder."""
  return [_plot_name(metric, axis) for axis in AXES] + ["report.md",
                                                        "report.tex"]


def _check_out(name: str, out, metric: str) -> str:
  """``out`` as a str, refused (naming ``name``) where it cannot be the
  folder of a report of ``metric``: it, or a folder on the way, is a
  file, or a folder stands where a file of the report goes
  (``experiment.check_output_dir``)."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  out = _check_path(name, out)
  try:
    experiment.check_output_dir(out, _output_names(metric))
    # An earlier report's files are replaced; a user's are never.
    manifest.check_replace(out, _output_names(metric))
  except ValueError as error:
    raise ValueError(f"{name}: {_visible(str(error))}") from None
  return out


def report(run_dirs: Sequence[str], out: str, metric: str = "test_accuracy",
           target: Optional[float] = None) -> dict:
  """Reads ``run_dirs``, writes plots and tables to ``out``; returns the
  paths and the table rows (module docstring).

  Raises:
    TypeError: an argument of the wrong kind (``run_dirs`` not a list of
      paths, ``metric`` not a str, ``target`` not a number).
    ValueError: naming the argument, folder or file: no run folder, a
      folder without a run, a history file that is not one, ``metric``
      not recorded by a run, ``target`` not finite, ``out`` a file. Raised
      before anything is written.
  """
  if isinstance(run_dirs, (str, bytes, os.PathLike)) or not isinstance(
      run_dirs, (list, tuple)):
    raise TypeError(f"run_dirs must be a list of run folders, got "
                    f"{_short(run_dirs)}")
  if not run_dirs:
    raise ValueError("run_dirs: name at least one run folder")
  run_dirs = [_check_path(f"run_dirs[{i}]", run_dir)
              for i, run_dir in enumerate(run_dirs)]
  _check_metric(metric)
  _check_target(target)
  out = _check_out("out", out, metric)
  curves, files = {}, {}
  for run_dir in run_dirs:
    for label, runs in _folder_curves(run_dir).items():
      label = _add_curve(curves, label, [run for _, run in runs])
      files[label] = [_shown(os.path.join(folder, "history.json"))
                      for folder, _ in runs]
  for label, runs in curves.items():
    for file, run in zip(files[label], runs, strict=True):
      _check_history(run, file, (metric,))
      _check_recorded(run, file, metric)
  rows = table_rows(curves, metric, target)
  markdown, latex = _tables(rows, metric, target)
  paths = {}
  # Each file written is recorded in ``out``'s manifest, beside those of
  # anything else written there (``resume``: nothing is removed).
  with manifest.recording(out, resume=True):
    for axis in AXES:
      if all(not np.isnan(_values(run, axis)).all()
             for runs in curves.values() for run in runs):
        paths[axis] = plot_curves(
            curves, metric, axis,
            os.path.join(out, _plot_name(metric, axis)),
            f"{axis_label(metric)} by {AXES[axis]}")
    for name, text in (("report.md", markdown), ("report.tex", latex)):
      paths[name] = jsonio.write_text(os.path.join(out, name), text)
  return {"paths": paths, "rows": rows}


class _Parser(argparse.ArgumentParser):
  """A parser whose mistakes are one ``error:`` line (``main``)."""

  def error(self, message):
    raise ValueError(message)


def _finite(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not math.isfinite(value):
    raise argparse.ArgumentTypeError(f"expected a finite number, got "
                                     f"{text!r}")
  return value


def main(argv: Sequence[str]) -> int:
  """``python -m fedjax_agg report ...``; a bad flag, folder, file or
  metric is one ``error:`` line (exit status 2), before anything is
  written."""
  parser = _Parser(
      prog="python -m fedjax_agg report",
      description="Overlay and tabulate finished runs (mean and band over "
      "seeds) by round, simulated time and uplink bytes.")
  parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
  parser.add_argument("--out", default="results/report",
                      help="folder for the plots, report.md and report.tex")
  parser.add_argument("--metric", default="test_accuracy",
                      help="history column to compare; lower is better "
                      "for a loss, error, bytes or time, else higher")
  parser.add_argument("--target", type=_finite, default=None,
                      help="also tabulate rounds, simulated time and "
                      "uplink bytes to first reach this value (<= it for "
                      "a lower-is-better metric)")
  try:
    args = parser.parse_args(list(argv))
    _check_out("--out", args.out, args.metric)
    made = report(args.run_dirs, args.out, args.metric, args.target)
  except ValueError as error:
    print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
    raise SystemExit(2) from None
  with open(made["paths"]["report.md"]) as f:
    print(f.read())
  return 0
