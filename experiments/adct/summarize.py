"""Rebuilds the "ours" column of ADCT's verdict table (RESULTS.md).

Every number of the "ours" cells is computed from the committed histories
under ``experiments/adct/results/``: the Table 5 runs (``table5_mnist``,
3 seeds; ``table5_fmnist``, 2 seeds), the (gamma, s) grids
(``grid_mnist``, ``grid_fmnist``, 1 seed) and the interpretation choices
(``choices_mnist``, 2 seeds). The statistics are those of ``run.py``'s
``summarize``: "final" = the value after the last round (round 50), per
seed, then mean ± population sd over seeds. What each client kept in each
round (the "never above lr 1e-4" count) is read from the per-client arrays
of the runs' ``history.json`` ("clients": ``adct_learning_rate``,
``adct_local_epochs``).

  python experiments/adct/summarize.py [--check | --write]
"""

import glob
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import verdicts

RESULTS, RESULTS_MD = verdicts.paper_files(HERE)
_curves = verdicts.reader(RESULTS)

DASH = "\u2013"  # the tables' range dash ("11.4–40.3")
ACC = "test_accuracy"
F1 = "test_macro_f1"


def _final(run: str, algorithm: str, name: str = ACC) -> np.ndarray:
  """Per seed: column ``name`` of ``algorithm`` in ``run`` after the last
  round."""
  return _curves(run, algorithm, name)[:, -1]


def _seeds(run: str, algorithm: str) -> str:
  """"3 seeds" / "1 seed": how many seeds ``run`` holds of ``algorithm``."""
  count = len(verdicts.runs(os.path.join(RESULTS, run), algorithm))
  return f"{count} seed" + ("" if count == 1 else "s")


def _cells(run: str) -> list:
  """The ADCT (gamma, s) cells of the grid run ``run``, sorted."""
  return sorted(os.path.basename(p)
                for p in glob.glob(os.path.join(RESULTS, run, "ADCT(*")))


def _grid(run: str) -> tuple:
  """(min, max) over the cells of ``run`` of the final accuracy (mean over
  seeds, percent), and the baseline's."""
  finals = [100 * np.mean(_final(run, c)) for c in _cells(run)]
  base = 100 * np.mean(_final(run, "Baseline"))
  return min(finals), max(finals), base


def _grid_text(run: str) -> str:
  low, high, base = _grid(run)
  return (f"every cell {verdicts.fixed(low)}{DASH}{verdicts.fixed(high)} % "
          f"vs {verdicts.fixed(base)} %")


def _never_above(run: str, algorithm: str, lr: float = 1e-4) -> bool:
  """Whether no client of ``algorithm`` (every seed) ever kept a learning
  rate above ``lr`` or more than one local epoch."""
  folder = os.path.join(RESULTS, run, algorithm)
  paths = (glob.glob(os.path.join(folder, "history.json"))
           or glob.glob(os.path.join(folder, "seed*", "history.json")))
  if not paths:
    raise FileNotFoundError(f"no history.json of {algorithm!r} in {run}")
  for path in paths:
    for row in verdicts.load_json(path)["clients"]:
      rates = np.asarray(row["adct_learning_rate"], np.float64)
      epochs = np.asarray(row["adct_local_epochs"])
      # The rates are float32 (1e-4 is stored as 9.99999975e-05).
      if np.any(rates > lr * 1.01) or np.any(epochs > 1):
        return False
  return True


def row_table5_mnist(run: str = "table5_mnist") -> str:
  """Final macro-F1 of ADCT (50, 5) against FedAvg, MNIST-5k."""
  adct = _final(run, "ADCT(50,5)", F1)
  avg = _final(run, "FedAvg", F1)
  return (f"ADCT (50, 5) {verdicts.pm(adct, 2)} vs FedAvg "
          f"{verdicts.pm(avg, 2)} (MNIST-5k, {_seeds(run, 'FedAvg')})")


def row_table5_fmnist(run: str = "table5_fmnist") -> str:
  """Final macro-F1 of ADCT (75, 15) against FedAvg, Fashion-MNIST."""
  adct = _final(run, "ADCT(75,15)", F1)
  avg = _final(run, "FedAvg", F1)
  return (f"{verdicts.pm(adct, 2)} vs {verdicts.pm(avg, 2)} (4,000 training "
          f"images, {_seeds(run, 'FedAvg')})")


def row_grid_mnist(run: str = "grid_mnist") -> str:
  """Range of the grid cells' final accuracy against the baseline's."""
  return f"{_grid_text(run)} ({_seeds(run, 'Baseline')})"


def _above(run: str) -> str:
  """How many cells of ``run`` end above its baseline (means over
  seeds)."""
  base = np.mean(_final(run, "Baseline"))
  cells = _cells(run)
  above = sum(np.mean(_final(run, c)) > base for c in cells)
  return f"{above} of {len(cells)} above it"


def _cells_text(run: str) -> str:
  """"every cell a–b % vs c %", or "cells a–b % vs c %, k of 9 above it"
  when not every cell ends above the baseline."""
  low, high, base = _grid(run)
  if low > base:
    return _grid_text(run)
  return (f"cells {verdicts.fixed(low)}{DASH}{verdicts.fixed(high)} % vs "
          f"{verdicts.fixed(base)} %, {_above(run)}")


def row_grid_fmnist(runs=("grid_fmnist", "grid_fmnist_seed1"),
                    low_lr=("baseline_lr1e-4_fmnist_seed0",
                            "grid_fmnist_seed1")) -> str:
  """Per seed (one grid run each): the cells' final accuracy range against
  the baseline's, and how many cells never kept a learning rate above
  1e-4 (nor a second epoch) in any client-round (apart from lr 1e-5,
  round 1's grid[0], in a few early client-rounds); then FedAvg at lr
  1e-4 (``Baseline(lr 1e-4)``) per seed."""
  parts = []
  for seed, run in enumerate(runs):
    cells = _cells(run)
    kept = sum(_never_above(run, c) for c in cells)
    parts.append(f"seed {seed}: {_cells_text(run)}, {kept} of {len(cells)} "
                 f"cells never above lr 1e-4")
  low = ", ".join(
      f"{verdicts.fixed(100 * np.mean(_final(run, 'Baseline(lr 1e-4)')))} %"
      f" (seed {seed})" for seed, run in enumerate(low_lr))
  return (f"{'; '.join(parts)}; FedAvg at lr 1e-4: {low} (4,000 training "
          f"images)")


def row_line16(run: str = "choices_mnist") -> str:
  """Final accuracy of the printed line-16 rule against the gamma
  reading."""
  printed = _final(run, "ADCT_mean_best")
  gamma = _final(run, "ADCT_gamma50_first")
  return (f"{verdicts.pm(printed)} % vs the γ reading's "
          f"{verdicts.pm(gamma)} % (final acc.)")


def cells() -> list:
  """The verdict table's "ours" cells, in table order."""
  return [row_table5_mnist(), row_table5_fmnist(), row_grid_mnist(),
          row_grid_fmnist(), row_line16()]


if __name__ == "__main__":
  sys.exit(verdicts.main(cells, RESULTS_MD))
