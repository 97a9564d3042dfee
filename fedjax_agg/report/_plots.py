"""The report's plots: a metric against the round, simulated time or
uplink bytes, mean and +- one sd band over each curve's seeds.
"""

import re
from typing import Sequence

import numpy as np

from fedjax_agg import plotting
from fedjax_agg.history import History
from fedjax_agg.plotting import axis_label
from fedjax_agg.plotting import new_figure
from fedjax_agg.report._runs import _aligned
from fedjax_agg.report._runs import _check_curves
from fedjax_agg.report._runs import _check_history
from fedjax_agg.report._runs import _check_metric
from fedjax_agg.report._runs import AXES
from fedjax_agg.report._tables import _visible


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
                path: str, title: str = "",
                also: Sequence[str] = ()) -> str:
  """Saves ``metric`` (and each metric of ``also``, one panel each)
  against history column ``axis`` (one of ``AXES``), mean and +- one sd
  band over each curve's runs (at each round, over the runs that ran it),
  to ``path``. Curve i has colour i of the cycle (``plotting.colour``),
  as the run's own ``curves.png`` gives it."""
  metrics = [metric, *also]
  for name in metrics:
    _check_metric(name)
  if axis not in AXES:
    raise ValueError(f"axis must be one of {list(AXES)}, got {axis!r}")
  for name in metrics:
    _check_curves(curves, name, recorded=False)
  fig = new_figure((6 * len(metrics), 4.2))
  axes = fig.subplots(1, len(metrics), squeeze=False)[0]
  scale = 1e-6 if axis == "uplink_bytes" else 1.0
  for ax, name in zip(axes, metrics, strict=True):
    for position, (label, runs) in enumerate(curves.items()):
      _, values, ran = _aligned(runs, name)
      x = curve_x(runs, axis) * scale
      # A round where a run that ran it has no value is left out.
      keep = ran.any(0) & ~(ran & np.isnan(values)).any(0) & ~np.isnan(x)
      mean = np.nanmean(values[:, keep], 0)
      sd = np.nanstd(values[:, keep], 0)
      colour = plotting.colour(position)
      ax.plot(x[keep], mean, marker=".", label=_plain(label), color=colour)
      if len(runs) > 1:
        ax.fill_between(x[keep], mean - sd, mean + sd, alpha=0.2,
                        color=colour)
    ax.set_xlabel(AXES[axis])
    ax.set_ylabel(_plain(axis_label(name)))
    ax.grid(alpha=0.3)
    ax.legend()
  # A long setting wraps instead of being clipped at the figure's edge.
  fig.suptitle(plotting.wrapped(_plain(title), 60 * len(metrics)),
               fontsize="medium")
  fig.tight_layout()
  return plotting.save_figure(fig, path, dpi=120)


def _plot_name(metric: str, axis: str) -> str:
  """The file of the plot of ``metric`` by ``axis``: the metric's
  letters, digits, "_", "." and "-", any other character (a path
  separator) as "_"."""
  part = re.sub(r"[^\w.-]", "_", metric, flags=re.ASCII).lstrip(".")
  return f"{part[:100]}_by_{axis}.png"
