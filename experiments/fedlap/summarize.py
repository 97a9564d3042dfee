"""Rebuilds the "ours" column of FedLap's verdict table (RESULTS.md).

Every number of the "ours" cells is computed from the committed histories
under ``experiments/fedlap/results/``: the Fashion-MNIST runs at the
paper's setting (``fig1b_fmnist_full``: FedAvg, FedProx μ ∈ {0.01, 0.1, 1},
FedLap q ∈ {0.25, 0.5, 0.75}, 100 rounds, 3 seeds; ``fig3_fmnist_full``:
50 % and 90 % stragglers, seeds 0 and 1) and the MNIST-5k runs
(``fig1a_mnist``, ``fig2_mnist``: 50 rounds, 3 seeds). The statistics are
those of ``run.py`` and of RESULTS.md: "early mean" = mean test accuracy
over rounds 1–20, "last 10" = mean over rounds 91–100, each per seed first,
then mean ± population sd over seeds; paired gaps = per-seed differences of
a statistic (given as their range); rounds to target = first round whose
accuracy reaches the target, per seed; a single-round peak = the largest
difference of the mean-over-seeds curves in one round. The CIFAR-10 row was
not run and stays literal.

  python experiments/fedlap/summarize.py [--check | --write]
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import verdicts

RESULTS, RESULTS_MD = verdicts.paper_files(HERE)
_curves = verdicts.reader(RESULTS)

FMNIST = "fig1b_fmnist_full"  # Fig. 1b at the paper's setting
STRAGGLERS = "fig3_fmnist_full"  # Fig. 3 at the paper's setting
STEPS = "fig3_fmnist_full_steps"  # the same, stragglers drawn in steps
MNIST = "fig1a_mnist"  # Fig. 1a, MNIST 5k subset
MNIST_STRAGGLERS = "fig2_mnist"  # Fig. 2, MNIST 5k subset
LEVELS = ("50", "90")  # the straggler levels (%), folder suffix "_s<level>"


def _early(curves: np.ndarray) -> np.ndarray:
  """Per seed: the early mean (rounds 1–20)."""
  return verdicts.window(curves, 1, 20)


def _last10(curves: np.ndarray) -> np.ndarray:
  """Per seed: the mean over the last 10 of 100 rounds (91–100)."""
  return verdicts.window(curves, 91, 100)


def _span(gaps) -> str:
  """The range of per-seed gaps (in points), smallest size first:
  "+0.7 to +2.0", "−1.2 to −2.2"."""
  gaps = sorted(np.asarray(gaps, np.float64) * 100, key=abs)
  return f"{verdicts.signed(gaps[0])} to {verdicts.signed(gaps[-1])}"


def _mean(values, scale: float = 100.0) -> str:
  """The mean over seeds, in percent with 1 decimal."""
  return verdicts.fixed(np.mean(values) * scale)


def _listing(rounds) -> str:
  return ", ".join("—" if r is None else str(r) for r in rounds)


def row_first_20_rounds(run: str = FMNIST) -> str:
  """Early mean of FedLap, FedAvg, FedProx μ = 1 and μ = 0.01, with the
  range of FedLap's per-seed gaps to each."""
  lap = _early(_curves(run, "FedLap"))
  avg = _early(_curves(run, "FedAvg"))
  prox = _early(_curves(run, "FedProx"))
  tuned = _early(_curves(run, "FedProx_mu0.01"))
  return (f"FMNIST, mean over rounds 1–20: FedLap {verdicts.pm(lap)} vs "
          f"FedAvg {verdicts.pm(avg)} ({_span(lap - avg)} per seed), "
          f"FedProx μ = 1 {verdicts.pm(prox)} ({_span(lap - prox)}), "
          f"FedProx μ = 0.01 {verdicts.pm(tuned)} ({_span(lap - tuned)})")


def row_fmnist_converges(run: str = FMNIST) -> str:
  """Last-10 mean (rounds 91–100) of FedLap and the baselines."""
  late = {a: verdicts.pm(_last10(_curves(run, a)))
          for a in ("FedLap", "FedAvg", "FedProx", "FedProx_mu0.1",
                    "FedProx_mu0.01")}
  return (f"mean over rounds 91–100: FedLap {late['FedLap']}, FedAvg "
          f"{late['FedAvg']}, FedProx μ = 1 {late['FedProx']}, μ = 0.1 "
          f"{late['FedProx_mu0.1']}, μ = 0.01 {late['FedProx_mu0.01']}")


def row_mnist_start(run: str = MNIST, start: int = 5, end: int = 50) -> str:
  """MNIST 5k: accuracy at rounds ``start`` and ``end``, mean over seeds."""
  at = {a: _curves(run, a) for a in ("FedLap", "FedAvg", "FedProx")}
  s = {a: _mean(c[:, start]) for a, c in at.items()}
  e = {a: _mean(c[:, end]) for a, c in at.items()}
  return (f"round {start}: {s['FedLap']} vs {s['FedAvg']} (FedAvg), "
          f"{s['FedProx']} (FedProx μ = 1); round {end}: {e['FedLap']} vs "
          f"{e['FedAvg']}, {e['FedProx']}")


def row_mnist_stragglers(run: str = MNIST_STRAGGLERS,
                         target: float = 0.8) -> str:
  """MNIST 5k with stragglers: FedLap's rounds to 80 % per seed, and
  FedAvg's (written out if they differ)."""
  lap, avg = ([verdicts.rounds_to(_curves(run, f"{name}_s{s}"), target)
               for s in LEVELS] for name in ("FedLap", "FedAvg"))
  fedavg = ("FedAvg the same" if lap == avg else
            f"FedAvg {_listing(avg[0])} and {_listing(avg[1])}")
  return (f"rounds to 80 %: FedLap {_listing(lap[0])} (50 %) and "
          f"{_listing(lap[1])} (90 %), {fedavg}")


def _straggler_cost(run: str, clean: str, algorithms) -> float:
  """The largest early-mean cost of stragglers over ``algorithms`` and the
  levels: the same seeds' early mean without stragglers less with them."""
  cost = []
  for algorithm in algorithms:
    for level in LEVELS:
      straggled = _early(_curves(run, f"{algorithm}_s{level}"))
      without = _early(_curves(clean, algorithm)[:len(straggled)])
      cost.append(np.mean(without) - np.mean(straggled))
  return max(cost)


def row_fmnist_stragglers(run: str = STRAGGLERS, clean: str = FMNIST,
                          steps: str = STEPS) -> str:
  """FMNIST with stragglers: range of FedLap's paired early-mean gaps over
  both levels, the largest single-round gap of the mean curves, and the
  largest early-mean cost of stragglers (same seeds without them); then
  the same gap over FedAvg and cost with stragglers drawn in steps."""
  gaps, peaks = {}, {}
  for base in ("FedAvg", "FedProx"):
    gaps[base], peaks[base] = [], []
    for level in LEVELS:
      lap = _curves(run, f"FedLap_s{level}")
      other = _curves(run, f"{base}_s{level}")
      gaps[base].extend(_early(lap) - _early(other))
      peaks[base].append(np.max(np.mean(lap - other, axis=0)))
  cost = _straggler_cost(run, clean, ("FedAvg", "FedProx", "FedLap"))
  step_gaps = [g for level in LEVELS for g in
               _early(_curves(steps, f"FedLap_s{level}"))
               - _early(_curves(steps, f"FedAvg_s{level}"))]
  step_cost = _straggler_cost(steps, clean, ("FedAvg", "FedLap"))
  peak = "single-round peaks {} / {}".format(
      *(verdicts.signed(100 * max(peaks[b])) for b in ("FedAvg", "FedProx")))
  return (f"early mean {_span(gaps['FedAvg'])} over FedAvg, "
          f"{_span(gaps['FedProx'])} over FedProx μ = 1; {peak}; "
          f"stragglers cost every algorithm ≤ {_mean(cost)} points of "
          f"early mean; drawn in steps (U{{1..600}}): early mean "
          f"{_span(step_gaps)} over FedAvg, cost ≤ {_mean(step_cost)}")


def row_q(run: str = FMNIST) -> str:
  """Early mean of FedLap at q = 0.25, 0.5, 0.75."""
  early = [verdicts.pm(_early(_curves(run, a)))
           for a in ("FedLap_q0.25", "FedLap", "FedLap_q0.75")]
  return ("FMNIST early mean q = 0.25: {}, 0.5: {}, 0.75: {}"
          .format(*early))


def row_cifar() -> str:
  """CIFAR-10 was not run: no numbers."""
  return "not run"


def cells() -> list:
  """The verdict table's "ours" cells, in table order."""
  return [row_first_20_rounds(), row_fmnist_converges(), row_mnist_start(),
          row_mnist_stragglers(), row_fmnist_stragglers(), row_q(),
          row_cifar()]


if __name__ == "__main__":
  sys.exit(verdicts.main(cells, RESULTS_MD))
