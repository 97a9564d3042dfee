"""The differential-privacy accounting of a run: ``Privacy``. Part of
``fedjax_agg.config``.
"""

import dataclasses
from typing import Optional


from fedjax_agg import checks
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field as _field


SAMPLINGS = ("without_replacement", "poisson")
"""``Privacy.sampling``'s names: fixed-size cohorts or Poisson cohorts."""
ACCOUNTANTS = ("rdp", "pld")
"""The privacy accountants ``Privacy.accountant`` may name: RDP or PLD."""


@dataclasses.dataclass(frozen=True)
class Privacy:
  """Differential-privacy accounting of a run (``fedjax_agg.privacy``).

  The run records epsilon at ``delta`` after every round (column
  ``epsilon``) for the cohorts it actually draws, and ends early, after
  the last round whose epsilon stays within ``target_epsilon``.

  The noise accounted for is the noise the run's aggregator adds: its
  ``Aggregator.noise_multiplier`` (``aggregators.dp_fedavg``). A run whose
  rule adds no calibrated noise is refused, never accounted. A rule whose
  noise is tree-aggregated (``aggregators.dp_ftrl``, its multiplier an
  ``aggregators.TreeAggregationNoise``) is accounted as its trees, with no
  amplification by sampling, from how often each client takes part in
  the run's fixed-size cohorts (``privacy.tree_epsilons``; RDP accountant,
  "without_replacement" cohorts only).

  Attributes:
    noise_multiplier: None (the default): the aggregator's own z. A number
      states the z the caller expects: a run whose aggregator adds another
      is refused (it would report a guarantee the run does not have).
    delta: in (0, 1).
    accountant: "rdp" or "pld" (PLD: Poisson sampling only).
    sampling: "without_replacement": the run's cohorts of m = floor(C N)
      distinct clients; "poisson": every client joins each round with
      probability q = m / N (the run then draws Poisson cohorts, padded
      to a fixed capacity, ``sampling.poisson_capacity``); the rule must
      then divide by the fixed expected cohort size qN
      (``dp_fedavg(expected_clients=q * N)``), as McMahan et al. 2018 do.
    target_epsilon: stop before epsilon would exceed it (None: never).
  """
  # Each field's command-line flag is declared with it (the description's
  # "privacy" section, ``spec.PrivacySpec``, is this class).
  noise_multiplier: Optional[float] = _field(None)
  delta: float = _field(1e-5, Flag(
      "--dp-delta", "with --aggregator dp_fedavg: delta of the epsilon "
      "recorded after every round (default 1e-5)", type=float))
  accountant: str = _field("rdp", Flag(
      "--dp-accountant", "with dp_fedavg: privacy accountant (default rdp)",
      choices=ACCOUNTANTS))
  sampling: str = _field("without_replacement", Flag(
      "--dp-sampling", "with dp_fedavg: fixed-size cohorts (default) or "
      "Poisson cohorts, accounted as drawn", choices=SAMPLINGS))
  target_epsilon: Optional[float] = _field(None, Flag(
      "--target-epsilon", "with dp_fedavg: end the run before epsilon "
      "passes this", type=float))

  def __post_init__(self):
    if self.noise_multiplier is not None:
      checks.check_range("noise_multiplier", self.noise_multiplier, 0)
    checks.check_range("delta", self.delta, 0, 1, low_open=True,
                       high_open=True)
    checks.check_choice("accountant", self.accountant, ACCOUNTANTS)
    checks.check_choice("sampling", self.sampling, SAMPLINGS)
    if self.accountant == "pld" and self.sampling != "poisson":
      raise ValueError("accountant='pld' needs sampling='poisson' (the PLD "
                       "accountant has no fixed-size sampling)")
    if self.target_epsilon is not None:
      checks.check_range("target_epsilon", self.target_epsilon, 0,
                         low_open=True)
