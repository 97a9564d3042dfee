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

Modules: ``_runs`` (reading run folders and history files back, and
checking them), ``_tables`` (the table rows and their Markdown and LaTeX),
``_plots`` (the plots).
"""

import argparse
import math
import os
import sys
from typing import Optional, Sequence

import numpy as np

from fedjax_agg import history as history_lib
from fedjax_agg import jsonio
from fedjax_agg import manifest
from fedjax_agg.plotting import axis_label
from fedjax_agg.report._plots import _plot_name
from fedjax_agg.report._plots import curve_x
from fedjax_agg.report._plots import plot_curves
from fedjax_agg.report._runs import _add_curve
from fedjax_agg.report._runs import _check_history
from fedjax_agg.report._runs import _check_metric
from fedjax_agg.report._runs import _check_path
from fedjax_agg.report._runs import _check_recorded
from fedjax_agg.report._runs import _check_target
from fedjax_agg.report._runs import _folder_curves
from fedjax_agg.report._runs import _short
from fedjax_agg.report._runs import _shown
from fedjax_agg.report._runs import _values
from fedjax_agg.report._runs import recorded_config
from fedjax_agg.report._runs import async_tag
from fedjax_agg.report._runs import AXES
from fedjax_agg.report._runs import load_run
from fedjax_agg.report._tables import _tables
from fedjax_agg.report._tables import _visible
from fedjax_agg.report._tables import DIRECTIONS
from fedjax_agg.report._tables import metric_direction
from fedjax_agg.report._tables import table_rows

__all__ = ["AXES", "DIRECTIONS", "async_tag", "curve_x", "load_run", "main",
           "metric_direction", "plot_curves", "report", "table_rows"]


def _output_names(metric: str) -> list[str]:
  """The files a report of ``metric`` may write into its folder."""
  return [_plot_name(metric, axis) for axis in AXES] + ["report.md",
                                                        "report.tex"]


def _check_out(name: str, out, metric: str) -> str:
  """``out`` as a str, refused (naming ``name``) where it cannot be the
  folder of a report of ``metric``: it, or a folder on the way, is a
  file, or a folder stands where a file of the report goes
  (``history.check_output_dir``)."""
  out = _check_path(name, out)
  try:
    history_lib.check_output_dir(out, _output_names(metric))
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
  # The loss beside the accuracy, as a run's curves.png has it.
  also = [name for name in ("test_loss",) if metric == "test_accuracy"
          and all(not np.isnan(_values(run, name)).all()
                  for runs in curves.values() for run in runs)]
  setting = _shared_setting(run_dirs)
  # Each file written is recorded in ``out``'s manifest, beside those of
  # anything else written there (``resume``: nothing is removed).
  with manifest.recording(out, resume=True):
    for axis in AXES:
      if all(not np.isnan(_values(run, axis)).all()
             for runs in curves.values() for run in runs):
        paths[axis] = plot_curves(
            curves, metric, axis,
            os.path.join(out, _plot_name(metric, axis)),
            f"{axis_label(metric)} by {AXES[axis]}" + (
                f": {setting}" if setting else ""), also)
    for name, text in (("report.md", markdown), ("report.tex", latex)):
      paths[name] = jsonio.write_text(os.path.join(out, name), text)
  return {"paths": paths, "rows": rows}


def _shared_setting(run_dirs) -> str:
  """The setting (``spec.Experiment.setting``) the records of every run
  folder in ``run_dirs`` name, where they all name the same one; else
  "". A record that does not check is left out (it is only read)."""
  from fedjax_agg import spec  # pylint: disable=g-import-not-at-top
  settings = set()
  for run_dir in run_dirs:
    record = recorded_config(run_dir)
    try:
      settings.add(spec.Experiment.from_dict(record).setting()
                   if record else "")
    except (TypeError, ValueError):
      settings.add("")
  return settings.pop() if len(settings) == 1 else ""


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
