"""Stragglers: participants that send back a partly trained model.

FedLap (Charteros & Koutsopoulos, Sec. V-C), after FedProx (Li et al., MLSys
2020, Sec. 5.2): a fraction of each round's participants are stragglers;
each performs a random number of local updates in [1, E] and sends what it
has learned by then.

Interpretation: the number of stragglers per round is exactly
``round(fraction * K)`` (half up) of the K cohort rows, chosen uniformly
without replacement. With ``unit="epochs"`` (the default, FedProx's
"x epochs, x uniform in [1, E]") a straggler draws x uniformly in {1, ..., E}
and takes x full epochs of steps; with ``unit="steps"`` it draws its number
of minibatch steps uniformly in {1, ..., E * steps_per_epoch}. Every other
participant takes all its steps. The result is a per-client step budget for
the engine (``engine.make_local_trainer``'s ``num_steps``), so a straggler
ends exactly where training it alone for that many steps would.
"""

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg.declared import check_fields
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field
from fedjax_agg.types import PRNGKey

__all__ = ["Stragglers", "UNITS", "num_stragglers", "straggler_mask",
    "straggler_steps", "stragglers"]

UNITS = ("epochs", "steps")
"""The units in which a straggler's work is drawn: whole "epochs" or
minibatch "steps"."""


def _check_fraction(name: str, fraction) -> None:
  checks.check_number(name, fraction, 0, 1)


def _check_unit(name: str, unit) -> None:
  checks.check_choice(name, unit, UNITS)


def _check(fraction, num_epochs, unit):
  _check_fraction("fraction", fraction)
  checks.check_int("num_epochs", num_epochs, 1)
  _check_unit("unit", unit)


@dataclasses.dataclass(frozen=True)
class Stragglers:
  """The run's stragglers, as a description's "train" section sets them
  (its keys ``stragglers`` and ``straggler_unit``).

  Attributes:
    fraction: the share of each cohort that straggles, in [0, 1].
    unit: what a straggler's share of its work is drawn in (``UNITS``).
  """
  fraction: float = spec_field(0.0, Flag(
      "--stragglers", "fraction of each cohort that straggles", type=float,
      preset=0.0), check=_check_fraction, key="stragglers")
  unit: str = spec_field("epochs", Flag(
      "--straggler-unit", "what a straggler's share of its work is drawn "
      "in: whole epochs x ~ U{1..E} (FedProx's setting) or steps",
      choices=UNITS), check=_check_unit, key="straggler_unit")

  def __post_init__(self):
    check_fields(self)

  def steps_fn(self, num_epochs: int) -> Optional[
      Callable[[PRNGKey, jax.Array], jax.Array]]:
    """``LocalTraining.steps_fn`` of a run of ``num_epochs`` epochs (None
    without stragglers)."""
    if not self.fraction:
      return None
    return stragglers(self.fraction, num_epochs, self.unit)


def num_stragglers(num_clients: int, fraction: float) -> int:
  """round(fraction * K), half up: stragglers among K participants."""
  # Half up, not Python's round(), which rounds halves to even (2.5 -> 2).
  return int(fraction * num_clients + 0.5)


def straggler_mask(key: PRNGKey, num_clients: int, fraction: float
                   ) -> jax.Array:
  """[K] bool, exactly ``num_stragglers(K, fraction)`` True, uniform."""
  # A random permutation: the first n positions of it straggle, so exactly n
  # clients do (independent coin flips would only give n on average).
  ranks = jnp.argsort(jax.random.uniform(key, (num_clients,)))
  return jnp.zeros((num_clients,), bool).at[ranks].set(
      jnp.arange(num_clients) < num_stragglers(num_clients, fraction))


def straggler_steps(key: PRNGKey, full_steps: jax.Array, fraction: float,
                    num_epochs: int, unit: str = "epochs") -> jax.Array:
  """Per-client step budgets of a round with stragglers.

  Args:
    key: PRNG key of this round.
    full_steps: [K] int, steps of all ``num_epochs`` epochs per client
      (``engine.full_steps``); ``full_steps // num_epochs`` is a client's
      steps per epoch.
    fraction: share of the K participants that straggle, in [0, 1].
    num_epochs: E, local epochs.
    unit: "epochs" (a straggler runs x ~ U{1..E} whole epochs) or "steps"
      (a straggler runs x ~ U{1..full_steps} steps).

  Returns:
    [K] int32: ``full_steps`` for regular clients, the drawn budget for
    stragglers.
  """
  _check(fraction, num_epochs, unit)
  full_steps = jnp.asarray(full_steps, jnp.int32)
  if full_steps.ndim != 1:
    raise ValueError(
        f"full_steps must be a [K] vector, got shape {full_steps.shape}")
  select_key, draw_key = jax.random.split(key)
  is_straggler = straggler_mask(select_key, full_steps.shape[0], fraction)
  if unit == "epochs":
    epochs = jax.random.randint(draw_key, full_steps.shape, 1,
                                num_epochs + 1)
    drawn = epochs * (full_steps // num_epochs)
  else:
    uniform = jax.random.uniform(draw_key, full_steps.shape)
    drawn = 1 + jnp.floor(uniform * full_steps).astype(jnp.int32)
    # float32 rounding can bring uniform * full_steps up to full_steps; the clip
    # keeps the budget in [1, full_steps].
    drawn = jnp.clip(drawn, 1, jnp.maximum(full_steps, 1))
  return jnp.where(is_straggler, drawn, full_steps).astype(jnp.int32)


def stragglers(fraction: float, num_epochs: int, unit: str = "epochs"
               ) -> Callable[[PRNGKey, jax.Array], jax.Array]:
  """``straggler_steps`` as a ``(key, full_steps) -> num_steps`` hook.

  Pass it as ``LocalTraining.steps_fn`` (``fedjax_agg.config``), with the
  same ``num_epochs`` as its ``epochs``.
  """
  _check(fraction, num_epochs, unit)

  def local_steps_fn(key, full_steps):
    return straggler_steps(key, full_steps, fraction, num_epochs, unit)

  return local_steps_fn
