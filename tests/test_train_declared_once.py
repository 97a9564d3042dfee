"""A train option is one declaration: a field of the run object it
configures, declared with ``spec_field`` (default, flag, check). Every
such field, read from the declarations (so a new one is covered with no
change here), is a "train" key with its default, is in ``--help``, is set
by its flag and from JSON, reaches the object it configures, is echoed in
a run's ``config.json`` and is refused naming its key path. A field added
to a run object by a fixture becomes a key the same way."""

import dataclasses
import json
import math

import numpy as np
import pytest

from fedjax_agg import checks
from fedjax_agg import cli
from fedjax_agg import config
from fedjax_agg import fingerprint
from fedjax_agg import spec
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field
from fedjax_agg.options import RunOptions

_FIELDS = dataclasses.fields(spec.TrainSpec)
_ARGS = ["--dataset", "mnist", "--source", "mnist_5k", "--model", "mlp2",
         "--num-clients", "4", "--no-progress"]
_CONFIG = {"dataset": {"name": "mnist", "source": "mnist_5k"},
           "partition": {"name": "iid", "num_clients": 4},
           "model": {"name": "mlp2"},
           "algorithms": {"FedAvg": {"aggregator": "fedavg"}}}
# A valid value other than the default, by the field's type, for a flag.
_FLAG_VALUES = {int: "2", float: "0.5"}


def _valid_other(field):
  """A value of ``field``'s key other than its default, from its flag's
  choices or its type (None where neither tells one)."""
  flag = field.metadata["flags"][0] if field.metadata["flags"] else None
  if flag is not None and flag.choices is not None:
    choices = flag.choices() if callable(flag.choices) else flag.choices
    return next(c for c in choices if c != field.default)
  if isinstance(field.default, bool):
    return not field.default
  if field.default == "auto":  # or true or false
    return False
  if field.default is None or isinstance(field.default, int):
    return 2
  if isinstance(field.default, float):
    return 0.5
  return None


@pytest.fixture(scope="module")
def written(tmp_path_factory):
  """config.json of a 1-round command-line run with every valued flag."""
  out = tmp_path_factory.mktemp("run") / "out"
  # Held-out splits for finetune_steps; SGD for a momentum.
  args = list(_ARGS) + ["--rounds", "1", "--out", str(out),
                        "--holdout-fraction", "0.25"]
  for field in _FIELDS:
    for flag in field.metadata["flags"]:
      if flag.kind == "value" and field.name not in ("rounds", "devices",
                                                     "optimizer"):
        args += [flag.name, str(_valid_other(field))]
  cli.main(args)
  return args, json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("field", _FIELDS, ids=lambda f: f.name)
def test_every_declared_field_is_a_key_a_flag_and_reaches_its_object(
    field, written):
  cls, name = field.metadata["object"], field.metadata["field"]
  assert cls in spec.TRAIN_OBJECTS
  declared = {f.name: f for f in dataclasses.fields(cls)}[name]
  assert declared.metadata["check"] is field.metadata["check"]
  # The key, with its default, in a description and its JSON.
  assert spec.Experiment.from_dict(_CONFIG).to_dict()["train"][
      field.name] == field.default
  # Its flags in --help and mapped onto the key.
  flags = dict((flag.name, key) for key, flag in spec.flags())
  help_text = cli.build_parser().format_help()
  for flag in field.metadata["flags"]:
    assert flags[flag.name] == f"train.{field.name}"
    assert flag.name in help_text
  # From JSON to the object it configures.
  value = _valid_other(field)
  train = spec.TrainSpec(**json.loads(json.dumps({field.name: value})))
  assert train.arguments(cls)[name] == value
  assert getattr(train.make(cls), name) == value
  # Echoed in the run's config.json, as its flag set it.
  args, config_json = written
  assert field.name in config_json["train"]
  for flag in field.metadata["flags"]:
    if flag.kind == "value" and flag.name in args:
      assert (str(config_json["train"][field.name])
              == args[args.index(flag.name) + 1])


@pytest.mark.parametrize("field", _FIELDS, ids=lambda f: f.name)
@pytest.mark.parametrize("bad", ["x", float("nan"), math.inf, 1e300, [1],
                                 -1, None])
def test_a_bad_value_is_refused_naming_its_key(field, bad):
  """Wrong types, NaN, inf, huge and negative values: each refused, by the
  one check, naming the key path, or (where the key takes it) taken."""
  try:
    spec.TrainSpec(**{field.name: bad})
  except spec.ConfigError as error:
    assert error.path == f"train.{field.name}"
    assert f"train.{field.name}" in str(error)
    overridden = {**_CONFIG, "algorithms": {"A": {
        "aggregator": "fedavg", "train": {field.name: bad}}}}
    with pytest.raises(spec.ConfigError) as again:
      spec.Experiment.from_dict(overridden)
    assert again.value.path == f"algorithms.A.train.{field.name}"
    return
  # Taken: a finite number or None (a default: every device, ...) that
  # the object it configures takes too.
  assert bad is None or (isinstance(bad, float) and math.isfinite(bad)), (
      field.name, bad)
  train = spec.TrainSpec(**{field.name: bad})
  cls = field.metadata["object"]
  made = train.make(cls)
  assert getattr(made, field.metadata["field"]) == bad


def test_a_misspelt_choice_names_the_choice_meant():
  with pytest.raises(spec.ConfigError, match="did you mean 'adam'") as e:
    spec.TrainSpec(optimizer="adm")
  assert e.value.path == "train.optimizer"


def test_two_keys_one_object_refuses_together_are_named():
  with pytest.raises(spec.ConfigError, match="momentum is for") as e:
    spec.TrainSpec(optimizer="adam", momentum=0.5)
  assert e.value.path == "train.momentum"
  with pytest.raises(spec.ConfigError) as e:
    spec.Experiment.from_dict({**_CONFIG, "train": {"optimizer": "adam"},
                               "algorithms": {"A": {
                                   "aggregator": "fedavg",
                                   "train": {"momentum": 0.5}}}})
  assert e.value.path == "algorithms.A.train.momentum"


@dataclasses.dataclass(frozen=True)
class _WithProbe(config.LocalTraining):
  """``LocalTraining`` with one more declared field: a new train option."""
  probe: float = spec_field(0.5, Flag("--probe", "a new option", type=float),
                            check=lambda name, value: checks.check_number(
                                name, value, 0, 1))


@dataclasses.dataclass(frozen=True)
class _WithUnchecked(config.LocalTraining):
  """A new train option declared with no check of its own."""
  note: str = spec_field("", Flag("--note", "a free-form note"))


def test_a_field_declared_without_a_check_takes_its_values():
  objects = tuple(_WithUnchecked if cls is config.LocalTraining else cls
                  for cls in spec.TRAIN_OBJECTS)
  section = spec.train_section(objects)
  assert section(note="run A").training().note == "run A"
  assert section().training().note == ""


def test_a_new_declared_field_is_a_key_checked_and_reaching_the_trainer():
  objects = tuple(_WithProbe if cls is config.LocalTraining else cls
                  for cls in spec.TRAIN_OBJECTS)
  section = spec.train_section(objects)
  field = {f.name: f for f in dataclasses.fields(section)}["probe"]
  assert field.default == 0.5
  assert [flag.name for flag in field.metadata["flags"]] == ["--probe"]
  training = section(probe=0.25, learning_rate=0.1).training()
  assert type(training) is _WithProbe
  assert (training.probe, training.learning_rate) == (0.25, 0.1)
  assert section().training().probe == 0.5
  with pytest.raises(spec.ConfigError) as error:
    section(probe=1.5)
  assert error.value.path == "train.probe"
  with pytest.raises(ValueError, match="probe"):
    _WithProbe(probe=math.nan)
  # The section's other keys are those of today's.
  assert set(spec.keys(section)) - {"probe"} == set(spec.keys(spec.TrainSpec))


def test_participation_is_checked_by_one_declaration():
  field = {f.name: f for f in dataclasses.fields(RunOptions)}[
      "participation"]
  assert spec.TRAIN_CHECKS["participation"]
  with pytest.raises(ValueError, match=r"participation must be in \(0, 1\]"):
    RunOptions(num_rounds=1, participation=1.5)
  with pytest.raises(spec.ConfigError,
                     match=r"train.participation must be in \(0, 1\]"):
    spec.TrainSpec(participation=1.5)
  with pytest.raises(ValueError):
    field.metadata["check"]("participation", 0.0)


@pytest.mark.parametrize("section, typo, meant", [
    ("train", "learning_rat", "learning_rate"),
    ("train", "local_epoch", "local_epochs"),
    ("train", "eval_evry", "eval_every"),
    ("systems", "codek", "codec"), ("systems", "deadline", "deadline_s"),
    ("privacy", "delt", "delta"), ("privacy", "acountant", "accountant")])
def test_a_misspelt_key_names_the_key_meant(section, typo, meant):
  with pytest.raises(spec.ConfigError, match=f"did you mean '{meant}'") as e:
    spec.Experiment.from_dict({**_CONFIG, section: {typo: 1}})
  assert e.value.path == f"{section}.{typo}"


def test_the_client_optimizer_keeps_its_checkpointed_name():
  """A checkpoint's fingerprint names the optimizer factory by module and
  qualname: those written before ``config`` was split still resume."""
  described = fingerprint.describe(config.client_optimizer("sgd", 0.9))
  assert described["function"] == (
      "fedjax_agg.config.client_optimizer.<locals>.make")
  assert described["momentum"] == 0.9
  assert described == fingerprint.describe(
      spec.TrainSpec(momentum=0.9).training().optimizer)


@pytest.mark.parametrize("value, error", [
    (True, TypeError), ("0.5", TypeError), ([0.5], TypeError),
    (None, TypeError), (np.array([0.5]), TypeError), (math.nan, ValueError),
    (math.inf, ValueError), (0.0, ValueError), (np.float32(0.5), None),
    (np.array(0.5), None), (1, None)])
def test_check_number_takes_one_number(value, error):
  if error is None:
    checks.check_number("x", value, 0, 1, low_open=True)
  else:
    with pytest.raises(error, match="x must be"):
      checks.check_number("x", value, 0, 1, low_open=True)


def test_sets_is_deprecated():
  with pytest.warns(DeprecationWarning, match="sets"):
    spec_field(1, sets="training.epochs")
