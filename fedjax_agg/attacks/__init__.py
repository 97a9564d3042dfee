"""Simulated malicious clients, inside the jitted round.

An attack is two pieces applied to the malicious rows of a cohort only:

* *who*: an ``Adversaries`` rule, ``fixed(num_clients, fraction)`` (a set
  of client ids drawn once, seeded) or ``per_round(fraction)``
  (floor(fraction * m) of each round's m real participants);
* *what*: an ``Attack`` with a data side (``label_flip``, ``backdoor``:
  Bagdasaryan et al., AISTATS 2020, scored by its attack-success set
  ``backdoor_eval_set`` in ``config.Evaluation.extra``) and/or an update
  side on Δ_k = w_k − g (``sign_flip``, ``scale_update``, ``gaussian``,
  ``free_rider``, ``nonfinite``, ``little_is_enough`` (Baruch et al.,
  NeurIPS 2019), ``inner_product`` (Xie et al., UAI 2020)); ``compose(a,
  b)`` chains two.

``with_attack(attack, adversaries, local_update)`` wraps any local update
(a ``LocalUpdate`` or the engine's train function) and
``local_update(model, training, attack, adversaries)`` wraps the engine's
plain trainer; either goes to ``simulation.run(..., local_update=...)``.
The history then holds the per-client column ``malicious`` (0/1) and the
round's ``num_malicious``. Padding rows are never malicious; honest rows
get exactly the models they would get without the attack.

Registry. ``REGISTRY`` maps the names "label_flip", "sign_flip", "scale",
"gaussian", "free_rider", "nonfinite", "little_is_enough",
"inner_product" and "backdoor" to their factories; ``build(name,
**kwargs)`` builds one.

Example::

  update = attacks.local_update(
      model, training, attacks.build("sign_flip", scale=10.0),
      attacks.fixed(data.num_clients, 0.2, seed=0))
  result = simulation.run(model, data, test, aggregators.fedmedian(),
                          num_rounds=50, local_update=update)
"""

from fedjax_agg.attacks._adversaries import Adversaries
from fedjax_agg.attacks._adversaries import fixed
from fedjax_agg.attacks._adversaries import per_round
from fedjax_agg.attacks._alie import little_is_enough
from fedjax_agg.attacks._alie import little_is_enough_z
from fedjax_agg.attacks._attack import Attack
from fedjax_agg.attacks._backdoor import ATTACK_SUCCESS
from fedjax_agg.attacks._backdoor import backdoor
from fedjax_agg.attacks._backdoor import backdoor_eval_set
from fedjax_agg.attacks._backdoor import TASKS as _BACKDOOR_TASKS
from fedjax_agg.attacks._attack import Cohort
from fedjax_agg.attacks._attack import compose
from fedjax_agg.attacks._attack import per_client
from fedjax_agg.attacks._honest import honest_stats
from fedjax_agg.attacks._honest import HonestStats
from fedjax_agg.attacks._ipm import inner_product
from fedjax_agg.attacks._label_flip import label_flip
from fedjax_agg.attacks._model_poisoning import free_rider
from fedjax_agg.attacks._model_poisoning import gaussian
from fedjax_agg.attacks._model_poisoning import nonfinite
from fedjax_agg.attacks._model_poisoning import scale_update
from fedjax_agg.attacks._model_poisoning import sign_flip
from fedjax_agg.attacks._wrapper import local_update
from fedjax_agg.attacks._wrapper import with_attack
from fedjax_agg.registry import Capabilities
from fedjax_agg.registry import Registry

__all__ = [
    "ATTACK_SUCCESS", "Adversaries", "Attack", "Cohort", "HonestStats",
    "REGISTRY", "TASKS", "backdoor", "backdoor_eval_set", "build",
    "compose", "fixed", "free_rider", "gaussian", "honest_stats",
    "inner_product", "label_flip", "little_is_enough", "little_is_enough_z",
    "local_update", "nonfinite", "per_client", "per_round", "scale_update",
    "sign_flip", "with_attack",
]

REGISTRY = Registry("attack", {
    "label_flip": label_flip,
    "sign_flip": sign_flip,
    "scale": scale_update,
    "gaussian": gaussian,
    "free_rider": free_rider,
    "nonfinite": nonfinite,
    "little_is_enough": little_is_enough,
    "inner_product": inner_product,
    "backdoor": backdoor,
}, capabilities={
    # What each attack is defined for and scored on
    # (registry.Capabilities).
    "backdoor": Capabilities(
        tasks=_BACKDOOR_TASKS,
        eval_sets=lambda x, y, **args: (backdoor_eval_set(x, y, **args),)),
})
"""Every attack factory by the name the CLI uses (``--attack NAME``): name ->
factory of an ``Attack``."""

TASKS = {name: REGISTRY.capabilities(name).tasks for name in REGISTRY
         if REGISTRY.capabilities(name).tasks is not None}
"""The tasks (``NaturalFederation.task``) a built-in attack is limited to,
by name (a view of each registry line's ``Capabilities.tasks``); an attack
not listed applies to every task."""


def build(name: str, **kwargs) -> Attack:
  """Builds the registered attack ``name`` with ``kwargs`` (ValueError
  for an unknown name, TypeError for an argument it does not take)."""
  return REGISTRY.build(name, **kwargs)
