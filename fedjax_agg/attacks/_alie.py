"""A Little Is Enough (ALIE).

Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses For
Distributed Learning", NeurIPS 2019.

Every malicious client sends the same model

  w_mal = g + μ − z · σ,

where μ and σ are the coordinate-wise mean and standard deviation of the
round's honest updates (Δ_k = w_k − g): the paper shifts every
coordinate z standard deviations away from the honest mean, little enough
to pass for honest; here the shift is applied to the update, towards −σ.

z. By default the paper's z_max: with n real participants of the round
and m malicious ones, the attackers need

  s = floor(n / 2 + 1) − m

honest clients to side with them (so that the malicious value lies within
the range a majority-based defence accepts), and

  z = Φ^{-1}((n − s) / n),

Φ the standard normal CDF (``jax.scipy.stats.norm.ppf``); n and m are
counted in every round, inside the jitted round.

Interpretations where the paper is silent:
* the statistics are those of the honest clients (the omniscient attacker;
  the paper's attackers estimate the same distribution from their own
  correct gradients), never of the malicious clients' own updates;
* σ is the population standard deviation (divisor: the honest count);
* when m >= floor(n / 2 + 1) the formula's s is <= 0 (the attackers are a
  majority and need nobody); s is then taken as 1, z = Φ^{-1}((n − 1) / n),
  the largest finite value of the formula;
* a round with no honest client gives nothing to imitate: the malicious
  clients send g.
"""

from typing import Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg.attacks._attack import Attack
from fedjax_agg.attacks._honest import honest_stats
from fedjax_agg.attacks._honest import send_to_all

__all__ = ["little_is_enough", "little_is_enough_z"]


def little_is_enough_z(num_real, num_malicious) -> jax.Array:
  """The paper's z_max for n real and m malicious clients; -> [] float32.

  Args:
    num_real: n, the round's real participants (>= 1), int or traced.
    num_malicious: m, the malicious ones among them.
  """
  n = jnp.asarray(num_real, jnp.float32)
  m = jnp.asarray(num_malicious, jnp.float32)
  # Honest clients the attackers must win over; at least 1 (docstring).
  s = jnp.maximum(jnp.floor(n / 2 + 1) - m, 1.0)
  # s >= 1 keeps the quantile below 1, so z stays finite; the floor on n
  # only guards an empty cohort, whose malicious rows do not exist.
  return jax.scipy.stats.norm.ppf((n - s) / jnp.maximum(n, 1.0))


def little_is_enough(z: Optional[float] = None) -> Attack:
  """ALIE: malicious clients send g + μ − z · σ (module docstring).

  Args:
    z: the number of standard deviations; None: the paper's z_max,
      computed per round from its n and m.
  """
  if z is not None:
    checks.check_range("z", z)

  def update(global_params, client_params, cohort):
    stats = honest_stats(global_params, client_params, cohort)
    if z is None:
      factor = little_is_enough_z(jnp.sum(cohort.mask > 0),
                                  jnp.sum(cohort.malicious))
    else:
      factor = jnp.asarray(z, jnp.float32)
    attacked = jax.tree.map(
        lambda g, mu, sigma: (g + mu - factor * sigma),
        global_params, stats.mean, stats.std)
    return send_to_all(stats, attacked, global_params, client_params)

  return Attack(update=update)
