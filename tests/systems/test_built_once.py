"""A run's systems objects are built once: the spec's check builds the
``config.Systems`` and its codec (``clock.built``) and the run uses that
object, whatever the entry point; no config dataclass builds a codec."""

import subprocess
import sys

import pytest

from fedjax_agg import cli
from fedjax_agg import clock
from fedjax_agg import compression
from fedjax_agg import config
from fedjax_agg import experiment
from tests.cli.test_cli import TINY
from tests.experiment.test_runs import MNIST_5K


@pytest.fixture
def counted(monkeypatch):
  calls = {"codec": 0, "systems": 0}
  build = compression.get

  def get(*args, **kwargs):
    calls["codec"] += 1
    return build(*args, **kwargs)
  monkeypatch.setattr(compression, "get", get)
  init = config.Systems.__post_init__

  def post_init(self):
    calls["systems"] += 1
    init(self)
  monkeypatch.setattr(config.Systems, "__post_init__", post_init)
  return calls


def test_a_two_round_run_config_builds_its_codec_once(counted, tmp_path):
  run = experiment.override(MNIST_5K, {
      "train.rounds": 2, "systems": {"codec": "qsgd",
                                     "codec_args": {"bits": 4}}})
  experiment.run_config(run, str(tmp_path), progress=False)
  assert counted == {"codec": 1, "systems": 1}


def test_a_two_round_command_builds_its_codec_once(counted, tmp_path,
                                                   capsys):
  cli.main([flag if flag != "1" else "2" for flag in TINY] + [
      "--out", str(tmp_path / "run"), "--codec", "qsgd", "--codec-arg",
      "bits=4"])
  capsys.readouterr()
  assert counted == {"codec": 1, "systems": 1}


def test_a_description_builds_nothing_and_built_keeps_its_objects(
    counted):
  described = config.Systems(codec="qsgd", codec_args={"bits": 4})
  assert counted["codec"] == 0
  first = clock.built(described)
  assert clock.built(described) is first and counted["codec"] == 1
  # A bad name is refused where it is built, naming the attribute.
  with pytest.raises(clock.SystemsError, match="^codec must be one "
                     "of") as raised:
    clock.built(config.Systems(codec="nope"))
  assert raised.value.field == "codec"
  with pytest.raises(clock.SystemsError) as raised:
    clock.built(config.Systems(codec="qsgd", codec_args={"bits": 99}))
  assert raised.value.field == "codec_args"
  with pytest.warns(DeprecationWarning, match="clock.built"):
    assert described.build_codec() is first.codec


def test_deprecated_builders_without_the_systems_layer_name_it():
  # config must not import clock (a higher layer); with clock never
  # imported, the deprecated shims say what to import instead of failing
  # with an AttributeError or importing upwards.
  script = ("import warnings, fedjax_agg.config as c, sys\n"
            "assert 'fedjax_agg.clock' not in sys.modules\n"
            "warnings.simplefilter('ignore')\n"
            "try:\n"
            "  c.Systems(codec='uniform').build_codec()\n"
            "except RuntimeError as e:\n"
            "  print(e)\n")
  out = subprocess.run([sys.executable, "-c", script], capture_output=True,
                       text=True, check=True).stdout
  assert "fedjax_agg.clock" in out and "clock.built(systems)" in out


def test_a_two_round_run_builds_its_population_once(monkeypatch, tmp_path,
                                                    capsys):
  # The clients' speed profiles and availability process are the run's
  # objects, built once for the federation's N (the description's check
  # only tries the arguments on a population of one).
  from fedjax_agg import systems as systems_lib  # pylint: disable=g-import-not-at-top
  built = []
  for kind, registry in (("profiles", systems_lib.PROFILES),
                         ("availability", systems_lib.AVAILABILITY)):
    def build(name, *args, _kind=kind, _build=registry.build, **kwargs):
      built.append((_kind, name, kwargs.get("num_clients")))
      return _build(name, *args, **kwargs)
    monkeypatch.setattr(registry, "build", build)
  cli.main([flag if flag != "1" else "2" for flag in TINY] + [
      "--out", str(tmp_path / "run"), "--availability", "markov",
      "--availability-arg", "mean_online_s=60", "--availability-arg",
      "mean_offline_s=30",
      "--codec", "qsgd", "--codec-arg", "bits=4"])
  capsys.readouterr()
  runs = [entry for entry in built if entry[2] != 1]
  assert sorted(runs) == [("availability", "markov", 4),
                          ("profiles", "constant", 4)], built
