"""Rebuilds the "ours" column of FedLayerWise's verdict table (RESULTS.md).

Every number of the "ours" cells is computed from the committed histories
under ``experiments/fedlayerwise/results/``: the MNIST-5k runs with the
paper's Adam (``2iid_8noniid_adam``, ``5iid_5noniid_adam``: lr 1e-3,
30 rounds, 3 seeds), with SGD (``2iid_8noniid``, η = 0.005, 3 seeds) and the
Fashion-MNIST run with 600 examples per client (``2iid_8noniid_fmnist``,
SGD, seeds 0 and 1). The statistics are those of ``run.py`` and of
RESULTS.md: rounds to a target = the first round whose test accuracy
reaches it, per seed ("–" = not within the 30 rounds); final accuracy = the
test accuracy after round 30, as a fraction, mean ± population sd over
seeds.

  python experiments/fedlayerwise/summarize.py [--check | --write]
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import verdicts

RESULTS, RESULTS_MD = verdicts.paper_files(HERE)
_curves = verdicts.reader(RESULTS)

ADAM_2_8 = "2iid_8noniid_adam"  # 2 IID + 8 non-IID, Adam
ADAM_2_8_LR = "2iid_8noniid_adam_lr005"  # the same, the paper's η = 0.005
ADAM_5_5 = "5iid_5noniid_adam"  # 5 IID + 5 non-IID, Adam
SGD_2_8 = "2iid_8noniid"  # 2 IID + 8 non-IID, SGD η = 0.005
FMNIST_2_8 = "2iid_8noniid_fmnist"  # Fashion-MNIST, 10 × 600, SGD
ADAPTIVE = ("FedLayerWise", "FedAdp")  # the adaptive weighting rules
NEVER = "–"  # a target not reached within the rounds run


def _listing(rounds) -> str:
  """Per-seed rounds as "23 / 20 / –"."""
  return " / ".join(NEVER if r is None else str(r) for r in rounds)


def _span(rounds) -> str:
  """The range of rounds that all reach the target: "6–9"."""
  if any(r is None for r in rounds):
    raise ValueError(f"a seed never reaches the target: {rounds}")
  return f"{min(rounds)}–{max(rounds)}"


def _final(run: str, algorithm: str) -> np.ndarray:
  """Per seed: the test accuracy after the last round."""
  return _curves(run, algorithm)[:, -1]


def _final_pm(run: str, algorithm: str) -> str:
  """Final accuracy as a fraction, mean ± sd over seeds: "0.945 ± 0.007"."""
  return verdicts.pm(_final(run, algorithm), digits=3, scale=1.0)


def row_skewed_noniid() -> str:
  """Row 1: rounds to 95 % with Adam in 2 IID + 8 non-IID, per seed, and
  the ranges of rounds to 90 % (adaptive rules against FedAvg)."""
  adp = verdicts.rounds_to(_curves(ADAM_2_8, "FedAdp"), 0.95)
  flw = verdicts.rounds_to(_curves(ADAM_2_8, "FedLayerWise"), 0.95)
  avg = verdicts.rounds_to(_curves(ADAM_2_8, "FedAvg"), 0.95)
  avg_text = "never" if all(r is None for r in avg) else _listing(avg)
  adaptive90 = [r for name in ADAPTIVE
                for r in verdicts.rounds_to(_curves(ADAM_2_8, name), 0.90)]
  avg90 = verdicts.rounds_to(_curves(ADAM_2_8, "FedAvg"), 0.90)
  at_eta = ", ".join(
      f"{name} {_listing(verdicts.rounds_to(_curves(ADAM_2_8_LR, name), 0.95))}"
      for name in ("FedAdp", "FedLayerWise", "FedAvg"))
  at_eta90 = ", ".join(
      f"{name} {_span(verdicts.rounds_to(_curves(ADAM_2_8_LR, name), 0.90))}"
      for name in ("FedAdp", "FedLayerWise", "FedAvg"))
  return (f"Adam: FedAdp {_listing(adp)} , FedLayerWise {_listing(flw)}, "
          f"FedAvg {avg_text} (seeds 0/1/2); 90 % in {_span(adaptive90)} "
          f"rounds against {_span(avg90)}; Adam at the paper's η = 0.005: "
          f"{at_eta}; 90 % in {at_eta90} rounds")


def row_half_noniid() -> str:
  """Row 2: rounds to 95 % with Adam in 5 IID + 5 non-IID, per seed."""
  listings = [
      f"{name} {_listing(verdicts.rounds_to(_curves(ADAM_5_5, name), 0.95))}"
      for name in ("FedLayerWise", "FedAdp", "FedAvg")]
  return "Adam: " + ", ".join(listings)


def row_layerwise_lead() -> str:
  """Row 3: final accuracy of FedLayerWise against FedAdp in the four
  2 IID + 8 non-IID settings (Adam at lr 1e-3 and 0.005, SGD,
  Fashion-MNIST)."""
  settings = (("Adam 2+8", ADAM_2_8), ("Adam η = 0.005", ADAM_2_8_LR),
              ("SGD", SGD_2_8),
              ("Fashion-MNIST with 600 examples per client", FMNIST_2_8))
  leads = [np.mean(_final(run, "FedLayerWise"))
           > np.mean(_final(run, "FedAdp")) for _, run in settings]
  head = ("no lead in any setting" if not any(leads)
          else f"a lead in {sum(leads)} of {len(leads)} settings")
  parts = [f"{label} {'final ' if i == 0 else ''}"
           f"{_final_pm(run, 'FedLayerWise')} vs {_final_pm(run, 'FedAdp')}"
           for i, (label, run) in enumerate(settings)]
  return f"{head}: " + ", ".join(parts)


def cells() -> list:
  """The "ours" cells of the verdict table, row order."""
  return [row_skewed_noniid(), row_half_noniid(), row_layerwise_lead()]


if __name__ == "__main__":
  sys.exit(verdicts.main(cells, RESULTS_MD))
