"""Inner Product Manipulation (IPM).

Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by
Inner Product Manipulation", UAI 2020.

Every malicious client sends the same model

  w_mal = g − ε · μ,

μ the mean of the round's honest updates (Δ_k = w_k − g). The paper's
Byzantine gradient is −ε times the mean correct gradient, so that the inner
product of the aggregate with the true gradient turns negative; on updates
(a step against the gradient) the same manipulation is the update −ε · μ.

Interpretations where the paper is silent: μ is the unweighted mean over
the honest real clients of the round (the omniscient attacker), never
including the malicious clients' own updates; a round with no honest
client gives nothing to reverse, and the malicious clients send g.
"""

import jax

from fedjax_agg import checks
from fedjax_agg.attacks._attack import Attack
from fedjax_agg.attacks._honest import honest_stats
from fedjax_agg.attacks._honest import send_to_all

__all__ = ["inner_product"]


def inner_product(epsilon: float = 0.1) -> Attack:
  """IPM: malicious clients send g − ε · μ.

  Args:
    epsilon: ε >= 0; small values hide the attack from distance-based
      defences, large ones reverse the mean.
  """
  checks.check_range("epsilon", epsilon, 0)

  def update(global_params, client_params, cohort):
    stats = honest_stats(global_params, client_params, cohort)
    attacked = jax.tree.map(lambda g, mu: (g - epsilon * mu),
                            global_params, stats.mean)
    return send_to_all(stats, attacked, global_params, client_params)

  return Attack(update=update)
