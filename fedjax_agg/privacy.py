"""Privacy accounting of DP-FedAvg rounds with the dp_accounting package.

McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018: user-level DP, one Gaussian query
of noise multiplier z per round on a sampled cohort of m of N clients.
Mironov, "Renyi Differential Privacy", CSF 2017 (the RDP accountant);
the PLD accountant composes privacy loss distributions numerically
(tighter, slower).

A round is the event

* ``sampling="without_replacement"``: a fixed-size cohort of m distinct
  clients out of N (``SampledWithoutReplacementDpEvent``, the cohorts of
  ``fedjax_agg.sampling``), with the replace-one neighbouring relation
  (the RDP accountant only: dp_accounting's PLD accountant does not
  support it);
* ``sampling="poisson"``: every client joins with probability q = m / N
  (``PoissonSampledDpEvent``), add-or-remove-one neighbours;

of a ``GaussianDpEvent(z)``; R rounds compose. With adaptive clipping
``z`` is the round's total multiplier (``aggregators.dp_fedavg``
accounts the clipped count inside it). z = 0 gives epsilon = inf.
"""

import math

import numpy as np
import dp_accounting
from dp_accounting import rdp

from fedjax_agg import checks
# The samplings and accountants, defined once with the run's Privacy.
from fedjax_agg.config import ACCOUNTANTS
from fedjax_agg.config import SAMPLINGS

__all__ = ["ACCOUNTANTS", "SAMPLINGS", "epsilon", "epsilons", "round_event",
           "rounds_for_epsilon"]


def _check(noise_multiplier, num_clients, cohort_size, delta, sampling,
           accountant):
  checks.check_range("noise_multiplier", noise_multiplier, 0)
  checks.check_int("num_clients", num_clients, 1)
  checks.check_int("cohort_size", cohort_size, 1, num_clients)
  checks.check_range("delta", delta, 0, 1, low_open=True, high_open=True)
  checks.check_choice("sampling", sampling, SAMPLINGS)
  checks.check_choice("accountant", accountant, ACCOUNTANTS)
  if accountant == "pld" and sampling == "without_replacement":
    raise ValueError(
        "accountant='pld' does not support sampling='without_replacement' "
        "(dp_accounting's PLD accountant has no fixed-size sampling without "
        "replacement); use accountant='rdp' or sampling='poisson'")


def round_event(noise_multiplier: float, *, num_clients: int,
                cohort_size: int,
                sampling: str = "without_replacement"
                ) -> dp_accounting.DpEvent:
  """The ``DpEvent`` of one round (see the module docstring)."""
  gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
  if sampling == "poisson":
    return dp_accounting.PoissonSampledDpEvent(cohort_size / num_clients,
                                               gaussian)
  return dp_accounting.SampledWithoutReplacementDpEvent(
      num_clients, cohort_size, gaussian)


def _new_accountant(accountant: str, sampling: str):
  relation = (dp_accounting.NeighboringRelation.REPLACE_ONE
              if sampling == "without_replacement"
              else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
  if accountant == "rdp":
    return rdp.RdpAccountant(neighboring_relation=relation)
  return dp_accounting.pld.PLDAccountant(neighboring_relation=relation)


def epsilons(noise_multiplier: float, num_rounds: int, *, num_clients: int,
             cohort_size: int, delta: float,
             sampling: str = "without_replacement",
             accountant: str = "rdp") -> np.ndarray:
  """epsilon after each round 1..R, [R] float64 (non-decreasing).

  RDP: one round's RDP curve is computed once and scaled by r (RDP
  composes additively), so the cost barely grows with R. PLD: the round's
  loss distribution is composed in, one round at a time (R convolutions).

  Args:
    noise_multiplier: z >= 0 (0: no privacy, epsilon = inf).
    num_rounds: R >= 1.
    num_clients: N, the population the cohorts are drawn from.
    cohort_size: m in [1, N] (for Poisson, the expected cohort size).
    delta: in (0, 1).
    sampling: "without_replacement" (fixed-size cohorts) or "poisson".
    accountant: "rdp" or "pld" (PLD: Poisson sampling only).

  Raises:
    ValueError, TypeError: naming the argument.
  """
  _check(noise_multiplier, num_clients, cohort_size, delta, sampling,
         accountant)
  checks.check_int("num_rounds", num_rounds, 1)
  if noise_multiplier == 0:
    return np.full(num_rounds, np.inf)
  event = round_event(noise_multiplier, num_clients=num_clients,
                      cohort_size=cohort_size, sampling=sampling)
  ledger = _new_accountant(accountant, sampling)
  if accountant == "rdp":
    ledger.compose(event)
    curve, orders = ledger.rdp, ledger.orders
    return np.array([rdp.compute_epsilon(orders, r * curve, delta)[0]
                     for r in range(1, num_rounds + 1)], np.float64)
  out = np.empty(num_rounds)
  for r in range(num_rounds):
    ledger.compose(event)
    out[r] = ledger.get_epsilon(delta)
  return out


def epsilon(noise_multiplier: float, num_rounds: int, *, num_clients: int,
            cohort_size: int, delta: float,
            sampling: str = "without_replacement",
            accountant: str = "rdp") -> float:
  """epsilon after ``num_rounds`` rounds (arguments as ``epsilons``).

  The R rounds are composed at once (``compose(event, R)``; PLD by a
  self-composition), so a single value costs less than ``epsilons``.
  """
  _check(noise_multiplier, num_clients, cohort_size, delta, sampling,
         accountant)
  checks.check_int("num_rounds", num_rounds, 1)
  return _epsilon(noise_multiplier, num_rounds, num_clients, cohort_size,
                  delta, sampling, accountant)


def _epsilon(noise_multiplier, num_rounds, num_clients, cohort_size, delta,
             sampling, accountant) -> float:
  if noise_multiplier == 0:
    return math.inf
  ledger = _new_accountant(accountant, sampling)
  ledger.compose(round_event(noise_multiplier, num_clients=num_clients,
                             cohort_size=cohort_size, sampling=sampling),
                 num_rounds)
  return float(ledger.get_epsilon(delta))


def rounds_for_epsilon(target_epsilon: float, noise_multiplier: float, *,
                       num_clients: int, cohort_size: int, delta: float,
                       sampling: str = "without_replacement",
                       accountant: str = "rdp",
                       max_rounds: int = 10**6) -> int:
  """The largest R <= ``max_rounds`` with epsilon(R) <= ``target_epsilon``.

  0 when even one round exceeds the target; ``max_rounds`` when that many
  stay within it. Found by doubling then bisection over R (epsilon is
  non-decreasing in R), O(log R) accountant calls.

  Args:
    target_epsilon: > 0.
    noise_multiplier, num_clients, cohort_size, delta, sampling,
      accountant: as in ``epsilons``.
    max_rounds: >= 1, the search's upper end.
  """
  checks.check_range("target_epsilon", target_epsilon, 0, low_open=True)
  checks.check_int("max_rounds", max_rounds, 1)
  _check(noise_multiplier, num_clients, cohort_size, delta, sampling,
         accountant)

  def within(rounds):
    return _epsilon(noise_multiplier, rounds, num_clients, cohort_size,
                    delta, sampling, accountant) <= target_epsilon

  if not within(1):
    return 0
  low, high = 1, 2  # within(low); high to test
  while high <= max_rounds and within(high):
    low, high = high, 2 * high
  if high > max_rounds:
    if within(max_rounds):
      return max_rounds
    high = max_rounds
  while high - low > 1:  # within(low), not within(high)
    middle = (low + high) // 2
    low, high = (middle, high) if within(middle) else (low, middle)
  return low
