"""The command line writes nothing before the run has passed its checks,
and what a config says of its seeds and systems is what runs."""

import json

import pytest

from fedjax_agg import cli

from tests.cli.test_cli import TINY
from tests.cli.test_cli import _error_line


def _files(folder) -> dict:
  """Every file's bytes but the checkpoint lock's (who held it last)."""
  return {str(p.relative_to(folder)): p.read_bytes()
          for p in folder.rglob("*")
          if p.is_file() and p.name != ".fedjax_agg.lock"}


def test_a_refused_resume_leaves_the_runs_files_as_they_were(tmp_path,
                                                             capsys):
  out = tmp_path / "run"
  run = TINY + ["--out", str(out), "--checkpoint-every", "1", "--lr", "0.05"]
  cli.main(run)
  capsys.readouterr()
  before = _files(out)
  assert json.loads(before["config.json"])["train"]["learning_rate"] == 0.05
  line = _error_line(capsys, run[:-1] + ["0.7", "--resume"])
  assert line.startswith("error: --resume/--checkpoint-dir: "), line
  assert "learning_rate" in line, line
  # config.json still says what the history was trained with.
  assert _files(out) == before


@pytest.mark.parametrize("flags,named", [
    # Refused by the run's own checks, before its first row.
    (["--aggregator", "krum", "--secagg-bits", "16"], "secure aggregation"),
    (["--aggregator", "fednova", "--optimizer", "adam"],
     "fednova: the clients' optimizer is not SGD"),
    (["--aggregator", "qffl", "--agg-arg", "learning_rate=0.3"],
     "qffl: learning_rate=0.3 differs from the client learning rate"),
    (["--availability", "intervals", "--availability-arg",
      "path=MISSING.csv"], "MISSING.csv"),
])
def test_refusals_inside_the_run_come_before_any_file(flags, named,
                                                      tmp_path, capsys):
  out = tmp_path / "run"
  line = _error_line(capsys, TINY + ["--out", str(out)] + flags)
  assert named in line, line
  assert not out.exists() or not any(out.iterdir()), _files(out)


def test_a_configs_vmap_seeds_false_runs_its_seeds_one_after_the_other(
    tmp_path, capsys):
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  config = {
      "dataset": {"name": "mnist", "source": "mnist_5k",
                  "max_train_examples": 400},
      "partition": {"name": "shards", "num_clients": 4,
                    "args": {"shards_per_client": 2}},
      "model": {"name": "mlp2"},
      "train": {"rounds": 1, "participation": 0.5, "batch_size": 20,
                "eval_clients": False},
      "algorithms": {"FedAvg": {"aggregator": "fedavg"}},
      "seeds": [0, 1], "vmap_seeds": False}
  out = tmp_path / "run"
  path = tmp_path / "seeds.json"
  path.write_text(json.dumps(config))
  cli.main(["--config", str(path), "--out", str(out), "--no-progress"])
  printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert [m["seed"] for m in printed["members"]] == [0, 1]
  recorded = json.loads((out / "config.json").read_text())
  assert recorded["vmap_seeds"] is False
  assert recorded["provenance"]["execution"]["vmap_seeds"] is False
  # Each member is the run of its seed alone.
  for seed in (0, 1):
    alone = experiment.run_algorithm(config, "FedAvg", seed).history
    saved = json.loads((out / f"seed{seed}" / "history.json").read_text())
    assert [r["test_accuracy"] for r in saved["rows"]] == pytest.approx(
        alone.column("test_accuracy").tolist(), rel=1e-6)


def test_trace_profiles_from_the_command_line_and_a_config(tmp_path, capsys):
  trace = tmp_path / "profiles.csv"
  trace.write_text("client_id,speed,uplink,downlink\n" + "".join(
      f"{i},{100 * (i + 1)},1e6,4e6\n" for i in range(4)))
  out = tmp_path / "run"
  cli.main(TINY + ["--out", str(out), "--profiles", "trace",
                   "--profile-arg", f"path={trace}"])
  rows = json.loads((out / "history.json").read_text())["rows"]
  assert rows[-1]["sim_time_s"] > 0
  recorded = json.loads((out / "config.json").read_text())
  assert recorded["systems"]["profile_args"] == {
      "path": str(trace)}
  capsys.readouterr()
  # The same block from a config file; a trace without its path is named.
  line = _error_line(capsys, TINY + ["--out", str(tmp_path / "other"),
                                     "--profiles", "trace"])
  assert "systems.profiles" in line and "path" in line, line
