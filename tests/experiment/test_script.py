"""The experiment scripts' flags: config, overrides, output folder and
device count.
"""

import json
import os

import jax
import pytest

from fedjax_agg import experiment
from tests.experiment._util import CONFIG


def test_script_flags_resolve_config_overrides_and_output(tmp_path,
                                                         monkeypatch):
  # script_config sets XLA_FLAGS (--cpu-devices); restored after the test.
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
  script_dir = tmp_path / "paper"
  (script_dir / "configs").mkdir(parents=True)
  for name in ("fig1", "fig1_full"):
    with open(script_dir / "configs" / f"{name}.json", "w") as f:
      json.dump({**CONFIG, "name": name}, f)
  parser = experiment.script_parser("paper")
  args = parser.parse_args(["--config", "configs/fig1.json", "--full",
                            "--set", "train.rounds=5", "--set",
                            "seeds=[3, 4]", "--set", "dataset.source=files",
                            "--algorithms", "FedAvg,FedProx"])
  config, out_dir, names = experiment.script_config(args, str(script_dir))
  assert config["name"] == "fig1_full"
  assert config["train"]["rounds"] == 5 and config["seeds"] == [3, 4]
  assert config["dataset"]["source"] == "files"
  assert out_dir == str(script_dir / "results" / "fig1_full")
  assert names == ["FedAvg", "FedProx"]
  with pytest.raises(ValueError, match="--algorithms"):
    experiment.script_config(parser.parse_args(
        ["--config", "configs/fig1.json", "--algorithms", "Nope"]),
        str(script_dir))
  with pytest.raises(ValueError, match="--config"):
    experiment.config_path("configs/missing.json", False, str(script_dir))
  with pytest.raises(ValueError, match="--set"):
    experiment.parse_sets(["train.rounds"])
  # --cpu-devices is applied before the config is read; JAX has started
  # here, so only its current device count is accepted.
  started = len(jax.devices("cpu"))
  config, _, _ = experiment.script_config(parser.parse_args(
      ["--config", "configs/fig1.json", "--cpu-devices", str(started)]),
      str(script_dir))
  assert config["name"] == "fig1"
  for bad in ("0", str(started + 1)):
    with pytest.raises(ValueError, match="--cpu-devices"):
      experiment.script_config(parser.parse_args(
          ["--config", "configs/fig1.json", "--cpu-devices", bad]),
          str(script_dir))
