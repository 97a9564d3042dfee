"""A user's rule runs by name everywhere a built-in one does: registered
in Python, or named ``module:factory`` in a config or on the command line;
the conformance kit checks it when it is registered."""

import json
import sys

import jax
import jax.numpy as jnp
import pytest

from fedjax_agg import aggregators
from fedjax_agg import cli
from fedjax_agg import experiment
from tests.cli.test_cli import TINY
from tests.cli.test_cli import _error_line
from tests.experiment.test_runs import MNIST_5K

RULES = '''
from fedjax_agg import aggregators
from fedjax_agg import registry

@registry.declare("aggregator")
def uniform_mean(weighting="uniform"):
  return aggregators.fedavg(weighting=weighting)

def undeclared(weighting="uniform"):
  return aggregators.fedavg(weighting=weighting)
'''


def _uniform_mean():
  return aggregators.fedavg(weighting="uniform")


def _nan_rule():
  rule = aggregators.fedavg()
  return rule._replace(aggregate=lambda g, c, i, s: (
      jax.tree.map(lambda x: x * jnp.nan, g), s, {}))


@pytest.fixture
def registered():
  yield aggregators.register("user_uniform_mean", _uniform_mean,
                             replace=True)
  aggregators.REGISTRY._entries.pop("user_uniform_mean", None)  # pylint: disable=protected-access


def test_a_registered_rule_runs_from_a_config(registered, tmp_path):
  del registered
  config = experiment.override(MNIST_5K, {"algorithms": {
      "Mine": {"aggregator": "user_uniform_mean"},
      "Same": {"aggregator": "fedavg",
               "aggregator_args": {"weighting": "uniform"}}}})
  summary = experiment.run_config(config, str(tmp_path), progress=False)
  assert summary["Mine"] == summary["Same"]


def test_registration_refuses_what_it_cannot_run():
  with pytest.raises(ValueError, match="fails the conformance kit.*finite"):
    aggregators.register("user_nan", _nan_rule)
  assert "user_nan" not in aggregators.REGISTRY.names
  with pytest.raises(ValueError, match="'fedavg' is built in"):
    aggregators.register("fedavg", _uniform_mean, replace=True)
  with pytest.raises(ValueError, match="have none"):
    aggregators.register("user_needs", lambda scale: _uniform_mean())
  with pytest.raises(TypeError, match="factory must be callable"):
    aggregators.register("user_nothing", 3)


def test_module_colon_factory_on_the_command_line(tmp_path, monkeypatch,
                                                  capsys):
  (tmp_path / "user_rules_mod.py").write_text(RULES)
  monkeypatch.syspath_prepend(str(tmp_path))
  out = tmp_path / "run"
  # Not allowed: refused before the module is imported.
  line = _error_line(capsys, TINY + ["--out", str(out), "--aggregator",
                                     "user_rules_mod:uniform_mean"])
  assert line.startswith("error: --aggregator"), line
  assert "--allow-import user_rules_mod" in line, line
  assert "user_rules_mod" not in sys.modules and not out.exists()
  # Allowed but not declared as an aggregator factory: refused.
  line = _error_line(capsys, TINY + [
      "--out", str(out), "--aggregator", "user_rules_mod:undeclared",
      "--allow-import", "user_rules_mod"])
  assert "not declared as a factory of kind 'aggregator'" in line, line
  assert not out.exists()
  try:
    cli.main(TINY + ["--out", str(out), "--aggregator",
                     "user_rules_mod:uniform_mean",
                     "--allow-import", "user_rules_mod"])
  finally:
    aggregators.REGISTRY._entries.pop("user_rules_mod:uniform_mean", None)  # pylint: disable=protected-access
  capsys.readouterr()
  record = json.loads((out / "config.json").read_text())
  assert record["algorithms"]["uniform_mean"]["aggregator"] == (
      "user_rules_mod:uniform_mean")
  line = _error_line(capsys, TINY + ["--out", str(tmp_path / "bad"),
                                     "--aggregator", "no_such_mod:rule",
                                     "--allow-import", "no_such_mod"])
  assert line.startswith("error: --aggregator"), line
  assert "cannot import module 'no_such_mod'" in line, line
