"""A mistyped or misplaced name gets a hint: the registry it belongs to
(``--aggregator FedProx``: an objective) or the closest accepted names,
on the command line and in a config."""

import pytest

from fedjax_agg import experiment
from fedjax_agg import spec
from fedjax_agg.cli import _flags
from tests.experiment.test_runs import MNIST_5K


@pytest.mark.parametrize("flags, hint", [
    (["--aggregator", "FedProx"], "fedprox is an objective: --objective "
     "fedprox"),
    (["--objective", "fedavg"], "fedavg is an aggregator: --aggregator "
     "fedavg"),
    (["--aggregator", "FEDAVG"], "did you mean fedavg?"),
    (["--model", "mlp"], "did you mean mlp2?"),
    (["--partition", "dirichlett"], "did you mean dirichlet"),
    (["--client", "fedprox"], "fedprox is an objective"),
])
def test_the_command_line_hints_at_the_name_meant(flags, hint):
  with pytest.raises(_flags.UsageError) as raised:
    _flags.build_parser().parse_args(flags)
  assert raised.value.message.startswith(f"argument {flags[0]}: invalid "
                                         "choice"), raised.value.message
  assert hint in raised.value.message, raised.value.message


def test_no_hint_where_nothing_is_close():
  with pytest.raises(_flags.UsageError) as raised:
    _flags.build_parser().parse_args(["--aggregator", "zzz"])
  assert "did you mean" not in raised.value.message
  assert _flags.near_miss("not argparse's message",
                          _flags.build_parser()) == ""


@pytest.mark.parametrize("override, hint", [
    ({"train": {"learning_rat": 0.1}}, "did you mean 'learning_rate'?"),
    ({"algorithms": {"A": {"aggregator": "fedavgg"}}},
     "did you mean 'fedavg'"),
    ({"partition": {"name": "IID", "num_clients": 4}},
     "did you mean 'iid'?"),
])
def test_a_config_hints_at_the_key_or_name_meant(override, hint):
  with pytest.raises(spec.ConfigError, match="") as raised:
    experiment.check_config(experiment.override(MNIST_5K, override))
  assert hint in str(raised.value), str(raised.value)


def test_a_refusal_is_one_line(tmp_path, capsys):
  """No config echo (or anything else) before the error line."""
  from fedjax_agg import cli  # pylint: disable=g-import-not-at-top
  from tests.cli.test_cli import TINY  # pylint: disable=g-import-not-at-top
  out = tmp_path / "run"
  cli.main(TINY + ["--out", str(out)])
  assert capsys.readouterr().err.count("config: ") == 1
  for flags in (["--out", str(out)],  # a reused folder
                ["--out", str(tmp_path / "r2"), "--dataset", "cifar10",
                 "--data-dir", str(tmp_path / "none"), "--source",
                 "files"]):  # a missing dataset
    with pytest.raises(SystemExit) as raised:
      cli.main(TINY + flags)
    assert raised.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
