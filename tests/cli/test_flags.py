"""The command line's flags: --help, --list, and the config they give,
alone or over a --config file.
"""

import re

import pytest

from fedjax_agg import cli
from fedjax_agg import spec
from tests.cli._util import _config_file


def test_help_lists_names_and_defaults(capsys):
  with pytest.raises(SystemExit) as raised:
    cli.main(["--help"])
  assert raised.value.code == 0
  text = " ".join(capsys.readouterr().out.split())
  for name in ("fedadp", "fedlayerwise", "fedprox", "fedlap", "mixed_iid",
               "dirichlet", "cnn_mcmahan", "vgg11", "fashion_mnist",
               "cifar100", "mnist_5k"):
    assert name in text, name
  for default in ("(default: 0.05)", "(default: fedavg)", "(default: iid)",
                  "(default: 10)", "(default: results/run)"):
    assert default in text, default
  # The other command is named where users look first.
  assert "python -m fedjax_agg report RUN_DIR" in text
  for flag in ("--allow-import MODULE", "--keep PATH", "--allow-subset"):
    assert flag in text, flag


def test_list_prints_names_with_arguments_and_defaults(capsys):
  expected = {"aggregators": "fedadp(alpha=5.0,",
              "objectives": "fedprox(mu=0.01)",
              "partitions": "shards(shards_per_client=2)",
              "models": "mlp2(",
              "datasets": "mnist(source='auto',"}
  for what, line in expected.items():
    assert cli.main(["--list", what]) == 0
    out = capsys.readouterr().out
    assert any(row.startswith(line) for row in out.splitlines()), out
  # mixed_iid's num_iid has no default: listed bare.
  cli.main(["--list", "partitions"])
  assert "mixed_iid(num_iid, " in capsys.readouterr().out


def test_config_file_with_flags_overriding(tmp_path):
  path = _config_file(tmp_path)
  # --rounds 10 is the flag's default: given, it still overrides the file.
  args, given = cli.parse(["--config", path, "--rounds", "10",
                           "--agg-arg", "smoothing=round"])
  run, algorithm = cli.resolve(args, given)
  assert algorithm == "FedAdp"
  assert (run.train.rounds, run.train.learning_rate,
          run.train.participation) == (10, 0.1, 0.5)
  assert run.algorithms["FedAdp"].aggregator_args == {
      "alpha": 2.0, "smoothing": "round"}
  assert run.seeds == [3] and run.model.args == {"hidden": 16}
  # Another aggregator drops the file's arguments of the old one.
  args, given = cli.parse(["--config", path, "--aggregator", "fedavg"])
  run, _ = cli.resolve(args, given)
  assert run.algorithms["FedAdp"] == spec.AlgorithmSpec("fedavg")
  # Several algorithms: --algorithm picks one.
  path = _config_file(tmp_path, algorithms={
      "A": {"aggregator": "fedavg"}, "B": {"aggregator": "fedadp"}})
  run, algorithm = cli.resolve(*cli.parse(["--config", path,
                                           "--algorithm", "B"]))
  assert algorithm == "B" and list(run.algorithms) == ["B"]


def test_flags_alone_give_the_former_config():
  args, given = cli.parse(["--aggregator", "fedadp", "--agg-arg",
                           "alpha=2", "--conv-impl", "xla"])
  run, algorithm = cli.resolve(args, given)
  assert algorithm == "fedadp" and run.name == "cli"
  assert run.algorithms == {"fedadp": spec.AlgorithmSpec(
      "fedadp", aggregator_args={"alpha": 2}, objective="cross_entropy")}
  assert run.model == spec.ModelSpec("cnn_mcmahan",
                                     args={"conv_impl": "xla"})
  assert run.train.participation == 0.1 and run.seeds == [0]


def test_help_is_grouped_by_section_with_one_default_each(capsys):
  with pytest.raises(SystemExit):
    cli.main(["--help"])
  text = capsys.readouterr().out
  titles = [line[:-1] for line in text.splitlines()
            if line and not line.startswith(" ") and line.endswith(":")]
  for title in ("data", "partition", "model", "algorithm", "training",
                "attack", "privacy", "systems", "execution and output"):
    assert title in titles, titles
  # One default per flag: the help's own, or argparse's, never both.
  entries = re.split(r"\n  (?=-)", text)
  assert not [e for e in entries if len(re.findall(r"\(default", e)) > 1]
  # Every --list it points to works.
  for what in set(re.findall(r"--list ([a-z]+)", text)):
    assert cli.describe(what), what


def test_first_class_dp_flags_set_the_rules_arguments():
  run, name = cli.resolve(*cli.parse([
      "--aggregator", "dp_fedavg", "--dp-noise-multiplier", "0.7",
      "--dp-clip-norm", "0.5"]))
  assert run.algorithms[name].aggregator_args == {
      "noise_multiplier": 0.7, "clip_norm": 0.5}
