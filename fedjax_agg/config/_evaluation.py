"""When and on what the global model is evaluated: ``Evaluation``.
Part of ``fedjax_agg.config``.
"""

import dataclasses
from typing import Union


from fedjax_agg import checks
from fedjax_agg.declared import check_fields
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field
from fedjax_agg.evaluation import check_eval_sets as _check_eval_sets


def _at_least(low: int):
  return lambda name, value: checks.check_int(name, value, low)


def _clients(name: str, value) -> None:
  if value == "auto" or isinstance(value, bool):
    return
  if isinstance(value, str):
    raise TypeError(f"{name} must be true, false, \"auto\" or an int >= 1, "
                    f"got {value!r}")
  checks.check_int(name, value, 1)


@dataclasses.dataclass(frozen=True, eq=False)
class Evaluation:
  """When and on what the global model is evaluated.

  Attributes:
    every: evaluate on the test set every this many rounds (and after the
      last round, and before the first).
    clients: also compute the global model's mean loss on every client's
      training data (``client_loss_mean`` / ``client_loss_var``), a pass
      over the whole training set (as costly as several rounds of a small
      cohort): True (at every test evaluation), False, or an int ``n``: at
      the test evaluations whose round is a multiple of ``n``, before the
      first and after the last round. The default "auto" does it before
      the first and after the last round only.
    batch_size: examples per forward pass of the evaluation.
    personalized: at the client evaluations (``clients``), also evaluate
      every client's own model (the local update's ``personalize``: Ditto,
      FedBN) on its held-out split (``data.validation``):
      ``personal_accuracy_mean`` / ``_std`` / ``_p10`` across clients.
    finetune_steps: k > 0: at the client evaluations, also fine-tune the
      global model for k local steps on each client's training data (the
      run's ``LocalTraining``) and evaluate it on the client's held-out
      split (``finetuned_accuracy_*``), next to ``global_accuracy_*``, the
      global model itself on the same splits.
    extra: ``evaluation.EvalSet``s scored at every test evaluation, each
      in a column of its own name (e.g. a backdoor's ``attack_success``).
  """
  # The fields declared with ``spec_field`` are keys of "train", named
  # there by ``key``.
  every: int = spec_field(1, Flag(
      "--eval-every", "evaluate the global model every this many rounds",
      type=int, preset=1), check=_at_least(1), key="eval_every")
  clients: Union[bool, int, str] = spec_field("auto", Flag(
      "--no-client-eval", "skip the global model's loss on every client's "
      "data (by default computed before the first and after the last "
      "round: train.eval_clients \"auto\"; true or an int n in a --config "
      "file for every or every n-th evaluation)", kind="negate"),
      check=_clients, key="eval_clients")
  batch_size: int = 2048
  personalized: bool = spec_field(False, Flag(
      "--personalized", "at the client evaluations, also the accuracy of "
      "each client's personal model on its held-out split (needs --client "
      "fedbn or ditto and --holdout-fraction)", kind="switch"),
      check=checks.check_bool)
  finetune_steps: int = spec_field(0, Flag(
      "--finetune-steps", "at the client evaluations, also the accuracy of "
      "the global model fine-tuned for this many local steps on each "
      "client (needs --holdout-fraction)", type=int), check=_at_least(0))
  extra: tuple = ()

  def __post_init__(self):
    check_fields(self)
    checks.check_int("batch_size", self.batch_size, 1)
    _check_eval_sets(self.extra)

  @property
  def per_client(self) -> bool:
    """Whether client evaluations include held-out accuracies."""
    return self.personalized or self.finetune_steps > 0

  def due(self, round_num: int, num_rounds: int) -> bool:
    """Whether round ``round_num`` (1-based; 0 = before the first) is
    evaluated on the test set."""
    return (round_num == 0 or round_num % self.every == 0
            or round_num == num_rounds)

  def clients_due(self, round_num: int, num_rounds: int) -> bool:
    """Whether that evaluation also covers every client's training data."""
    if isinstance(self.clients, bool):
      return self.clients
    if round_num in (0, num_rounds):
      return True
    return self.clients != "auto" and round_num % self.clients == 0
