"""Summing up a run's curves: final and best metric over seeds, rounds to
a target, and the same as a CSV.

Part of ``fedjax_agg.experiment``.
"""

import io
from typing import Optional

import numpy as np

from fedjax_agg import history as history_lib
from fedjax_agg import jsonio


def write_summary_csv(summary: dict, path: str) -> str:
  """``summarize``'s result as a CSV, one row per algorithm (or grid
  point): seeds, final / best mean and std, rounds to target."""
  import csv  # pylint: disable=g-import-not-at-top
  columns = ["name"] + sorted({key for entry in summary.values()
                               for key, value in entry.items()
                               if not isinstance(value, list)})
  lines = io.StringIO()
  writer = csv.DictWriter(lines, fieldnames=columns, restval="")
  writer.writeheader()
  for name, entry in summary.items():
    writer.writerow({"name": name, **{
        k: v for k, v in entry.items() if not isinstance(v, list)}})
  return jsonio.write_text(path, lines.getvalue())


def summarize(histories: dict[str, list], target: Optional[float],
              metric: str = "test_accuracy") -> dict:
  """Per algorithm: final/best metric and rounds to target over seeds."""
  out = {}
  for algorithm, runs in histories.items():
    finals = [h.column(metric)[-1] for h in runs]
    bests = [np.nanmax(h.column(metric)) for h in runs]
    entry = {"seeds": len(runs),
             f"final_{metric}_mean": float(np.mean(finals)),
             f"final_{metric}_std": float(np.std(finals)),
             f"best_{metric}_mean": float(np.mean(bests)),
             f"best_{metric}_std": float(np.std(bests)),
             f"final_{metric}": [float(v) for v in finals]}
    if metric != "test_perplexity" and "test_perplexity" in runs[0].rows[-1]:
      # A language model's perplexity beside the metric (lower is better).
      perplexities = [h.column("test_perplexity")[-1] for h in runs]
      entry["final_test_perplexity_mean"] = float(np.mean(perplexities))
      entry["final_test_perplexity_std"] = float(np.std(perplexities))
    if "client_loss_mean" in runs[0].rows[-1]:
      entry["final_client_loss_mean"] = float(np.mean(
          [h.column("client_loss_mean")[-1] for h in runs]))
      entry["final_client_loss_var"] = float(np.mean(
          [h.column("client_loss_var")[-1] for h in runs]))
    if target is not None:
      reached = [history_lib.rounds_to_target(h, target, metric)
                 for h in runs]
      entry["target"] = target
      entry["rounds_to_target"] = reached
      hits = [r for r in reached if r is not None]
      entry["rounds_to_target_mean"] = (float(np.mean(hits)) if hits
                                        else None)
      entry["reached_target"] = f"{len(hits)}/{len(reached)}"
    out[algorithm] = entry
  return out
