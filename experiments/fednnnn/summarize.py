"""Rebuilds the "ours" column of FedNNNN's verdict table (RESULTS.md).

Every number of the "ours" cells is computed from the committed files
under ``experiments/fednnnn/results/``: the 15-round MNIST-5k runs of the
four conditions (``iid_b_mnist``, ``noniid_b_mnist``: 3 seeds;
``noniid_ub_mnist``, ``iid_ub_mnist``: 1 seed) and the 100-round
non-IID - B runs (``noniid_b_mnist_100``: FedAvg, Norm-Norm, Momentum,
FedNNNN, 3 seeds). The statistics are those of ``run.py --tables-only``
and of RESULTS.md: "final" = test accuracy after the last round, "best" =
the largest test accuracy over rounds 1..last, each per seed, then mean ±
population sd over seeds; the gaps of the IID - B row are differences of
those means as the cell prints them (0.1 points). The norms are
``run.py``'s ``nwda.csv`` columns for the whole model (layer ``model``):
``N`` (Eq. (4), the norm of the mean client update), ``E`` (Eq. (5), the
mean norm of the client updates) and ``server_update_norm``
(|w_{t+1} - w_t|, the "N" of the paper's figures), each the mean over
rounds 11-15 and the 3 seeds of ``noniid_b_mnist``.

  python experiments/fednnnn/summarize.py [--check | --write]
"""

import csv
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import verdicts

RESULTS, RESULTS_MD = verdicts.paper_files(HERE)
_curves = verdicts.reader(RESULTS)

IID_B = "iid_b_mnist"  # IID - B, 15 rounds, 3 seeds
NONIID_B = "noniid_b_mnist"  # non-IID - B, 15 rounds, 3 seeds
NONIID_UB = "noniid_ub_mnist"  # non-IID - UB, 15 rounds, 1 seed
IID_UB = "iid_ub_mnist"  # IID - UB, 15 rounds, 1 seed (FedAvg, FedNNNN)
NONIID_B_100 = "noniid_b_mnist_100"  # non-IID - B, 100 rounds, 3 seeds
METHODS = ("FedAvg", "FedProx", "Norm-Norm", "Momentum", "FedNNNN")
NORM_ROUNDS = (11, 15)  # the rounds the norms are averaged over


def _final(run: str, algorithm: str) -> np.ndarray:
  """Per seed: the test accuracy after the last round."""
  return _curves(run, algorithm)[:, -1]


def _best(run: str, algorithm: str) -> np.ndarray:
  """Per seed: the best test accuracy over rounds 1..last."""
  return np.max(_curves(run, algorithm)[:, 1:], axis=1)


def _pm_final(run: str, algorithm: str) -> str:
  return verdicts.pm(_final(run, algorithm))


def _one(run: str, algorithm: str) -> str:
  """The final accuracy (percent) of a one-seed run."""
  final = _final(run, algorithm)
  if final.size != 1:
    raise ValueError(f"{run}/{algorithm} has {final.size} seeds, not 1")
  return verdicts.fixed(final[0] * 100)


def _shown_mean(run: str, algorithm: str) -> float:
  """The mean final accuracy over seeds as the tables print it (percent,
  rounded to 0.1)."""
  return round(float(np.mean(_final(run, algorithm))) * 100, 1)


def _norm(algorithm: str, key: str, run: str = NONIID_B) -> float:
  """Mean of ``nwda.csv`` column ``key`` (whole model) over rounds 11-15
  and the seeds of ``algorithm`` in ``run``."""
  with open(os.path.join(RESULTS, run, "nwda.csv"), newline="",
            encoding="utf-8") as f:
    values = [float(r[key]) for r in csv.DictReader(f)
              if r["algorithm"] == algorithm and r["layer"] == "model"
              and NORM_ROUNDS[0] <= int(r["round"]) <= NORM_ROUNDS[1]]
  if not values:
    raise ValueError(f"no {key} of {algorithm} in {run}/nwda.csv")
  return float(np.mean(values))


def row_table2_noniid_b() -> str:
  """FedNNNN the most accurate under non-IID - B, 15 and 100 rounds."""
  nnnn = _final(NONIID_B, "FedNNNN")
  others = np.max([_final(NONIID_B, a) for a in METHODS[:-1]], axis=0)
  ahead = ("ahead in every seed" if np.all(nnnn > others)
           else "not ahead in every seed")
  return (f"15 rounds: {verdicts.pm(nnnn)} vs "
          f"{_pm_final(NONIID_B, 'FedAvg')}, "
          f"{_pm_final(NONIID_B, 'FedProx')}, {ahead}; 100 rounds: "
          f"{_pm_final(NONIID_B_100, 'FedNNNN')} vs FedAvg "
          f"{_pm_final(NONIID_B_100, 'FedAvg')} (best round "
          f"{verdicts.pm(_best(NONIID_B_100, 'FedNNNN'))} vs "
          f"{verdicts.pm(_best(NONIID_B_100, 'FedAvg'))}), Norm-Norm "
          f"{_pm_final(NONIID_B_100, 'Norm-Norm')} level with it (3 seeds)")


def row_table2_iid_b() -> str:
  """Under IID - B the methods are close; FedNNNN and Norm-Norm above
  FedAvg and FedProx."""
  shown = {a: _shown_mean(IID_B, a) for a in METHODS}
  gaps = [shown[a] - shown[b] for a in ("FedNNNN", "Norm-Norm")
          for b in ("FedAvg", "FedProx")]
  return (f"{verdicts.fixed(min(shown.values()))}-"
          f"{verdicts.fixed(max(shown.values()))}: FedNNNN "
          f"{_pm_final(IID_B, 'FedNNNN')} and Norm-Norm "
          f"{_pm_final(IID_B, 'Norm-Norm')} are {verdicts.fixed(min(gaps))}-"
          f"{verdicts.fixed(max(gaps))} above FedAvg/FedProx (3 seeds)")


def row_table2_noniid_ub() -> str:
  """The non-IID - UB ranking (1 seed)."""
  return (f"{_one(NONIID_UB, 'FedNNNN')} > {_one(NONIID_UB, 'Momentum')} ≈ "
          f"{_one(NONIID_UB, 'Norm-Norm')} > FedProx "
          f"{_one(NONIID_UB, 'FedProx')} > FedAvg "
          f"{_one(NONIID_UB, 'FedAvg')} (1 seed)")


def row_table2_components() -> str:
  """Norm-Norm and Momentum alone against FedNNNN, non-IID - B."""
  cells = []
  for run in (NONIID_B, NONIID_B_100):
    cells.append(f"{_pm_final(run, 'Norm-Norm')}, "
                 f"{_pm_final(run, 'Momentum')} vs "
                 f"{_pm_final(run, 'FedNNNN')}")
  return f"15 rounds: {cells[0]}; 100 rounds: {cells[1]}"


def row_table2_iid_ub() -> str:
  """IID - UB: FedAvg and FedNNNN (1 seed)."""
  return (f"FedAvg {_one(IID_UB, 'FedAvg')}, FedNNNN "
          f"{_one(IID_UB, 'FedNNNN')} after 15 rounds (1 seed; FedProx, "
          "Norm-Norm and Momentum not run)")


def row_fig3_wudd() -> str:
  """FedAvg's N against its clients' E (non-IID - B, rounds 11-15)."""
  return (f"N {verdicts.fixed(_norm('FedAvg', 'N'), 2)} vs E "
          f"{verdicts.fixed(_norm('FedAvg', 'E'), 2)} (non-IID - B, rounds "
          "11-15; for FedAvg Eq. (4)'s N and the server step "
          r"\|w_{t+1} - w_t\| are equal)")


def row_figs8_9() -> str:
  """FedNNNN's server step, E and Eq. (4)'s N against FedAvg's."""
  def pair(key: str, digits: int) -> str:
    return (f"{verdicts.fixed(_norm('FedNNNN', key), digits)} vs "
            f"{verdicts.fixed(_norm('FedAvg', key), digits)}")
  return (r"server step \|w_{t+1} - w_t\| (the figures' N) "
          f"{pair('server_update_norm', 2)}, E {pair('E', 2)}; Eq. (4)'s "
          f"N, the norm of the mean client update, is {pair('N', 3)}")


def cells() -> list[str]:
  """The verdict table's "ours" cells, table order."""
  return [row_table2_noniid_b(), row_table2_iid_b(), row_table2_noniid_ub(),
          row_table2_components(), row_table2_iid_ub(), row_fig3_wudd(),
          row_figs8_9()]


if __name__ == "__main__":
  sys.exit(verdicts.main(cells, RESULTS_MD))
