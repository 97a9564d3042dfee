"""A config is data: checking or running one never imports or calls code
the user did not choose (``fedjax_agg.registry``).

Every registry a config names a component from is tried with standard
library callables (``os:system``, ``subprocess:getoutput``,
``shutil:rmtree``, ``os:getpid``) and with a module of the test's own that
leaves a mark when it is imported and when its function is called: from a
JSON config (``check_config``, ``run_config``), from Python objects and
from the command line. Nothing may run: no mark, no file, no deleted
folder.
"""

import json
import os
import sys

import pytest

from fedjax_agg import cli
from fedjax_agg import experiment
from fedjax_agg import registry
from fedjax_agg import spec
from tests.cli.test_cli import TINY
from tests.experiment.test_runs import MNIST_5K

SENTINEL = '''
import os
from fedjax_agg import registry
_MARK = os.environ["FEDJAX_AGG_TEST_MARK"]
open(_MARK + ".imported", "a").close()

def boom(*args, **kwargs):
  open(_MARK + ".called", "a").close()

@registry.declare("aggregator")
def declared_rule(weighting="uniform"):
  from fedjax_agg import aggregators
  return aggregators.fedavg(weighting=weighting)
'''


@pytest.fixture
def marks(tmp_path, monkeypatch):
  """The sentinel module (importable as ``fja_sentinel``), a folder that
  must survive and the file a command would create."""
  (tmp_path / "fja_sentinel.py").write_text(SENTINEL)
  monkeypatch.syspath_prepend(str(tmp_path))
  mark = tmp_path / "mark"
  monkeypatch.setenv("FEDJAX_AGG_TEST_MARK", str(mark))
  victim = tmp_path / "victim"
  victim.mkdir()
  (victim / "thesis.tex").write_text("precious")
  touched = tmp_path / "touched"
  yield {"mark": mark, "victim": victim, "touched": touched}
  sys.modules.pop("fja_sentinel", None)
  for reg in _registries():
    for name in [n for n in reg if ":" in n]:
      reg._entries.pop(name, None)  # pylint: disable=protected-access


def _registries():
  from fedjax_agg import aggregators, attacks, clients, compression  # pylint: disable=g-import-not-at-top,g-multiple-import
  from fedjax_agg import models, objectives, partitions, systems  # pylint: disable=g-import-not-at-top,g-multiple-import
  return (aggregators.REGISTRY, attacks.REGISTRY, clients.REGISTRY,
          compression.CODECS, models.REGISTRY, objectives.REGISTRY,
          partitions.REGISTRY, systems.STALENESS, systems.AVAILABILITY,
          systems.PROFILES)


def _nothing_ran(marks):
  assert not os.path.exists(str(marks["mark"]) + ".called")
  assert not marks["touched"].exists()
  assert (marks["victim"] / "thesis.tex").read_text() == "precious"


def _overrides(callable_name: str, marks) -> dict[str, dict]:
  """Config entries naming ``callable_name`` in every registry, with
  arguments that would do harm if it were called."""
  touch = f"touch {marks['touched']}"
  harm = {"command": touch, "cmd": touch, "path": str(marks["victim"])}
  algorithm = {"aggregator": "fedavg"}
  return {
      "aggregator": {"algorithms": {"A": {"aggregator": callable_name}}},
      "objective": {"algorithms": {"A": {
          **algorithm, "objective": callable_name, "objective_args": harm}}},
      "client": {"algorithms": {"A": {
          **algorithm, "client": callable_name, "client_args": harm}}},
      "attack": {"attack": {"name": callable_name, "args": harm}},
      "codec": {"systems": {"codec": callable_name, "codec_args": harm}},
      "staleness": {"systems": {"concurrency": 2,
                                "staleness": callable_name,
                                "staleness_args": harm}},
      "availability": {"systems": {"availability": callable_name,
                                   "availability_args": harm}},
      "profiles": {"systems": {"profiles": callable_name,
                               "profile_args": harm}},
      "model": {"model": {"name": callable_name, "args": harm}},
      "partition": {"partition": {"name": callable_name, "num_clients": 4,
                                  "args": harm}},
  }


STDLIB = ("os:system", "subprocess:getoutput", "shutil:rmtree", "os:getpid")


@pytest.mark.parametrize("callable_name", STDLIB + ("fja_sentinel:boom",))
def test_no_registry_runs_a_named_callable_from_a_json_config(
    marks, callable_name):
  for where, override in _overrides(callable_name, marks).items():
    config = experiment.override(MNIST_5K, override)
    with pytest.raises((ValueError, TypeError)) as raised:
      experiment.check_config(json.loads(json.dumps(config)))
    # Refused as not allowed (or, where the registry takes no imported
    # names, as not one of its names).
    assert ("not allowed" in str(raised.value)
            or "must be one of" in str(raised.value)), (where, raised.value)
    assert callable_name.split(":")[0] not in registry.allowed_imports()
    _nothing_ran(marks)
  # Not even imported.
  assert not os.path.exists(str(marks["mark"]) + ".imported")


def test_an_allowed_module_still_runs_only_declared_factories(marks,
                                                               tmp_path):
  for where, override in _overrides("fja_sentinel:boom", marks).items():
    config = experiment.override(MNIST_5K, override)
    with pytest.raises((ValueError, TypeError)) as raised:
      experiment.check_config(config, allow_imports=["fja_sentinel"])
    assert ("not declared as a factory of kind" in str(raised.value)
            or "must be one of" in str(raised.value)), (where, raised.value)
    _nothing_ran(marks)
  assert os.path.exists(str(marks["mark"]) + ".imported")
  # The allowance was for the block only.
  assert "fja_sentinel" not in registry.allowed_imports()
  # run_config refuses the same way and writes nothing.
  out = tmp_path / "out"
  config = experiment.override(MNIST_5K, _overrides("os:system",
                                                    marks)["objective"])
  with pytest.raises((ValueError, TypeError), match="not allowed"):
    experiment.run_config(config, str(out), progress=False)
  assert not out.exists()
  _nothing_ran(marks)


def test_a_declared_factory_of_another_kind_is_refused(marks):
  config = experiment.override(MNIST_5K, _overrides(
      "fja_sentinel:declared_rule", marks)["objective"])
  with pytest.raises((ValueError, TypeError), match="not declared"):
    experiment.check_config(config, allow_imports=["fja_sentinel"])
  # As the aggregator it was declared to be, it is accepted.
  config = experiment.override(MNIST_5K, {"algorithms": {"A": {
      "aggregator": "fja_sentinel:declared_rule"}}})
  checked = experiment.check_config(config, allow_imports=["fja_sentinel"])
  assert checked.algorithms["A"].aggregator == "fja_sentinel:declared_rule"


def test_python_objects_are_checked_the_same_way(marks):
  config = spec.Experiment.from_dict(MNIST_5K)
  for callable_name in STDLIB:
    with pytest.raises((ValueError, TypeError), match="not allowed"):
      spec.Experiment.from_dict({**config.to_dict(), "algorithms": {
          "A": spec.AlgorithmSpec(aggregator="fedavg",
                                  objective=callable_name,
                                  objective_args={"command": "x"})}})
    _nothing_ran(marks)


@pytest.mark.parametrize("flags", [
    ["--objective", "subprocess:getoutput", "--objective-arg", "cmd={touch}"],
    ["--objective", "os:system", "--objective-arg", "command={touch}"],
    ["--aggregator", "os:getpid"],
    ["--codec", "subprocess:getoutput", "--codec-arg", "cmd={touch}"],
    ["--attack", "shutil:rmtree", "--attack-arg", "path={victim}"],
    ["--availability", "os:system", "--availability-arg",
     "command={touch}"],
    ["--client", "os:system", "--client-arg", "command={touch}"],
    ["--model", "os:system", "--model-arg", "command={touch}"],
    ["--partition", "shutil:rmtree", "--partition-arg", "path={victim}"],
])
def test_the_command_line_runs_no_named_callable(marks, tmp_path, capsys,
                                                 flags):
  out = tmp_path / "run"
  flags = [f.format(touch=f"touch {marks['touched']}",
                    victim=marks["victim"]) for f in flags]
  with pytest.raises(SystemExit) as raised:
    cli.main(TINY + ["--out", str(out)] + flags)
  assert raised.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  # Refused as not allowed, or where the flag takes no imported names as
  # not one of its choices.
  assert err.startswith("error: "), err
  assert ("not allowed" in err and "--allow-import" in err) or (
      "invalid choice" in err), err
  assert not out.exists()
  _nothing_ran(marks)


def test_allow_import_names_must_be_module_names(capsys, tmp_path):
  with pytest.raises(SystemExit):
    cli.main(TINY + ["--out", str(tmp_path / "r"), "--allow-import",
                     "../evil"])
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.startswith("error: --allow-import: ") and "../evil" in err
  for bad in ("os system", "", "a..b", 3):
    with pytest.raises((TypeError, ValueError), match="allow_imports"):
      with registry.allowing_imports([bad]):
        pass
  with pytest.raises(ValueError, match="kinds must be"):
    registry.declare("aggregatr")


USER_PARTS = '''
import numpy as np
from fedjax_agg import registry
from fedjax_agg.models import networks  # noqa: F401  (a library import)
from fedjax_agg import models

@registry.declare("model")
def small_mlp(num_classes=10, input_shape=(28, 28, 1), hidden=16):
  return models.get("mlp2", num_classes=num_classes,
                    input_shape=input_shape, hidden=hidden)

@registry.declare("partition")
def halves(labels, num_clients, seed=0):
  del seed
  order = np.argsort(np.asarray(labels), kind="stable")
  return [np.sort(part) for part in np.array_split(order, num_clients)]
'''


def test_a_declared_model_and_partition_run_from_a_config(tmp_path,
                                                          monkeypatch):
  (tmp_path / "fja_user_parts.py").write_text(USER_PARTS)
  monkeypatch.syspath_prepend(str(tmp_path))
  config = experiment.override(MNIST_5K, {
      "model": {"name": "fja_user_parts:small_mlp", "args": {"hidden": 8}},
      "partition": {"name": "fja_user_parts:halves", "num_clients": 4}})
  try:
    with pytest.raises(spec.ConfigError,
                       match="(model|partition).name.*not allowed"):
      experiment.check_config(config)
    summary = experiment.run_config(config, str(tmp_path / "out"),
                                    progress=False,
                                    allow_imports=["fja_user_parts"])
    assert 0.0 <= summary["FedAdp"]["final_test_accuracy_mean"] <= 1.0
    record = json.loads((tmp_path / "out" / "config.json").read_text())
    assert record["model"]["name"] == "fja_user_parts:small_mlp"
    assert record["provenance"]["execution"]["allowed_imports"] == [
        "fja_user_parts"]
    # The option reached the network: mlp2 with 8 hidden units.
    with pytest.raises(spec.ConfigError, match="model.args"):
      experiment.check_config(experiment.override(
          config, {"model.args": {"hiden": 8}}),
                              allow_imports=["fja_user_parts"])
  finally:
    sys.modules.pop("fja_user_parts", None)
    from fedjax_agg import models, partitions  # pylint: disable=g-import-not-at-top,g-multiple-import
    for reg in (models.REGISTRY, partitions.REGISTRY):
      for name in [n for n in reg if n.startswith("fja_user_parts:")]:
        reg._entries.pop(name, None)  # pylint: disable=protected-access
