"""Describing a partition: per-client label histograms, tables, heatmaps."""

import os
import textwrap
from typing import Optional, Sequence

import numpy as np

from fedjax_agg import jsonio
from fedjax_agg.partitions._recipes import checked_labels
from fedjax_agg.partitions._recipes import checked_num_classes


def label_histogram(client_indices: Sequence[np.ndarray], labels,
                    num_classes: Optional[int] = None) -> np.ndarray:
  """[N, C] int64: examples of each class held by each client."""
  labels = checked_labels(labels)
  num_classes = checked_num_classes(labels, num_classes)
  return np.stack([np.bincount(labels[np.asarray(p, np.int64)],
                               minlength=num_classes)
                   for p in client_indices]).astype(np.int64)


def summary(client_indices: Sequence[np.ndarray], labels,
            num_classes: Optional[int] = None):
  """Per-client table: size, number of labels and the label histogram.

  Args:
    client_indices: a partition (N index arrays).
    labels: [M] int labels the indices point into.
    num_classes: C; default ``max(labels) + 1``.

  Returns:
    A pandas DataFrame indexed by client id with columns ``num_examples``,
    ``num_labels`` and one column per class (its example count).
  """
  import pandas as pd  # pylint: disable=g-import-not-at-top
  hist = label_histogram(client_indices, labels, num_classes)
  table = pd.DataFrame(hist, columns=[f"class_{c}" for c in
                                      range(hist.shape[1])])
  table.insert(0, "num_labels", (hist > 0).sum(axis=1))
  table.insert(0, "num_examples", hist.sum(axis=1))
  table.index.name = "client"
  return table


def heatmap_figure(client_indices: Sequence[np.ndarray], labels,
                   num_classes: Optional[int] = None,
                   title: Optional[str] = None):
  """A matplotlib Figure: clients x classes, colour = examples held.

  The top strip shows each client's size. Uses ``matplotlib.figure`` only,
  so no display backend is needed.
  """
  from matplotlib import figure  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  hist = label_histogram(client_indices, labels, num_classes)
  num_clients, num_classes = hist.shape
  fig = figure.Figure(figsize=(min(3 + 0.25 * num_clients, 16),
                               min(2.5 + 0.22 * num_classes, 12)))
  grid = fig.add_gridspec(2, 2, height_ratios=(1, 4), width_ratios=(40, 1),
                          hspace=0.05, wspace=0.03)
  bars = fig.add_subplot(grid[0, 0])
  ax = fig.add_subplot(grid[1, 0], sharex=bars)
  # The extent centres cell (client, class) on integer coordinates, so the
  # size bars above line up with the columns.
  image = ax.imshow(hist.T, aspect="auto", cmap="viridis",
                    interpolation="nearest",
                    extent=(-0.5, num_clients - 0.5, num_classes - 0.5, -0.5))
  bars.bar(np.arange(num_clients), hist.sum(axis=1), color="0.4", width=0.8)
  bars.set_ylabel("examples")
  bars.tick_params(labelbottom=False)
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  ax.set_xlabel("client")
  ax.set_ylabel("class")
  fig.colorbar(image, cax=fig.add_subplot(grid[1, 1]), label="examples")
  if title:
    # Wrapped to the figure's width (about 8 characters an inch), so that
    # a narrow figure of few clients does not clip or overlap it.
    bars.set_title("\n".join(textwrap.wrap(
        title, max(20, int(8 * fig.get_figwidth())),
        break_long_words=False)), fontsize="medium")
  return fig


def plot_heatmap(client_indices: Sequence[np.ndarray], labels, path: str,
                 num_classes: Optional[int] = None,
                 title: Optional[str] = None) -> str:
  """Saves ``heatmap_figure(...)`` to ``path`` (format from the suffix).

  Returns:
    ``path``.
  """
  fig = heatmap_figure(client_indices, labels, num_classes, title)
  # The format is named from ``path``: the figure is written to a temporary
  # file (moved into place when complete) whose name says nothing of it.
  suffix = os.path.splitext(path)[1].lstrip(".") or None
  return jsonio.write_file(path, lambda temporary: fig.savefig(
      temporary, format=suffix, dpi=120, bbox_inches="tight"))
