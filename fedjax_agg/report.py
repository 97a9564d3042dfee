"""Compare finished runs: read run folders back, overlay them, tabulate.

``python -m fedjax_agg report RUN_DIR [RUN_DIR ...] --out DIR`` (or
``report.report(...)``) reads each run folder in the one output layout
(``fedjax_agg.history``) back into ``History`` objects and groups them
into curves:

* a single run (``history.json`` in the folder) is one curve;
* a run of several members (``<run>/<member>/history.json``) is one curve
  per grid point, its seeds averaged (a band of +- one standard
  deviation); only the seed varying, one curve named after the run;
* a comparison of algorithms (``experiment.run_config``'s layout,
  ``<run>/<algorithm>/[seed<k>/]history.json``) is one curve per
  algorithm.

A curve is named by its folder and what varies; an asynchronous run
(FedBuff, ``systems.concurrency``) says so in its name. The report plots
the metric against the round, and, where every run recorded them,
against simulated time (``sim_time_s``) and uplink bytes; it writes
``report.md`` and ``report.tex``: per curve the seeds, final and best
metric (mean and standard deviation over seeds, population convention
ddof = 0, as ``numpy.std``), and with ``target`` the rounds, simulated
seconds and uplink bytes to first reach it (mean over the seeds that
reached it, and how many did).
"""

import argparse
import os
import re
from typing import Optional, Sequence

import numpy as np

from fedjax_agg.history import History
from fedjax_agg.plotting import axis_label
from fedjax_agg.plotting import new_figure

__all__ = ["AXES", "async_tag", "curve_x", "load_run", "main",
           "plot_curves", "report", "table_rows"]

AXES = {axis: axis_label(axis)
        for axis in ("round", "sim_time_s", "uplink_bytes")}
"""The x axes a report draws, by history column, with their labels."""


def _has_history(folder: str) -> bool:
  return os.path.isfile(os.path.join(folder, "history.json"))


def _members(folder: str) -> list[str]:
  """The member folders of a run: named ``[<point>_]seed<k>``
  (``sweep.member_name``), holding a history."""
  return sorted(name for name in os.listdir(folder)
                if re.search(r"(^|_)seed\d+$", name)
                and _has_history(os.path.join(folder, name)))


def _point(member: str) -> str:
  """A member's grid point: its name without the seed ("" for seeds)."""
  return "_".join(member.split("_")[:-1])


def async_tag(run: History) -> str:
  """The suffix " (async, C=...)" of a FedBuff run's label, else ""."""
  systems = run.config.get("systems") or {}
  concurrency = systems.get("concurrency")
  return "" if concurrency is None else f" (async, C={concurrency})"


def _curves_of(folder: str, name: str) -> dict[str, list[History]]:
  if _has_history(folder):
    run = History.load(folder)
    return {name + async_tag(run): [run]}
  members = _members(folder)
  if members:
    groups = {}
    for member in members:
      run = History.load(os.path.join(folder, member))
      point = _point(member)
      label = f"{name} {point}" if point else name
      groups.setdefault(label + async_tag(run), []).append(run)
    return groups
  return {}


def load_run(run_dir: str) -> dict[str, list[History]]:
  """Curve label -> the Histories (one per seed) of run folder ``run_dir``
  (module docstring); ValueError naming the folder if it holds no run."""
  if not os.path.isdir(run_dir):
    raise ValueError(f"{run_dir}: not a folder")
  name = os.path.basename(os.path.normpath(run_dir))
  curves = _curves_of(run_dir, name)
  if not curves:  # a comparison: one sub-folder per algorithm
    for algorithm in sorted(os.listdir(run_dir)):
      path = os.path.join(run_dir, algorithm)
      if os.path.isdir(path):
        curves.update(_curves_of(path, algorithm))
  if not curves:
    raise ValueError(f"{run_dir}: holds no run (no history.json in it or "
                     "in its sub-folders)")
  return curves


def _first(run: History, metric: str, target: float, column: str):
  for row in run.rows:
    value = row.get(metric)
    if value is not None and np.isfinite(value) and value >= target:
      return row.get(column)
  return None


def table_rows(curves: dict[str, list[History]], metric: str,
               target: Optional[float] = None) -> list[dict]:
  """One dict per curve: seeds, final and best ``metric`` (mean, sd over
  seeds, ddof 0) and, with ``target``, what it took to reach it."""
  rows = []
  for label, runs in curves.items():
    finals = np.array([run.column(metric)[-1] for run in runs])
    bests = np.array([np.nanmax(run.column(metric)) for run in runs])
    row = {"name": label, "seeds": len(runs),
           "final_mean": float(np.mean(finals)),
           "final_sd": float(np.std(finals)),
           "best_mean": float(np.mean(bests)),
           "best_sd": float(np.std(bests))}
    if target is not None:
      for column, key in (("round", "rounds"), ("sim_time_s", "time_s"),
                          ("uplink_bytes", "uplink_bytes")):
        hits = [_first(run, metric, target, column) for run in runs]
        hits = [h for h in hits if h is not None]
        row[f"{key}_to_target"] = float(np.mean(hits)) if hits else None
      row["reached"] = f"{len(hits)}/{len(runs)}"
    rows.append(row)
  return rows


def _cell(value, digits=4) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}g}"
  return str(value)


def _tables(rows: list[dict], metric: str, target) -> tuple[str, str]:
  words = axis_label(metric)
  heads = ["run", "seeds", f"final {words}", f"best {words}"]
  if target is not None:
    heads += [f"rounds to {target}", f"sim. s to {target}",
              f"uplink MB to {target}", "reached"]
  body = []
  for row in rows:
    cells = [row["name"], str(row["seeds"]),
             f"{row['final_mean']:.4f} ± {row['final_sd']:.4f}",
             f"{row['best_mean']:.4f} ± {row['best_sd']:.4f}"]
    if target is not None:
      uplink = row["uplink_bytes_to_target"]
      cells += [_cell(row["rounds_to_target"]), _cell(row["time_s_to_target"]),
                _cell(None if uplink is None else uplink / 1e6),
                row["reached"]]
    body.append(cells)
  note = ("mean ± standard deviation over seeds (population, ddof = 0); "
          "to-target columns: mean over the seeds that reached it")
  markdown = "\n".join(
      ["| " + " | ".join(heads) + " |", "|" + " --- |" * len(heads)]
      + ["| " + " | ".join(cells) + " |" for cells in body]
      + ["", note, ""])
  escape = lambda text: (text.replace("\\", "\\textbackslash{}")
                         .replace("_", "\\_").replace("%", "\\%")
                         .replace("&", "\\&").replace("#", "\\#")
                         .replace("±", "$\\pm$"))
  latex = "\n".join(
      ["% " + note, "\\begin{tabular}{l" + "r" * (len(heads) - 1) + "}",
       "\\hline", " & ".join(escape(h) for h in heads) + " \\\\", "\\hline"]
      + [" & ".join(escape(c) for c in cells) + " \\\\" for cells in body]
      + ["\\hline", "\\end{tabular}", ""])
  return markdown, latex


def curve_x(runs: Sequence[History], axis: str) -> np.ndarray:
  """The x of each history row of ``runs`` on ``axis``: the mean over the
  runs that have it, NaN where none does. Simulated time and bytes are
  cumulative, so row 0 (the initial model, which leaves them blank) is
  at 0."""
  xs = np.stack([run.column(axis) for run in runs])
  if axis != "round":
    xs[:, 0] = np.where(np.isnan(xs[:, 0]), 0.0, xs[:, 0])
  x = np.full(xs.shape[1], np.nan)
  seen = ~np.isnan(xs).all(0)
  x[seen] = np.nanmean(xs[:, seen], 0)
  return x


def plot_curves(curves: dict[str, list[History]], metric: str, axis: str,
                path: str, title: str = "") -> str:
  """Saves ``metric`` against history column ``axis`` (one of ``AXES``),
  mean and +- one sd band over each curve's runs, to ``path``."""
  fig = new_figure((6, 4))
  ax = fig.add_subplot(1, 1, 1)
  scale = 1e-6 if axis == "uplink_bytes" else 1.0
  for label, runs in curves.items():
    values = np.stack([run.column(metric) for run in runs])
    x = curve_x(runs, axis) * scale
    keep = ~np.isnan(values).any(0) & ~np.isnan(x)
    mean, sd = values.mean(0), values.std(0)
    ax.plot(x[keep], mean[keep], marker=".", label=label)
    if len(runs) > 1:
      ax.fill_between(x[keep], (mean - sd)[keep], (mean + sd)[keep],
                      alpha=0.2)
  ax.set_xlabel(AXES[axis])
  ax.set_ylabel(axis_label(metric))
  ax.grid(alpha=0.3)
  ax.legend()
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


def report(run_dirs: Sequence[str], out: str, metric: str = "test_accuracy",
           target: Optional[float] = None) -> dict:
  """Reads ``run_dirs``, writes plots and tables to ``out``; returns the
  paths and the table rows (module docstring)."""
  if not run_dirs:
    raise ValueError("run_dirs: name at least one run folder")
  curves = {}
  for run_dir in run_dirs:
    for label, runs in load_run(run_dir).items():
      while label in curves:
        label += "'"
      curves[label] = runs
  missing = [label for label, runs in curves.items()
             if np.isnan(runs[0].column(metric)).all()]
  if missing:
    raise ValueError(f"metric {metric!r}: not recorded by {missing}")
  os.makedirs(out, exist_ok=True)
  paths = {}
  for axis in AXES:
    if all(not np.isnan(run.column(axis)).all()
           for runs in curves.values() for run in runs):
      paths[axis] = plot_curves(curves, metric, axis,
                          os.path.join(out, f"{metric}_by_{axis}.png"),
                          f"{axis_label(metric)} by {AXES[axis]}")
  rows = table_rows(curves, metric, target)
  markdown, latex = _tables(rows, metric, target)
  for name, text in (("report.md", markdown), ("report.tex", latex)):
    with open(os.path.join(out, name), "w") as f:
      f.write(text)
    paths[name] = os.path.join(out, name)
  return {"paths": paths, "rows": rows}


def main(argv: Sequence[str]) -> int:
  """``python -m fedjax_agg report ...``; a bad folder or metric is one
  ``error:`` line (exit status 2)."""
  import sys  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      prog="python -m fedjax_agg report",
      description="Overlay and tabulate finished runs (mean and band over "
      "seeds) by round, simulated time and uplink bytes.")
  parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
  parser.add_argument("--out", default="results/report",
                      help="folder for the plots, report.md and report.tex")
  parser.add_argument("--metric", default="test_accuracy",
                      help="history column to compare")
  parser.add_argument("--target", type=float, default=None,
                      help="also tabulate rounds, simulated time and "
                      "uplink bytes to first reach this value")
  args = parser.parse_args(list(argv))
  try:
    made = report(args.run_dirs, args.out, args.metric, args.target)
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    raise SystemExit(2) from None
  with open(made["paths"]["report.md"]) as f:
    print(f.read())
  return 0

