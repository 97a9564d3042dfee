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

Tree aggregation (DP-FTRL; Kairouz, McMahan, Song, Thakkar, Thakurta and
Xu, "Practical and Private (Deep) Learning without Sampling or
Shuffling", ICML 2021, App. D): a rule that adds its noise to the nodes
of a binary tree over the rounds (``aggregators.dp_ftrl``) is accounted
by ``tree_epsilons``, from the cohorts the run actually drew, with no
amplification by sampling. The cohorts are drawn from the run's seed,
independently of the data, and recorded; the guarantee holds given
them. A tree of T rounds so far has released its complete nodes, on
ceil(log2(T + 1)) levels; a client that took part in k of its rounds
moves each update by at most C / m (the node noise is z C / m), so the
node sums of one level by at most k C / m in L2 norm, and all of them by
k sqrt(ceil(log2(T + 1))) C / m: the tree is dp_accounting's
``SingleEpochTreeAggregationDpEvent(z / k, T)`` (stated there for
k = 1). Node by node the releases are Gaussian mechanisms, so the bound
holds for updates that depend on earlier releases. Trees (restarts)
have independent noise and compose. k is counted per tree for the most
frequent participant of the drawn cohorts: the run draws every round's
cohort afresh, so a client may return within a tree, and the RDP grows
as k^2. The neighbouring relation is dp_accounting's REPLACE_SPECIAL,
one client's updates replaced by zeros (the paper's); DP-FedAvg's
fixed-size cohorts above are accounted for replacing one client by
another.
"""

import functools
import math
import typing

import numpy as np

from fedjax_agg import checks
# The samplings and accountants, defined once with the run's Privacy.
from fedjax_agg import config as config_lib
from fedjax_agg import deprecation

__all__ = ["epsilon", "epsilons", "round_event",
           "rounds_for_epsilon", "tree_epsilons", "tree_event",
           "tree_participations"]

# Declared with the run's ``config.Privacy``; exported here before.
__getattr__ = deprecation.moved_names(__name__, {
    name: ("fedjax_agg.config", getattr(config_lib, name))
    for name in ("ACCOUNTANTS", "SAMPLINGS")})

if typing.TYPE_CHECKING:
  import dp_accounting  # noqa: F401


@functools.cache
def _dp():
  """The dp_accounting package, imported at the first account: it loads
  scipy.stats and scipy.signal (about 1 s), which a run without privacy,
  and every command that only checks or lists, never needs."""
  import dp_accounting  # pylint: disable=g-import-not-at-top,redefined-outer-name
  return dp_accounting


def _check(noise_multiplier, num_clients, cohort_size, delta, sampling,
           accountant):
  checks.check_range("noise_multiplier", noise_multiplier, 0)
  checks.check_int("num_clients", num_clients, 1)
  checks.check_int("cohort_size", cohort_size, 1, num_clients)
  checks.check_range("delta", delta, 0, 1, low_open=True, high_open=True)
  checks.check_choice("sampling", sampling, config_lib.SAMPLINGS)
  checks.check_choice("accountant", accountant, config_lib.ACCOUNTANTS)
  # Refused here, before dp_accounting is loaded, so the error names the
  # combination instead of surfacing from inside the accountant.
  if accountant == "pld" and sampling == "without_replacement":
    raise ValueError(
        "accountant='pld' does not support sampling='without_replacement' "
        "(dp_accounting's PLD accountant has no fixed-size sampling without "
        "replacement); use accountant='rdp' or sampling='poisson'")


def round_event(noise_multiplier: float, *, num_clients: int,
                cohort_size: int,
                sampling: str = "without_replacement"
                ) -> "dp_accounting.DpEvent":
  """The ``DpEvent`` of one round (see the module docstring)."""
  gaussian = _dp().GaussianDpEvent(noise_multiplier)
  if sampling == "poisson":
    return _dp().PoissonSampledDpEvent(cohort_size / num_clients, gaussian)
  return _dp().SampledWithoutReplacementDpEvent(
      num_clients, cohort_size, gaussian)


def _new_accountant(accountant: str, sampling: str):
  # A fixed-size cohort cannot gain or lose a member, so its neighbours
  # differ by one replaced client; Poisson cohorts vary in size and take
  # add-or-remove-one.
  relation = (_dp().NeighboringRelation.REPLACE_ONE
              if sampling == "without_replacement"
              else _dp().NeighboringRelation.ADD_OR_REMOVE_ONE)
  if accountant == "rdp":
    return _dp().rdp.RdpAccountant(neighboring_relation=relation)
  return _dp().pld.PLDAccountant(neighboring_relation=relation)


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
    return np.array([_dp().rdp.compute_epsilon(orders, r * curve, delta)[0]
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
  # Doubling overshot the cap: the cap itself is tested once, and the
  # bisection below searches (low, max_rounds) only if it fails.
  if high > max_rounds:
    if within(max_rounds):
      return max_rounds
    high = max_rounds
  while high - low > 1:  # within(low), not within(high)
    middle = (low + high) // 2
    low, high = (middle, high) if within(middle) else (low, middle)
  return low


def _check_cohorts(cohorts, restart_every) -> np.ndarray:
  if restart_every is not None:
    checks.check_int("restart_every", restart_every, 1)
  array = np.asarray(cohorts)
  if (array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0
      # Ids index a counts array: a negative id would silently count for
      # another client (numpy wraps it), a float id cannot index at all.
      or array.dtype.kind not in "iu" or np.any(array < 0)):
    raise ValueError(
        "cohorts must be an [R, K] array of client ids (ints >= 0) with "
        f"R, K >= 1, got shape {array.shape} and dtype {array.dtype}")
  return array


def _tree_rounds(cohorts: np.ndarray, restart_every):
  """Per round r: (T, k) of r's tree up to r (``tree_participations``)."""
  counts = np.zeros(int(cohorts.max()) + 1, np.int64)
  steps = np.empty(len(cohorts), np.int64)
  peaks = np.empty(len(cohorts), np.int64)
  peak = 0
  for r, ids in enumerate(cohorts):
    position = r % restart_every if restart_every else r
    if position == 0:  # a new tree
      counts[:] = 0
      peak = 0
    # np.add.at, not counts[ids] += 1: a client listed twice in one round
    # must count twice, and buffered fancy-index addition would count once.
    np.add.at(counts, ids, 1)
    # Only this round's ids changed, so the running peak needs only theirs.
    peak = max(peak, int(counts[ids].max()))
    steps[r], peaks[r] = position + 1, peak
  return steps, peaks


def tree_participations(cohorts, restart_every=None) -> np.ndarray:
  """k after each round: the most rounds any one client took part in,
  within that round's tree up to it. [R] int64.

  Args:
    cohorts: [R, K] the client ids of rounds 1..R (a client listed twice
      in a round counts twice).
    restart_every: rounds per tree (None: one tree).
  """
  return _tree_rounds(_check_cohorts(cohorts, restart_every),
                      restart_every)[1]


def _tree_event(noise_multiplier, steps, peaks):
  return _dp().SingleEpochTreeAggregationDpEvent(
      noise_multiplier / int(peaks), int(steps))


def tree_event(noise_multiplier: float, cohorts, restart_every=None
               ) -> "dp_accounting.DpEvent":
  """The ``DpEvent`` of rounds 1..R of a tree-aggregation rule on
  ``cohorts``: every tree's ``SingleEpochTreeAggregationDpEvent(z / k, T)``
  (T its rounds, k its most frequent participant's rounds), composed.
  Accounted with ``NeighboringRelation.REPLACE_SPECIAL``.

  Args:
    noise_multiplier: z > 0, the node noise over one participation's
      sensitivity.
    cohorts, restart_every: as ``tree_participations``.
  """
  checks.check_range("noise_multiplier", noise_multiplier, 0, low_open=True)
  steps, peaks = _tree_rounds(_check_cohorts(cohorts, restart_every),
                              restart_every)
  # A tree is accounted once, in its final state: T and k only grow
  # within a tree, so its last round carries both.
  last = np.append(steps[1:] == 1, True)  # each tree's last round
  return _dp().ComposedDpEvent([
      _tree_event(noise_multiplier, t, k)
      for t, k in zip(steps[last], peaks[last], strict=True)])


def tree_epsilons(noise_multiplier: float, cohorts, *, delta: float,
                  restart_every=None) -> np.ndarray:
  """epsilon after each round 1..R of a tree-aggregation rule, [R] float64.

  Round r's epsilon is that of ``tree_event(z, cohorts[:r])`` under the
  RDP accountant (module docstring): the completed trees' RDP curves are
  summed once, the current tree's is recomputed as it grows.

  Args:
    noise_multiplier: z >= 0 (0: no privacy, epsilon = inf).
    cohorts: [R, K] the client ids each round drew, R, K >= 1.
    delta: in (0, 1).
    restart_every: rounds per tree (None: one tree).

  Raises:
    ValueError, TypeError: naming the argument.
  """
  checks.check_range("noise_multiplier", noise_multiplier, 0)
  checks.check_range("delta", delta, 0, 1, low_open=True, high_open=True)
  steps, peaks = _tree_rounds(_check_cohorts(cohorts, restart_every),
                              restart_every)
  if noise_multiplier == 0:
    return np.full(len(steps), np.inf)
  curves = {}

  # Restarted trees of equal length and peak share one curve.
  def curve(t, k):
    if (t, k) not in curves:
      ledger = _dp().rdp.RdpAccountant(
          neighboring_relation=_dp().NeighboringRelation
          .REPLACE_SPECIAL)
      ledger.compose(_tree_event(noise_multiplier, t, k))
      curves[t, k] = (ledger.orders, ledger.rdp)
    return curves[t, k]

  completed = 0.0
  out = np.empty(len(steps))
  for r, (t, k) in enumerate(zip(steps, peaks, strict=True)):
    orders, current = curve(int(t), int(k))
    # Curves from separate ledgers add order by order because every
    # RdpAccountant here uses the same default orders.
    total = completed + current
    out[r] = _dp().rdp.compute_epsilon(orders, total, delta)[0]
    if r + 1 == len(steps) or steps[r + 1] == 1:
      completed = total
  return out
