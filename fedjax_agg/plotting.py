"""Plots of run histories, written to files.

Figures are built with matplotlib's object API (``matplotlib.figure.Figure``
drawn by the Agg canvas), never through ``pyplot``: importing or calling
this module leaves the process' matplotlib backend alone, so notebook
figures keep working, and no display is needed.
"""

import os
import typing
from typing import Mapping, Sequence

import numpy as np

from fedjax_agg import jsonio
from fedjax_agg.history import History

__all__ = ["axis_label", "curves_figure", "new_figure", "plot_client_sizes",
           "plot_history", "plot_mean_curves"]

if typing.TYPE_CHECKING:
  from matplotlib import figure

_WORDS = {"test_accuracy": "test accuracy", "test_loss": "test loss",
          "train_loss": "training loss", "round": "round",
          "sim_time_s": "simulated time (s)", "uplink_bytes": "uplink (MB)"}


def axis_label(column: str) -> str:
  """A history column as an axis label: in words, with its unit."""
  return _WORDS.get(column, column.replace("_", " "))


def plot_history(histories: Mapping[str, History], path: str,
                 metrics: Sequence[str] = ("test_accuracy", "test_loss"),
                 title: str = "") -> str:
  """Plots ``metrics`` per round for each labelled history; saves ``path``."""
  return plot_mean_curves({label: [h] for label, h in histories.items()},
                          path, metrics, title)


def save_figure(fig: "figure.Figure", path: str, **savefig_args) -> str:
  """Writes ``fig`` to ``path`` atomically (``jsonio.write_file``; the
  format from ``path``'s suffix). Returns ``path``."""
  suffix = os.path.splitext(path)[1].lstrip(".") or None
  return jsonio.write_file(path, lambda temporary: fig.savefig(
      temporary, format=suffix, **savefig_args))


def colour(position: int) -> str:
  """The colour of the curve at ``position`` in a figure's order: every
  figure of the library (a run's ``curves.png``, the
  report's plots) colours the i-th algorithm of a run alike."""
  return f"C{position % 10}"


def wrapped(title: str, width: int) -> str:
  """``title`` broken into lines of at most ``width`` characters (at
  separators), so a long setting is not clipped."""
  import textwrap  # pylint: disable=g-import-not-at-top
  return "\n".join(textwrap.wrap(title, width, break_long_words=False)
                   ) if title else title


def new_figure(figsize: tuple[float, float]) -> "figure.Figure":
  """A matplotlib ``Figure`` of ``figsize`` inches drawn by the Agg canvas.

  matplotlib is imported here, at the first figure: importing it takes
  about 0.4 s, which runs and commands that draw nothing never spend.
  """
  # pylint: disable=g-import-not-at-top
  from matplotlib import figure as figure_lib
  from matplotlib.backends import backend_agg
  fig = figure_lib.Figure(figsize=figsize)
  backend_agg.FigureCanvasAgg(fig)
  return fig


def curves_figure(histories: Mapping[str, Sequence[History]],
                  metrics: Sequence[str] = ("test_accuracy", "test_loss"),
                  title: str = "") -> "figure.Figure":
  """Mean ± std over seeds of ``metrics`` per round, one line per label.

  Args:
    histories: label -> the runs (one per seed) of that label.
    metrics: History columns, one panel each.
    title: the figure's title, e.g. the setting the runs share.

  Returns:
    A ``Figure`` attached to an Agg canvas (``fig.savefig`` works; in a
    notebook, display it as the cell's value).
  """
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  fig = new_figure((5 * len(metrics), 3.6))
  axes = fig.subplots(1, len(metrics), squeeze=False)[0]
  for ax, metric in zip(axes, metrics, strict=True):
    for position, (label, runs) in enumerate(histories.items()):
      if not runs:
        continue
      rounds = runs[0].column("round")
      values = np.stack([h.column(metric) for h in runs])
      keep = ~np.isnan(values).any(axis=0)
      mean, std = values.mean(0), values.std(0)
      ax.plot(rounds[keep], mean[keep], marker=".", label=label,
              color=colour(position))
      if len(runs) > 1:
        ax.fill_between(rounds[keep], (mean - std)[keep], (mean + std)[keep],
                        alpha=0.2, color=colour(position))
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    last = max((float(np.nanmax(runs[0].column("round")))
                for runs in histories.values() if runs), default=0.0)
    ax.set_xlim(0, max(last, 1.0))  # no tick past the last round
    ax.set_xlabel(axis_label("round"))
    ax.set_ylabel(axis_label(metric))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend()
  if title:
    fig.suptitle(wrapped(title, 55 * len(metrics)), fontsize="medium")
  fig.tight_layout()
  return fig


def plot_mean_curves(histories: Mapping[str, Sequence[History]], path: str,
                     metrics: Sequence[str] = ("test_accuracy", "test_loss"),
                     title: str = "") -> str:
  """Saves ``curves_figure(histories, metrics, title)`` to ``path``."""
  return save_figure(curves_figure(histories, metrics, title), path,
                     dpi=120)


def plot_client_sizes(client_indices: Sequence[np.ndarray], targets,
                      path: str, title: str = "") -> str:
  """Histograms of the clients' rows and scored targets (tokens that are
  not padding, for per-token targets [M, T]); saves ``path``."""
  targets = np.asarray(targets)
  scored = (targets.reshape(targets.shape[0], -1) >= 0).sum(1)
  rows = [len(ix) for ix in client_indices]
  tokens = [int(scored[np.asarray(ix)].sum()) for ix in client_indices]
  fig = new_figure((8, 3))
  for position, (values, label) in enumerate(
      ((rows, "rows per client"), (tokens, "scored targets per client"))):
    ax = fig.add_subplot(1, 2, position + 1)
    ax.hist(values, bins=40)
    ax.set_xlabel(label)
    ax.set_ylabel("clients")
  fig.suptitle(title or f"{len(rows)} clients")
  return save_figure(fig, path, dpi=120, bbox_inches="tight")
