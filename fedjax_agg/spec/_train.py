"""The "train" section: what every round does, made of the run objects'
own declarations.

A "train" key is a field of the object it configures, declared there once
with its default, flag and check (``declared.spec_field``, its ``key``
where the flat key differs from the field's name): ``options.RunOptions``
(``rounds``, ``participation``), ``config.LocalTraining``,
``config.ClientOptimizer``, ``stragglers.Stragglers``,
``config.Evaluation`` and ``config.Execution``. ``TrainSpec`` is the flat
section of every such field (``TRAIN_OBJECTS``, in that order); it checks
each key with the field's own check, naming the key path, and makes each
object from its keys (``TrainSpec.make``), so a new train option is one
declared field of its object.
"""

import dataclasses
from typing import Any
import warnings

from fedjax_agg import config as config_lib
from fedjax_agg import declared
from fedjax_agg import stragglers
from fedjax_agg.options import RunOptions
from fedjax_agg.spec import _values as v

TRAIN_OBJECTS = (RunOptions, config_lib.LocalTraining,
                 config_lib.ClientOptimizer, stragglers.Stragglers,
                 config_lib.Evaluation, config_lib.Execution)
"""The objects whose declared fields are the "train" keys, in the
section's order."""
RUN_OBJECTS = ("options", "training", "execution", "evaluation")
"""The parts of the deprecated ``TrainSpec.run_objects``."""


def _checked(field: dataclasses.Field):
  """The declared check of ``field`` as ``check(path, value)``, raising a
  ``ConfigError`` / ``ConfigTypeError`` at ``path``."""
  check = field.metadata.get("check")
  if check is None:  # a field declared with no check takes any value
    return lambda path, value: None
  return lambda path, value: v._checked(  # pylint: disable=protected-access
      path, check, value)


class _TrainSection:
  """What ``TrainSpec`` does besides holding its keys."""

  def __post_init__(self):
    v.plain_fields(self)
    for f in dataclasses.fields(self):
      _checked(f)(f"train.{f.name}", getattr(self, f.name))
    for cls in self.objects:
      if not issubclass(cls, RunOptions):
        self._check_together(cls)

  def _check_together(self, cls) -> None:
    """What ``cls`` refuses of two keys together (Adam with a momentum),
    named by the first key, in the section's order, that the object
    refuses with the keys given before it."""
    try:
      self.make(cls)
      return
    except (TypeError, ValueError):
      pass
    # Keys are added one at a time in the section's order; the first whose
    # addition makes the object refuse is the one named. Defaults are valid
    # together, so only keys that differ from them can be at fault.
    given = {}
    for f in dataclasses.fields(self):
      if f.metadata["object"] is cls and getattr(self, f.name) != f.default:
        given[f.metadata["field"]] = getattr(self, f.name)
        v.built(f"train.{f.name}", cls, **given)
    v.built("train", self.make, cls)

  def _object(self, cls):
    """The section's object that is ``cls`` or a subclass of it."""
    return next(obj for obj in self.objects if issubclass(obj, cls))

  def arguments(self, cls) -> dict[str, Any]:
    """``cls``'s fields as these keys set them (one of the section's
    ``objects``, or a class one of them subclasses)."""
    cls = self._object(cls)
    return {f.metadata["field"]: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.metadata["object"] is cls}

  def make(self, cls, **given):
    """``cls`` (one of ``objects``) with these keys' values and ``given``
    (the fields no key sets, or a value in place of a key's)."""
    return self._object(cls)(**{**self.arguments(cls), **given})

  def training(self, objective=None) -> config_lib.LocalTraining:
    """The clients' ``config.LocalTraining``, with its optimizer and
    step budgets made from their keys, and ``objective``."""
    optimizer = self.make(config_lib.ClientOptimizer).factory()
    steps_fn = self.make(stragglers.Stragglers).steps_fn(
        self.arguments(config_lib.LocalTraining)["epochs"])
    return self.make(config_lib.LocalTraining, optimizer=optimizer,
                     steps_fn=steps_fn, objective=objective)

  def run_objects(self, objective=None) -> dict[str, dict[str, Any]]:
    """Deprecated: ``training(objective)``, ``make(config.Execution)``,
    ``make(config.Evaluation)`` and ``arguments(RunOptions)``."""
    warnings.warn("TrainSpec.run_objects() is deprecated: use training(), "
                  "make(cls) and arguments(cls)", DeprecationWarning, 2)
    training = self.training(objective)
    kept = {"optimizer": training.optimizer, "objective": objective}
    if training.steps_fn is not None:
      kept["steps_fn"] = training.steps_fn
    return {"options": self.arguments(RunOptions),
            "training": {**self.arguments(config_lib.LocalTraining), **kept},
            "execution": self.arguments(config_lib.Execution),
            "evaluation": self.arguments(config_lib.Evaluation)}


def train_section(objects=TRAIN_OBJECTS, name: str = "TrainSpec"):
  """The flat "train" section of ``objects``: a frozen dataclass with a
  field per declared field of each (``declared.spec_field``), named by
  its config key, holding its default (the config's), flags and check,
  and the object and field it sets. Run objects that subclass one of
  ``TRAIN_OBJECTS`` stand in for it."""
  fields = []
  for cls in objects:
    for f in dataclasses.fields(cls):
      if declared.is_declared(f):
        metadata = {**f.metadata, "object": cls, "field": f.name}
        # Named by its config key (``local_epochs``, not ``epochs``); the
        # metadata keeps which object and field the key sets.
        fields.append((declared.config_key(f), f.type, dataclasses.field(
            default=declared.config_default(f), metadata=metadata)))
  return dataclasses.make_dataclass(
      name, fields, bases=(_TrainSection,), frozen=True, namespace={
          "__module__": __name__, "objects": tuple(objects),
          "__doc__": """"train": what every round does (an algorithm may
          override any key): one key per declared field of its
          ``objects``, e.g. ``TrainSpec(rounds=20, participation=0.1,
          learning_rate=0.05)``."""})


TrainSpec = train_section()


TRAIN_CHECKS = {f.name: _checked(f) for f in dataclasses.fields(TrainSpec)}
"""Train key -> ``check(path, value)``, the check of that key of "train" and
of an algorithm's train overrides (raises naming ``path``)."""


def check_train(path: str, train) -> None:
  """A "train" mapping (an algorithm's overrides): known keys, each value
  of its type and range."""
  v.keys_in(path, train, TRAIN_CHECKS)
  for key, value in train.items():
    TRAIN_CHECKS[key](f"{path}.{key}", value)
