"""The report's numbers and tables: final and best metric, to target.

``table_rows`` summarises each curve over its seeds (final and best
metric in the metric's direction, ``metric_direction``; with a target,
what it took to reach it); ``_tables`` writes the rows as ``report.md``'s
Markdown and ``report.tex``'s LaTeX, each name escaped for its format
and kept on its line (``_visible``).
"""

import math
from typing import Optional

import numpy as np

from fedjax_agg.history import History
from fedjax_agg.plotting import axis_label
from fedjax_agg.report._runs import _aligned
from fedjax_agg.report._runs import _check_curves
from fedjax_agg.report._runs import _check_metric
from fedjax_agg.report._runs import _check_target
from fedjax_agg.report._runs import _values


DIRECTIONS = ("max", "min")
"""What ``metric_direction`` returns: higher ("max") or lower ("min") is
better (the modes of ``loop.EarlyStopping``)."""


# Words of a metric's name (split at "_") that make lower better.
_COST_WORDS = ("loss", "error", "bytes", "time", "seconds", "perplexity")


def metric_direction(metric: str) -> str:
  """"min" where a lower ``metric`` is better, else "max".

  Lower is better for a name ending in "loss" (``test_loss``,
  ``xentloss``) or holding one of the words "loss", "error", "bytes",
  "time", "seconds", "perplexity" between underscores
  (``cohort_loss_before``, ``uplink_bytes``, ``sim_time_s``,
  ``test_perplexity``); higher for the others
  (``test_accuracy``)."""
  _check_metric(metric)
  name = metric.lower()
  words = name.split("_")
  lower = name.endswith("loss") or any(w in _COST_WORDS for w in words)
  return "min" if lower else "max"


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
