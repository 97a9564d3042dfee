"""The "train" section: what every round does, and the run objects it
builds.

Each field states, beside its default and its flag, its value check
(``check``) and the field of the run object it sets (``sets``: one of
``RunOptions``' own, ``config.LocalTraining``, ``config.Execution`` or
``config.Evaluation``). ``TrainSpec.run_objects`` reads those to build the
objects, so that an option of those objects is added in two places: its
field on the object (``fedjax_agg.config``) and its field here. A field
that sets no single object field (the client optimizer's three, the
stragglers' two) is built in ``run_objects`` by name.
"""

import dataclasses
from typing import Any, Optional, Union

from fedjax_agg import config as config_lib
from fedjax_agg import stragglers
from fedjax_agg.spec import _values as v
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field as _field

_UNITS = lambda: stragglers.UNITS
_PRECISIONS = lambda: config_lib.MATMUL_PRECISIONS
_OPTIMIZERS = lambda: config_lib.OPTIMIZERS

RUN_OBJECTS = ("options", "training", "execution", "evaluation")
"""What a train field may set ("object.field"): ``RunOptions``' own
fields, ``LocalTraining``, ``Execution``, ``Evaluation``."""


def _at_least(low: int):
  return lambda path, value: v.integer(path, value, low)


def _optional_at_least(low: int):
  return lambda path, value: v.optional_integer(path, value, low)


def _in(names):
  return lambda path, value: v.name_in(path, value, names())


def _eval_clients(path: str, value) -> None:
  if value == "auto" or isinstance(value, bool):
    return
  v.integer(path, value, 1)


def _compute_losses(path: str, value) -> None:
  if not (isinstance(value, bool) or value == "auto"):
    raise v.ConfigTypeError(path, f"{path} must be true, false or \"auto\", "
                            f"got {value!r}")


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """"train": what every round does (an algorithm may override any)."""
  rounds: int = _field(10, Flag("--rounds", "R: rounds", type=int,
                                preset=10),
                       check=_at_least(0), sets="options.num_rounds")
  participation: float = _field(1.0, Flag(
      "--participation", "C: fraction of clients per round", type=float,
      preset=0.1), check=lambda path, value: v.number(
          path, value, 0, 1, low_open=True), sets="options.participation")
  local_epochs: int = _field(1, Flag("--epochs", "E: local epochs",
                                     type=int, preset=1),
                             check=_at_least(1), sets="training.epochs")
  batch_size: int = _field(16, Flag("--batch-size", "B: local batch size",
                                    type=int, preset=16),
                           check=_at_least(1), sets="training.batch_size")
  learning_rate: float = _field(0.01, Flag(
      "--lr", "client learning rate", type=float, preset=0.05),
      check=lambda path, value: v.number(path, value, 0, low_open=True),
      sets="training.learning_rate")
  momentum: float = _field(0.0, Flag("--momentum", "client SGD momentum",
                                     type=float, preset=0.0),
                           check=lambda path, value: v.number(
                               path, value, 0, 1, high_open=True))
  stragglers: float = _field(0.0, Flag(
      "--stragglers", "fraction of each cohort that straggles", type=float,
      preset=0.0), check=lambda path, value: v.number(path, value, 0, 1))
  straggler_unit: str = _field("epochs", Flag(
      "--straggler-unit", "what a straggler's share of its work is drawn "
      "in: whole epochs x ~ U{1..E} (FedProx's setting) or steps",
      choices=_UNITS), check=_in(_UNITS))
  eval_every: int = _field(1, Flag(
      "--eval-every", "evaluate the global model every this many rounds",
      type=int, preset=1), check=_at_least(1), sets="evaluation.every")
  eval_clients: Union[bool, int, str] = _field("auto", Flag(
      "--no-client-eval", "skip the global model's loss on every client's "
      "data (by default computed before the first and after the last "
      "round: train.eval_clients \"auto\"; true or an int n in a --config "
      "file for every or every n-th evaluation)", kind="negate"),
      check=_eval_clients, sets="evaluation.clients")
  clients_per_step: Optional[int] = _field(None, Flag(
      "--clients-per-step", "clients trained side by side (vmap width)",
      type=int), check=_optional_at_least(1),
      sets="execution.clients_per_step")
  compute_losses: Union[bool, str] = _field(
      "auto", check=_compute_losses, sets="training.compute_losses")
  matmul_precision: str = _field("highest", Flag(
      "--matmul-precision", "precision of local training's matrix products: "
      "highest (full float32 on every backend) or default (the backend's: "
      "TF32 on an NVIDIA GPU, bfloat16 on a TPU)",
      choices=_PRECISIONS), check=_in(_PRECISIONS),
      sets="training.matmul_precision")
  devices: Optional[int] = _field(None, Flag(
      "--devices", "shard each round's clients over this many devices "
      "(default: all devices of the job; 1: unsharded)", type=int),
      check=_optional_at_least(1), sets="execution.devices")
  optimizer: str = _field("sgd", Flag(
      "--optimizer", "client optimizer",
      choices=_OPTIMIZERS, preset="sgd"), check=_in(_OPTIMIZERS))
  weight_decay: float = _field(0.0, Flag(
      "--weight-decay", "client L2 weight decay (parameters only, not "
      "BatchNorm statistics)", type=float, preset=0.0),
      check=lambda path, value: v.number(path, value, 0))
  personalized: bool = _field(False, Flag(
      "--personalized", "at the client evaluations, also the accuracy of "
      "each client's personal model on its held-out split (needs --client "
      "fedbn or ditto and --holdout-fraction)", kind="switch"),
      check=v.boolean, sets="evaluation.personalized")
  finetune_steps: int = _field(0, Flag(
      "--finetune-steps", "at the client evaluations, also the accuracy of "
      "the global model fine-tuned for this many local steps on each "
      "client (needs --holdout-fraction)", type=int),
      check=_at_least(0), sets="evaluation.finetune_steps")

  def __post_init__(self):
    v.plain_fields(self)
    for f in dataclasses.fields(self):
      f.metadata["check"](f"train.{f.name}", getattr(self, f.name))

  def run_objects(self, objective=None) -> dict[str, dict[str, Any]]:
    """The keyword arguments this training gives each run object:
    ``{"options": RunOptions', "training": LocalTraining's (with
    ``objective``), "execution": Execution's, "evaluation":
    Evaluation's}``."""
    built = {name: {} for name in RUN_OBJECTS}
    for f in dataclasses.fields(self):
      if f.metadata["sets"] is not None:
        target, name = f.metadata["sets"].split(".")
        built[target][name] = getattr(self, f.name)
    # The fields that set no single object field.
    training = built["training"]
    training["optimizer"] = config_lib.client_optimizer(
        self.optimizer, self.momentum, self.weight_decay)
    if self.stragglers:
      training["steps_fn"] = stragglers.stragglers(
          self.stragglers, self.local_epochs, self.straggler_unit)
    training["objective"] = objective
    return built


TRAIN_CHECKS = {f.name: f.metadata["check"]
                for f in dataclasses.fields(TrainSpec)}
"""Train key -> ``check(path, value)``, the check of that key of "train" and
of an algorithm's train overrides (raises naming ``path``)."""


def check_train(path: str, train) -> None:
  """A "train" mapping (an algorithm's overrides): known keys, each value
  of its type and range."""
  v.keys_in(path, train, TRAIN_CHECKS)
  for key, value in train.items():
    TRAIN_CHECKS[key](f"{path}.{key}", value)
