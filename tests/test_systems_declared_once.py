"""A systems option is declared once, on ``config.Systems``: the
description's "systems" section (``spec.SystemsSpec``) is that class and
adds no field, so each field's default, flag and check reach the config
keys, the command line, ``--help`` and ``config.json`` with no second
declaration; a field with a flag sets it from the command line."""

import dataclasses

import pytest

from fedjax_agg import cli
from fedjax_agg import config
from fedjax_agg import spec

_FIELDS = dataclasses.fields(config.Systems)


def test_the_section_is_the_run_object_and_adds_no_field():
  assert issubclass(spec.SystemsSpec, config.Systems)
  assert dataclasses.fields(spec.SystemsSpec) == _FIELDS
  assert "__annotations__" not in vars(spec.SystemsSpec)
  assert spec.SystemsSpec().run_object() == config.Systems()


@pytest.mark.parametrize("field", _FIELDS, ids=lambda f: f.name)
def test_every_field_is_a_key_with_its_default_and_flag(field):
  assert field.name in spec.keys(spec.SystemsSpec)
  written = spec.Experiment.from_dict({
      "dataset": {"name": "mnist", "source": "mnist_5k"},
      "partition": {"name": "iid", "num_clients": 4},
      "model": {"name": "mlp2"},
      "algorithms": {"FedAvg": {"aggregator": "fedavg"}},
      "systems": {}}).to_dict()["systems"]
  default = getattr(config.Systems(), field.name)
  assert written.get(field.name, default) == default
  flags = dict((flag.name, key) for key, flag in spec.flags())
  help_text = cli.build_parser().format_help()
  for flag in field.metadata.get("flags", ()):
    assert flags[flag.name] == f"systems.{field.name}"
    assert flag.name in help_text


def test_a_flag_sets_its_field_and_a_bad_value_is_named(tmp_path, capsys):
  args = ["--dataset", "mnist", "--source", "mnist_5k", "--model", "mlp2",
          "--num-clients", "4", "--rounds", "0", "--no-progress",
          "--out", str(tmp_path / "run")]
  with pytest.raises(SystemExit):
    cli.main(args + ["--secagg-bits", "40"])
  assert "systems.secagg_bits" in capsys.readouterr().err
  assert not (tmp_path / "run").exists()
