"""A run's differential-privacy accounting: the noise of the rule that
adds it (``resolve_privacy``), epsilon after every round for each member
(``account``), where a target epsilon ends the run, and the callback that
records epsilon in the history (``callbacks``). ``fedjax_agg.runner``
accounts every run before its first round; the accountants themselves
are ``fedjax_agg.privacy``'s."""

import dataclasses
import warnings
from typing import NamedTuple, Optional

import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import loop
from fedjax_agg import privacy as privacy_lib
from fedjax_agg.config import Privacy
from fedjax_agg.types import Aggregator

__all__ = ["Accounts", "account", "callbacks", "epsilons_by_round",
           "resolve_privacy"]


def resolve_privacy(privacy: Optional[Privacy], aggregator: Aggregator,
                    cohort_size: int) -> Optional[Privacy]:
  """``privacy`` with the noise multiplier of the rule that adds the noise.

  The accounting is derived from ``aggregator.noise_multiplier``, never
  taken on trust: a rule that adds no calibrated Gaussian noise, a stated
  ``Privacy.noise_multiplier`` that differs from the rule's, Poisson
  sampling with a rule that divides by the realised cohort size (its noise
  then depends on who was drawn) and Poisson sampling with a rule whose
  noise is tree-aggregated (``aggregators.TreeAggregationNoise``, DP-FTRL:
  accounted from the participations in its fixed-size cohorts) are
  refused.

  Args:
    privacy: the run's ``config.Privacy`` or None.
    aggregator: the run's rule.
    cohort_size: m; under Poisson sampling q N = m.
  """
  if privacy is None:
    return None
  if not isinstance(privacy, Privacy):
    raise TypeError(f"privacy must be a config.Privacy, got "
                    f"{type(privacy).__name__}")
  rule_z = aggregator.noise_multiplier
  if rule_z is None:
    raise ValueError(
        "privacy: the aggregator adds no calibrated Gaussian noise "
        "(Aggregator.noise_multiplier is None), so the run has no privacy "
        "guarantee to account; use a private rule such as "
        "aggregators.dp_fedavg, or drop privacy")
  # A plain float from here on; whether the noise is tree-aggregated is
  # read from aggregator.noise_multiplier itself, which keeps its subclass.
  rule_z = float(rule_z)
  # Relative tolerance only: a multiplier stated with fewer digits than the
  # rule's float still matches, and a small z is not matched by any other
  # small z through an absolute tolerance.
  if privacy.noise_multiplier is not None and not np.isclose(
      privacy.noise_multiplier, rule_z, rtol=1e-6, atol=0.0):
    raise ValueError(
        f"privacy.noise_multiplier={privacy.noise_multiplier} differs from "
        f"the noise the aggregator adds (noise_multiplier={rule_z}); the "
        "accounting is that of the rule's noise: leave "
        "Privacy.noise_multiplier unset or make them equal")
  if privacy.sampling == "poisson" and isinstance(
      aggregator.noise_multiplier, aggregators.TreeAggregationNoise):
    raise ValueError(
        "privacy.sampling='poisson': the aggregator adds its noise by tree "
        "aggregation (DP-FTRL), whose accounting takes no amplification by "
        "sampling; it counts how often each client takes part in the run's "
        "fixed-size cohorts: use sampling='without_replacement'")
  if privacy.sampling == "poisson":
    expected = aggregator.expected_clients
    if expected is None or not np.isclose(float(expected), cohort_size):
      raise ValueError(
          f"privacy.sampling='poisson': the aggregator must divide by the "
          f"fixed expected cohort size q N = {cohort_size} (e.g. "
          f"dp_fedavg(expected_clients={cohort_size})), got expected_clients="
          f"{expected}; dividing by the realised cohort size makes the "
          "noise depend on who was drawn, which the accountant does not "
          "cover")
  return dataclasses.replace(privacy, noise_multiplier=rule_z)


def epsilons_by_round(privacy: Optional[Privacy], num_clients: int,
                      cohort_size: int, num_rounds: int,
                      tree=None) -> dict:
  """Epsilon after each round, and where the target ends the run (the
  Poisson rate is q = m / N, as the sampler draws). ``tree``: (rounds per
  tree or None, the [R, m] cohorts the run draws) for a rule whose noise
  is tree-aggregated, accounted from those cohorts."""
  if privacy is None or num_rounds == 0:
    return {}
  if tree is None:
    epsilons = privacy_lib.epsilons(
        privacy.noise_multiplier, num_rounds, num_clients=num_clients,
        delta=privacy.delta, sampling=privacy.sampling,
        accountant=privacy.accountant, cohort_size=cohort_size)
  else:
    restart_every, cohorts = tree
    epsilons = privacy_lib.tree_epsilons(
        privacy.noise_multiplier, cohorts, delta=privacy.delta,
        restart_every=restart_every)
  out = {"epsilons": epsilons, "requested_rounds": num_rounds}
  if privacy.target_epsilon is not None:
    # Epsilon is non-decreasing in the rounds, so the count of rounds within
    # the target is the length of the prefix that may run.
    allowed = int(np.sum(epsilons <= privacy.target_epsilon))
    if allowed == 0:
      raise ValueError(
          f"privacy: a single round already costs epsilon="
          f"{epsilons[0]:.4g} > target_epsilon={privacy.target_epsilon}")
    if allowed < num_rounds:
      out["rounds_run"] = allowed
      out["stopped_by"] = "target_epsilon"
  out["final_epsilon"] = float(epsilons[out.get("rounds_run",
                                                num_rounds) - 1])
  if tree is not None:
    restart_every, cohorts = tree
    out.update(mechanism="tree_aggregation", neighboring_relation="zero_out",
               restart_every=restart_every,
               max_participations=int(privacy_lib.tree_participations(
                   cohorts[:out.get("rounds_run", num_rounds)],
                   restart_every).max()))
  return out


class Accounts(NamedTuple):
  """Every member's privacy and accounting, and the rounds the run
  makes."""
  privacy: list  # per member: the resolved Privacy or None
  accounting: list  # per member: epsilons_by_round's dict
  num_rounds: int  # the rounds the run makes (target epsilon may end it)


def account(options, members, vmapped: bool, num_clients: int, built,
            cohort_size: int, run_keys) -> Accounts:
  """Every member's privacy, resolved from its own rule, and accounting.

  Args:
    options: the run's ``RunOptions`` (privacy, R, sampler).
    members: (grid point, seed) per member.
    vmapped: whether the members step as one vmapped call.
    num_clients: N.
    built: per grid point, (aggregator, objective).
    cohort_size: m.
    run_keys: per seed: a tree-aggregation rule is accounted from the
      cohorts its seed draws.
  """
  if vmapped and isinstance(options.privacy, Privacy) and (
      options.privacy.sampling == "poisson"):
    raise ValueError(
        "privacy.sampling='poisson' draws a cohort of random size each "
        "round, which members stepped as one vmapped call cannot share; "
        "use sampling='fixed' in a sweep, or run the members one at a time")
  resolved = [resolve_privacy(options.privacy, built[p][0], cohort_size)
              for p, _ in members]
  cache, cohorts = {}, {}
  accounting = []
  for (p, s), privacy in zip(members, resolved, strict=True):
    rule_z = built[p][0].noise_multiplier
    tree = None
    if privacy is not None and isinstance(
        rule_z, aggregators.TreeAggregationNoise) and options.num_rounds:
      if s not in cohorts:
        cohorts[s] = loop.drawn_cohorts(
            run_keys[s], options.num_rounds, num_clients, cohort_size,
            options.execution.sampler)
      tree = (rule_z.restart_every, cohorts[s])
    # Members with the same noise share one accounting; a tree-aggregated
    # rule's also depends on the cohorts, i.e. on its seed.
    key = None if privacy is None else (
        privacy.noise_multiplier,
        None if tree is None else (tree[0], s))
    if key not in cache:
      cache[key] = epsilons_by_round(privacy, num_clients, cohort_size,
                                     options.num_rounds, tree)
    accounting.append(cache[key])
  # Members are stepped together round by round, so a target that would
  # stop them at different rounds cannot be honoured for all of them.
  ends = {a.get("rounds_run", options.num_rounds) for a in accounting}
  if len(ends) > 1:
    raise ValueError(
        f"privacy.target_epsilon: the members reach the target after "
        f"different numbers of rounds {sorted(ends)} (their rules add "
        "different noise); members stepped together must run as many "
        "rounds: run them one at a time")
  end = ends.pop()
  if end < options.num_rounds:
    warnings.warn(
        f"privacy: epsilon passes target_epsilon="
        f"{options.privacy.target_epsilon} after round {end}; the run "
        f"ends there instead of at round {options.num_rounds}",
        stacklevel=4)
  return Accounts(resolved, accounting, end)


def callbacks(accounts: Accounts, m: int, num_rounds: int) -> list:
  """Member ``m``'s ``loop.PrivacyAccounting`` callback, or none."""
  accounting = accounts.accounting[m]
  if "epsilons" not in accounting:
    return []
  final = accounting.get("rounds_run")
  return [loop.PrivacyAccounting(accounting["epsilons"],
                                 final_round=final or num_rounds)]
