"""Partition reports: the summary table against numpy counts, the heatmap."""

import numpy as np

from fedjax_agg import partitions
from tests.partitions._util import BALANCED
from tests.partitions._util import UNEQUAL


def test_summary_table_matches_numpy_counts():
  parts = partitions.shards(UNEQUAL, 5, seed=0)
  table = partitions.summary(parts, UNEQUAL)
  assert list(table.columns[:2]) == ["num_examples", "num_labels"]
  for i, p in enumerate(parts):
    counts = np.bincount(UNEQUAL[p], minlength=10)
    np.testing.assert_array_equal(table.iloc[i, 2:].to_numpy(), counts)
    assert table.loc[i, "num_examples"] == len(p)
    assert table.loc[i, "num_labels"] == (counts > 0).sum()


def test_plot_heatmap_writes_png(tmp_path):
  parts = partitions.clustered_non_equal(BALANCED, 12, seed=0)
  path = partitions.plot_heatmap(parts, BALANCED, str(tmp_path / "h.png"),
                                 title="CN")
  assert path.endswith("h.png")
  assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_long_title_fits_a_narrow_heatmap():
  """Few clients make a narrow figure: the title wraps inside it."""
  from fedjax_agg.partitions import _report  # pylint: disable=g-import-not-at-top
  labels = np.arange(40) % 10
  title = "mnist (mnist_5k), shards(N=4, shards_per_client=2), seed 0"
  fig = _report.heatmap_figure(np.array_split(np.arange(40), 4), labels,
                               10, title)
  drawn = fig.axes[0].get_title()
  assert drawn.replace("\n", " ") == title
  assert max(len(line) for line in drawn.splitlines()) <= (
      8 * fig.get_figwidth())
