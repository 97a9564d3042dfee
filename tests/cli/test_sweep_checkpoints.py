"""Runs of several seeds checkpoint and resume from the command line and
from configs, as one run does: a vmapped sweep in one checkpoint of every
member, seeds one after the other in one checkpoint each."""

import json
import shutil

import numpy as np
import pytest

from fedjax_agg import cli
from fedjax_agg import experiment

from tests.cli.test_cli import TINY

CONFIG = {
    "dataset": {"name": "mnist", "source": "mnist_5k",
                "max_train_examples": 400},
    "partition": {"name": "shards", "num_clients": 4,
                  "args": {"shards_per_client": 2}},
    "model": {"name": "mlp2"},
    "train": {"rounds": 1, "participation": 0.5, "batch_size": 20,
              "eval_clients": False},
    "algorithms": {"FedAvg": {"aggregator": "fedavg"}},
    "seeds": [0, 1]}


def _columns(folder, name="test_loss") -> dict:
  out = {}
  for path in sorted(folder.rglob("history.json")):
    rows = json.loads(path.read_text())["rows"]
    out[str(path.relative_to(folder))] = [row.get(name) for row in rows]
  return out


def test_a_vmapped_sweep_resumes_to_the_uninterrupted_run(tmp_path,
                                                          capsys):
  # Two rounds checkpointed every round; the run is cut back to its round
  # 1 checkpoint (as a run killed during round 2 leaves it), then resumed:
  # the same histories as two rounds straight through.
  config = experiment.override(CONFIG, {"train.rounds": 2})
  run = tmp_path / "run"
  experiment.run_config(config, str(run), progress=False, vmap_seeds=True,
                        checkpoint_every=1)
  checkpoints = run / "checkpoints" / "FedAvg"
  assert sorted(p.name for p in checkpoints.iterdir()
                if p.name.isdigit()) == ["1", "2"]
  want = _columns(run)
  shutil.rmtree(checkpoints / "2")
  for path in run.rglob("history.*"):
    path.unlink()
  capsys.readouterr()
  experiment.run_config(config, str(run), progress=False, vmap_seeds=True,
                        checkpoint_every=1, resume=True)
  assert "resumed from round 1 of 2\n" in capsys.readouterr().err
  resumed = _columns(run)
  assert sorted(resumed) == sorted(want) == [
      "seed0/history.json", "seed1/history.json"]
  for name, column in want.items():
    assert len(column) == 3
    np.testing.assert_allclose(resumed[name], column, rtol=1e-6,
                               err_msg=name)


def test_the_command_lines_seeds_checkpoint_and_a_finished_run_reads_back(
    tmp_path, capsys):
  out = tmp_path / "run"
  argv = TINY + ["--seeds", "0,1", "--rounds", "2", "--checkpoint-every",
                 "1", "--out", str(out)]
  assert cli.main(argv) == 0
  first = _columns(out)
  assert sorted(first) == ["seed0/history.json", "seed1/history.json"]
  assert (out / "checkpoint").is_dir()
  capsys.readouterr()
  assert cli.main(argv + ["--resume"]) == 0
  assert "resumed from round 2 of 2 (already finished)" in (
      capsys.readouterr().err)
  assert _columns(out) == first


def test_a_configs_seeds_in_turn_checkpoint_one_folder_each(tmp_path):
  path = tmp_path / "seeds.json"
  path.write_text(json.dumps({**CONFIG, "vmap_seeds": False}))
  out = tmp_path / "run"
  assert cli.main(["--config", str(path), "--out", str(out),
                   "--no-progress", "--checkpoint-every", "1"]) == 0
  assert sorted(p.name for p in (out / "checkpoint").iterdir()
                if p.is_dir()) == ["seed0", "seed1"]


def test_the_command_lines_seeds_take_devices_as_one_run_does(tmp_path,
                                                              capsys):
  # The members are sharded over the devices asked for; more than the job
  # has is refused by name before anything is written.
  import jax  # pylint: disable=g-import-not-at-top
  out = tmp_path / "run"
  argv = TINY + ["--seeds", "0,1", "--out", str(out)]
  assert cli.main(argv + ["--devices", "1"]) == 0
  assert sorted(_columns(out)) == ["seed0/history.json",
                                   "seed1/history.json"]
  capsys.readouterr()
  too_many = str(jax.device_count() + 1)
  with pytest.raises(SystemExit) as exit_:
    cli.main(argv + ["--devices", too_many, "--out",
                     str(tmp_path / "other")])
  assert exit_.value.code == 2
  assert f"error: --devices: {too_many} devices asked for" in (
      capsys.readouterr().err)
  assert not (tmp_path / "other").exists()
