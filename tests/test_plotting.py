"""Plots: integer round ticks and a title, matplotlib's backend left
alone.
"""

import os
import subprocess
import sys

from fedjax_agg import plotting
from fedjax_agg.history import History


def _history(values):
  rows = [{"round": r, "test_accuracy": v, "test_loss": 1 - v}
          for r, v in enumerate(values)]
  return History(rows=rows, client_rows=[], config={})


def test_curves_have_integer_round_ticks_and_a_title():
  fig = plotting.curves_figure(
      {"FedAvg": [_history([0.1, 0.5, 0.7]), _history([0.2, 0.4, 0.8])]},
      title="mnist, iid(N=10)")
  fig.canvas.draw()
  assert fig.get_suptitle() == "mnist, iid(N=10)"
  for ax in fig.axes:
    ticks = [t for t in ax.get_xticks() if 0 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_plotting_leaves_the_backend_alone(tmp_path):
  script = f"""
import sys
import matplotlib
matplotlib.use("svg")
from fedjax_agg import experiment, plotting
from fedjax_agg.history import History
rows = [{{"round": r, "test_accuracy": 0.1 * r, "test_loss": 1.0}}
        for r in range(3)]
plotting.plot_history({{"a": History(rows, [], {{}})}},
                      {str(tmp_path / "p.png")!r})
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert "matplotlib.pyplot" not in sys.modules
"""
  result = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, check=False, timeout=120)
  assert result.returncode == 0, result.stderr
  assert os.path.getsize(tmp_path / "p.png") > 0
