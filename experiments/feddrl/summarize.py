"""Rebuilds the "ours" column of FedDRL's verdict table (RESULTS.md).

Every number of the "ours" cells is computed from the committed
histories under ``experiments/feddrl/results/``: the 1000-round runs
(``long1000_fmnist_ce``: FedAvg, FedDRL; ``long1000_fmnist_cn``: FedAvg,
FedAvg-uniform, FedDRL; 2 seeds), the 300-round runs with the uniform-
weight control (``long_fmnist_ce``, ``long_fmnist_cn``) and the 40-round
Table 3 runs (``table3_fmnist_{ce,cn,pa}``). The statistics are those of
``run.py``'s ``table3`` and of RESULTS.md: "best" = max over rounds,
"final" = the last round, a window's mean = mean accuracy over its
rounds, client loss = the ``client_loss_mean`` / ``client_loss_var``
columns averaged over the last 50 rounds, rounds to target = first round
reaching the lowest of the algorithms' best accuracies (per seed); each
per seed first, then mean ± population sd over seeds. The results folder
of every row is a parameter.

  python experiments/feddrl/summarize.py [--check | --write]
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import verdicts

RESULTS, RESULTS_MD = verdicts.paper_files(HERE)
_curves = verdicts.reader(RESULTS)

# The algorithms of the long runs (the rounds-to-target targets are the
# lowest of their best accuracies).
LONG = ("FedAvg", "FedAvg-uniform", "FedDRL")
DASH = "\u2013"  # the tables' range dash ("251–300")


def _rounds(run: str, algorithm: str = "FedAvg") -> int:
  """The number of rounds of ``run`` (history rows less the initial one)."""
  return _curves(run, algorithm).shape[1] - 1


def _late(run: str, last: int) -> tuple:
  """(first, final) round of the last ``last`` rounds of ``run``."""
  rounds = _rounds(run)
  return rounds - last + 1, rounds


def _span(first: int, last: int) -> str:
  return f"{first}{DASH}{last}"


def _pm2(values) -> str:
  """Mean ± sd in percent with 2 decimals, taken of the fractions as
  ``run.py``'s ``table3`` does (so a tie like 69.525 rounds as in
  ``table3.json`` and RESULTS.md's Table 3)."""
  values = np.asarray(values, np.float64)
  return (f"{verdicts.fixed(np.mean(values) * 100, 2)} ± "
          f"{verdicts.fixed(np.std(values) * 100, 2)}")


def _best(run: str, algorithm: str) -> np.ndarray:
  """Per seed: the best test accuracy over the rounds."""
  return np.nanmax(_curves(run, algorithm), axis=1)


def _algorithms(run: str) -> tuple:
  """The algorithms of ``LONG`` that ``run`` holds."""
  return tuple(a for a in LONG
               if os.path.isdir(os.path.join(RESULTS, run, a)))


def _to_target(run: str) -> dict:
  """algorithm -> per-seed first round reaching the target, the target
  being the lowest of the run's algorithms' best accuracies, per seed."""
  algorithms = _algorithms(run)
  targets = np.min(np.stack([_best(run, a) for a in algorithms]), axis=0)
  return {a: [verdicts.first_round(c, t) for c, t in
              zip(_curves(run, a), targets, strict=True)]
          for a in algorithms}


def _listing(rounds) -> str:
  return ", ".join("none" if r is None else str(r) for r in rounds)


def row_ce_best(run: str = "long1000_fmnist_ce",
                earlier: str = "long_fmnist_ce",
                short: str = "table3_fmnist_ce", last: int = 50) -> str:
  """CE: FedDRL vs FedAvg, best, late mean and final accuracy (the long
  runs), best accuracy of the 40-round run."""

  def late(r):
    drl, avg = _curves(r, "FedDRL"), _curves(r, "FedAvg")
    first, final = _late(r, last)
    return (f"mean over rounds {_span(first, final)} "
            f"{verdicts.pm(verdicts.window(drl, first, final))} vs "
            f"{verdicts.pm(verdicts.window(avg, first, final))}")

  drl, avg = _curves(run, "FedDRL"), _curves(run, "FedAvg")
  return (f"{_rounds(run)} rounds: best {verdicts.pm(np.nanmax(drl, 1))} vs "
          f"{verdicts.pm(np.nanmax(avg, 1))}; {late(run)}; final "
          f"{verdicts.pm(drl[:, -1])} vs {verdicts.pm(avg[:, -1])} "
          f"({_rounds(earlier)} rounds: best "
          f"{verdicts.pm(_best(earlier, 'FedDRL'))} vs "
          f"{verdicts.pm(_best(earlier, 'FedAvg'))}, {late(earlier)}; "
          f"{_rounds(short)} rounds: best "
          f"{verdicts.fixed(np.mean(_best(short, 'FedDRL')) * 100)} vs "
          f"{verdicts.fixed(np.mean(_best(short, 'FedAvg')) * 100)})")


def row_cn_best(run: str = "long1000_fmnist_cn", last: int = 50) -> str:
  """CN: FedDRL vs FedAvg and uniform FedAvg, best and late accuracy."""
  curves = {a: _curves(run, a) for a in LONG}
  first, final = _late(run, last)
  best = {a: verdicts.pm(np.nanmax(c, 1)) for a, c in curves.items()}
  late = {a: verdicts.pm(verdicts.window(c, first, final))
          for a, c in curves.items()}
  return (f"{_rounds(run)} rounds: best {best['FedDRL']} vs FedAvg "
          f"{best['FedAvg']} and **uniform-weight FedAvg "
          f"{best['FedAvg-uniform']}**; rounds {_span(first, final)} "
          f"{late['FedDRL']} vs {late['FedAvg']} and "
          f"{late['FedAvg-uniform']}")


def row_pa_best(run: str = "table3_fmnist_pa") -> str:
  """PA: FedDRL's vs FedAvg's best accuracy, 40-round Table 3 run."""
  return (f"{_rounds(run)} rounds: {_pm2(_best(run, 'FedDRL'))} vs "
          f"{_pm2(_best(run, 'FedAvg'))}")


def row_ce_crossover(run: str = "long1000_fmnist_ce",
                     windows=((1, 50), (51, 100), (101, 200), (201, 300),
                              (301, 500), (501, 750), (751, 1000)),
                     span: int = 50) -> str:
  """CE: FedDRL minus FedAvg (mean over seeds and the window's rounds) in
  every window, and whether FedDRL's mean over any ``span`` consecutive
  rounds passes FedAvg's (means over the seeds)."""
  drl, avg = _curves(run, "FedDRL"), _curves(run, "FedAvg")
  gaps = ", ".join(
      f"{verdicts.signed(100 * np.mean(verdicts.window(drl - avg, a, b)))}"
      f" over {_span(a, b)}" for a, b in windows)
  kernel = np.ones(span) / span
  moving = np.convolve(np.mean(drl - avg, 0)[1:], kernel, "valid")
  ahead = np.nonzero(moving >= 0)[0]
  where = (f"first at rounds {_span(ahead[0] + 1, ahead[0] + span)}"
           if ahead.size else "never")
  return (f"CE, FedDRL minus FedAvg, mean accuracy by window: {gaps}; "
          f"FedDRL's mean over {span} consecutive rounds reaches FedAvg's: "
          f"{where}")


def row_client_loss(ce: str = "long1000_fmnist_ce",
                    cn: str = "long1000_fmnist_cn", last: int = 50) -> str:
  """Client-loss mean and variance over the clients, averaged over the
  last ``last`` rounds and the seeds, CE and CN."""

  def loss(run, algorithm, name):
    first, final = _late(run, last)
    curves = _curves(run, algorithm, name)
    value = np.mean(verdicts.window(curves, first, final))
    return verdicts.fixed(value, 3)

  def both(run, algorithm):
    return (f"{loss(run, algorithm, 'client_loss_mean')} / "
            f"{loss(run, algorithm, 'client_loss_var')}")

  first, final = _late(ce, last)
  return (f"rounds {_span(first, final)}, CE: mean "
          f"{loss(ce, 'FedDRL', 'client_loss_mean')} vs "
          f"{loss(ce, 'FedAvg', 'client_loss_mean')}, variance "
          f"{loss(ce, 'FedDRL', 'client_loss_var')} vs "
          f"{loss(ce, 'FedAvg', 'client_loss_var')}; CN: "
          f"{both(cn, 'FedDRL')} vs FedAvg {both(cn, 'FedAvg')} but uniform "
          f"FedAvg {both(cn, 'FedAvg-uniform')}")


def row_rounds_to_target(ce: str = "long1000_fmnist_ce",
                         cn: str = "long1000_fmnist_cn") -> str:
  """Rounds to the target (lowest best accuracy per seed), per seed."""
  hits_ce, hits_cn = _to_target(ce), _to_target(cn)
  return (f"{_rounds(ce)} rounds, target = lowest best accuracy per seed: "
          f"CE {_listing(hits_ce['FedDRL'])} vs FedAvg "
          f"{_listing(hits_ce['FedAvg'])}; CN {_listing(hits_cn['FedDRL'])} "
          f"vs uniform FedAvg {_listing(hits_cn['FedAvg-uniform'])}, FedAvg "
          f"{_listing(hits_cn['FedAvg'])}")


def cells() -> list:
  """The verdict table's "ours" cells, in table order."""
  return [row_ce_best(), row_cn_best(), row_pa_best(), row_ce_crossover(),
          row_client_loss(), row_rounds_to_target()]


if __name__ == "__main__":
  sys.exit(verdicts.main(cells, RESULTS_MD))
