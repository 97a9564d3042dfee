"""A systems or privacy option is declared once, on ``config.Systems`` or
``config.Privacy``: the description's "systems" and "privacy" sections
(``spec.SystemsSpec``, ``spec.PrivacySpec``) are those classes and add no
field, so each field's default, flag and check reach the config keys, the
command line, ``--help`` and ``config.json`` with no second declaration;
a field with a flag sets it from the command line, and a bad value is
refused naming its key."""

import dataclasses

import pytest

from fedjax_agg import cli
from fedjax_agg import config
from fedjax_agg import spec

_SECTIONS = {"systems": (spec.SystemsSpec, config.Systems),
             "privacy": (spec.PrivacySpec, config.Privacy)}
_FIELDS = [(section, field) for section, (_, run_object) in _SECTIONS.items()
           for field in dataclasses.fields(run_object)]
_CONFIG = {"dataset": {"name": "mnist", "source": "mnist_5k"},
           "partition": {"name": "iid", "num_clients": 4},
           "model": {"name": "mlp2"},
           "algorithms": {"DP": {"aggregator": "dp_fedavg"}}}


@pytest.mark.parametrize("section", _SECTIONS)
def test_the_section_is_the_run_object_and_adds_no_field(section):
  cls, run_object = _SECTIONS[section]
  assert issubclass(cls, run_object)
  assert dataclasses.fields(cls) == dataclasses.fields(run_object)
  assert "__annotations__" not in vars(cls)
  assert spec.SystemsSpec().run_object() == config.Systems()


@pytest.mark.parametrize("section, field", _FIELDS,
                         ids=lambda item: getattr(item, "name", item))
def test_every_field_is_a_key_with_its_default_and_flag(section, field):
  cls, run_object = _SECTIONS[section]
  assert field.name in spec.keys(cls)
  written = spec.Experiment.from_dict({**_CONFIG, section: {}}).to_dict()
  default = getattr(run_object(), field.name)
  assert written[section].get(field.name, default) == default
  flags = dict((flag.name, key) for key, flag in spec.flags())
  help_text = cli.build_parser().format_help()
  for flag in field.metadata.get("flags", ()):
    assert flags[flag.name] == f"{section}.{field.name}"
    assert flag.name in help_text


def test_a_stated_noise_multiplier_must_be_the_rules():
  config_ = {**_CONFIG, "algorithms": {"DP": {
      "aggregator": "dp_fedavg", "aggregator_args": {"noise_multiplier": 1.1}}}}
  agreed = spec.Experiment.from_dict(
      {**config_, "privacy": {"noise_multiplier": 1.1}})
  assert agreed.privacy_of("DP").noise_multiplier == 1.1
  with pytest.raises(spec.ConfigError, match="set it there") as error:
    spec.Experiment.from_dict({**config_,
                               "privacy": {"noise_multiplier": 0.5}})
  assert error.value.path == "privacy.noise_multiplier"


def test_a_flag_sets_its_field_and_a_bad_value_is_named(tmp_path, capsys):
  args = ["--dataset", "mnist", "--source", "mnist_5k", "--model", "mlp2",
          "--num-clients", "4", "--rounds", "0", "--no-progress",
          "--out", str(tmp_path / "run")]
  with pytest.raises(SystemExit):
    cli.main(args + ["--secagg-bits", "40"])
  assert "systems.secagg_bits" in capsys.readouterr().err
  assert not (tmp_path / "run").exists()


def test_the_early_stopping_section_is_the_callbacks_arguments():
  # Its keys are loop.EarlyStopping's arguments with the callback's own
  # defaults, so the two cannot disagree.
  import inspect  # pylint: disable=g-import-not-at-top
  from fedjax_agg import loop  # pylint: disable=g-import-not-at-top
  parameters = inspect.signature(loop.EarlyStopping).parameters
  fields = {f.name: f.default
            for f in dataclasses.fields(spec.EarlyStoppingSpec)}
  assert fields == {name: p.default for name, p in parameters.items()}
