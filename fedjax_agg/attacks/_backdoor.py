"""A pixel-pattern backdoor, with optional model-replacement scaling.

Bagdasaryan, Veit, Hua, Estrin, Shmatikov, "How To Backdoor Federated
Learning", AISTATS 2020: malicious clients train on a mix of their clean
examples and examples carrying a trigger, labelled with the attacker's
target class, so that the global model keeps its accuracy on clean inputs
and classifies triggered inputs as the target; Sec. 4 (model replacement)
scales the malicious update, X = gamma (L - G) + G, so that it survives
averaging.

Here (inside the jitted round, malicious rows only):

* Trigger: a square of ``trigger_size`` x ``trigger_size`` pixels one
  pixel from the bottom-right corner of every channel, set to
  ``trigger_value`` (the pixel-pattern backdoor of the paper's image
  experiments; for inputs of one axis, the last ``trigger_size``
  features).
* Poisoned data: the first ceil(``poison_fraction`` n_k) entries of a
  malicious client's index row (its examples in the partition's random
  order) carry the trigger and the ``target`` label; its other examples
  and every honest client's stay clean, as in label flipping. The count is
  exact: the fraction is read as the shortest decimal that gives the float
  (0.3 as 3/10) and the ceiling taken in integer arithmetic, so 0.3 of 100
  examples poisons 30 (float32 gave 31).
* Model replacement: ``boost`` = gamma scales the malicious update
  (``scale_update``); 1 leaves it as trained.
* Attack success (the paper's backdoor accuracy):
  ``backdoor_eval_set(x, y, target=...)`` is the test set with the
  trigger on every example whose label is not the target, labelled with
  the target; a run scores it at every test evaluation in column
  ``attack_success`` (``config.Evaluation.extra``).

Interpretations: ``trigger_value`` None is the largest input value of the
data it stamps (the pooled training inputs in the round, the given test
inputs for ``backdoor_eval_set``: 1.0 on inputs in [0, 1]); pooled
examples shared by a malicious and an honest client of a round
(overlapping partitions only) are poisoned for both.
"""

import fractions
from typing import Optional

import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg.attacks._attack import Attack
from fedjax_agg.attacks._attack import Cohort
from fedjax_agg.attacks._attack import compose
from fedjax_agg.attacks._model_poisoning import scale_update
from fedjax_agg.evaluation import EvalSet
from fedjax_agg.federated import FederatedData

__all__ = ["ATTACK_SUCCESS", "TASKS", "backdoor", "backdoor_eval_set",
           "check_targets", "stamp", "trigger_mask"]

TASKS = ("classification",)
"""The tasks a backdoor is defined for: it relabels triggered examples with
one class, which a sequence task's per-token targets do not have."""


def check_targets(y) -> None:
  """Refuses labels that are not one class per example (a sequence task's
  per-token targets [M, T]), naming the attack and the task."""
  if np.ndim(y) != 1:
    raise ValueError(
        f"attack backdoor: the task's targets have shape "
        f"{tuple(np.shape(y))}, not one class per example; the backdoor "
        "relabels triggered examples with the target class, defined for "
        "classification only (a sequence task, e.g. next-character "
        "prediction, has per-token targets)")

ATTACK_SUCCESS = "attack_success"
"""The history column of a backdoor's attack success (the ``EvalSet`` name of
``backdoor_eval_set``): the fraction of triggered test examples of other
labels that the global model classifies as the target."""


def trigger_mask(example_shape, size: int) -> np.ndarray:
  """Boolean mask of the trigger's pixels for one example."""
  shape = tuple(example_shape)
  if not shape:
    raise ValueError("backdoor: examples must have at least one axis")
  mask = np.zeros(shape, bool)
  if len(shape) == 1:
    if size > shape[0]:
      raise ValueError(f"trigger_size={size} exceeds the {shape[0]} "
                       "features of an example")
    mask[shape[0] - size:] = True
    return mask
  height, width = shape[0], shape[1]
  if size + 1 > min(height, width):
    raise ValueError(f"trigger_size={size} (+ a 1-pixel margin) does not "
                     f"fit in {height} x {width} images")
  mask[height - 1 - size:height - 1, width - 1 - size:width - 1] = True
  return mask


def stamp(x, size: int, value=None):
  """[M, ...] inputs with the trigger (value None: the largest input)."""
  mask = jnp.asarray(trigger_mask(x.shape[1:], size))
  fill = jnp.max(x) if value is None else value
  return jnp.where(mask[None], jnp.asarray(fill, x.dtype), x)


def backdoor(target: int = 0, *, poison_fraction: float = 0.5,
             trigger_size: int = 3, trigger_value: Optional[float] = None,
             boost: float = 1.0) -> Attack:
  """The pixel-pattern backdoor (module docstring).

  Args:
    target: the attacker's label for triggered inputs (an int >= 0 below
      the model's number of classes).
    poison_fraction: in (0, 1], the share of a malicious client's examples
      that carry the trigger.
    trigger_size: >= 1, the side of the square (or the number of trailing
      features).
    trigger_value: the triggered pixels' value; None: the largest input.
    boost: gamma of model replacement (finite, > 0; 1: none).

  Returns:
    An ``Attack`` with a data side (and an update side when ``boost`` is
    not 1); ``backdoor_eval_set(test_x, test_y, target=...)`` builds its
    attack-success set.
  """
  checks.check_int("target", target, 0)
  checks.check_range("poison_fraction", poison_fraction, 0, 1,
                     low_open=True)
  checks.check_int("trigger_size", trigger_size, 1)
  if trigger_value is not None:
    checks.check_range("trigger_value", trigger_value)
  checks.check_range("boost", boost, 0, low_open=True)
  # The decimal the fraction was written as: the double nearest 0.1 lies
  # above 1/10, and its exact product with 10 has the ceiling 2. float()
  # refuses a traced fraction, whose count could only be rounded.
  share = fractions.Fraction(repr(float(poison_fraction)))

  def poison(data: FederatedData, cohort: Cohort) -> FederatedData:
    check_targets(data.y)  # static shapes: refused when traced
    # The partition's index rows are already in random order, so a prefix
    # of each row is a random subset of the client's examples.
    indices = data.client_indices[cohort.client_ids]  # [K, L]
    counts = data.num_examples[cohort.client_ids]
    # ceil(share n) for every count a row can hold (n <= its width L), in
    # integers at trace time: float32 under jit rounds 0.3 * 100 up to
    # 30.000002, whose ceiling is 31.
    width = indices.shape[1]
    table = jnp.asarray(
        [-(-share.numerator * n // share.denominator)
         for n in range(width + 1)], jnp.int32)
    poisoned = table[jnp.clip(counts, 0, width)]
    write = cohort.malicious[:, None] & (
        jnp.arange(indices.shape[1])[None, :] < poisoned[:, None])
    # Rows that must not write are sent out of bounds and dropped.
    targets = jnp.where(write, indices, data.y.shape[0]).reshape(-1)
    value = jnp.max(data.x) if trigger_value is None else trigger_value
    # Every row's examples are stamped (static shapes); the scatter below
    # writes only the malicious prefixes back into the pooled copy.
    stamped = stamp(data.x[indices.reshape(-1)], trigger_size, value)
    return data._replace(
        x=data.x.at[targets].set(stamped, mode="drop"),
        y=data.y.at[targets].set(jnp.asarray(target, data.y.dtype),
                                 mode="drop"))

  attack = Attack(data=poison, max_label=int(target))
  # boost is concrete here (checked above), so a boost of 1 adds no
  # update side at all.
  return attack if boost == 1 else compose(attack, scale_update(boost))


def backdoor_eval_set(x, y, *, target: int = 0, trigger_size: int = 3,
                      trigger_value: Optional[float] = None,
                      **unused) -> EvalSet:
  """The attack-success set of ``backdoor(target, ...)`` on test (x, y):
  the examples whose label is not ``target``, triggered, labelled
  ``target`` (``unused``: the attack's other arguments)."""
  del unused
  x, y = np.asarray(x), np.asarray(y)
  check_targets(y)
  keep = y != target
  if not keep.any():
    raise ValueError(f"backdoor: every test label is the target {target}")
  triggered = np.asarray(stamp(jnp.asarray(x[keep]), trigger_size,
                               trigger_value))
  return EvalSet(ATTACK_SUCCESS, triggered,
                 np.full(int(keep.sum()), target, y.dtype))

