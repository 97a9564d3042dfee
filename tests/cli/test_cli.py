"""The command line: one-line errors naming the flag, errors before the
data, ``python -m fedjax_agg``, and what a run writes down (config.json,
strict history.json).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from fedjax_agg import cli
from fedjax_agg import experiment
from fedjax_agg import sweep
from tests.cli._util import _config_file

# A tiny run on the offline MNIST subset: seconds on a CPU.
TINY = ["--dataset", "mnist", "--source", "mnist_5k",
        "--max-train-examples", "400", "--num-clients", "4",
        "--partition", "shards", "--model", "mlp2", "--partition-arg",
        "shards_per_client=2", "--rounds", "1", "--participation", "0.5",
        "--batch-size", "20", "--no-progress", "--no-client-eval"]


def _error_line(capsys, argv) -> str:
  """Runs ``main(argv)``, which must fail; returns its one stderr line."""
  with pytest.raises(SystemExit) as raised:
    cli.main(argv)
  assert raised.value.code == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err
  # Besides the error: the resolved config and notes (a subset's).
  lines = [line for line in err.splitlines()
           if not line.startswith(("config: ", "note: "))]
  assert len(lines) == 1, err
  assert lines[0].startswith("error: ")
  return lines[0]


def _bad_out_file(tmp_path):
  path = tmp_path / "a_file"
  path.write_text("")
  return ["--out", str(path)]


def _history_is_a_dir(tmp_path):
  (tmp_path / "out" / "history.csv").mkdir(parents=True)
  return ["--out", str(tmp_path / "out")]


def _file_on_the_way(tmp_path):
  (tmp_path / "parent").write_text("")
  return ["--out", str(tmp_path / "parent" / "out")]


def _checkpoint_dir_is_a_file(tmp_path):
  path = tmp_path / "a_file"
  path.write_text("")
  return ["--checkpoint-every", "1", "--checkpoint-dir", str(path)]


def _missing_data(tmp_path):
  return ["--dataset", "fashion_mnist", "--source", "files", "--data-dir",
          str(tmp_path)]


def _unknown_config_key(tmp_path):
  return ["--config", _config_file(tmp_path, epochs=3)]


def _two_algorithms(tmp_path):
  # Without --algorithm both run (a comparison); a flag of one algorithm
  # cannot say which it sets.
  return ["--config", _config_file(tmp_path, algorithms={
      "A": {"aggregator": "fedavg"}, "B": {"aggregator": "fedadp"}}),
          "--agg-arg", "alpha=5"]


def _bad_file_value(tmp_path):
  return ["--config", _config_file(tmp_path, seeds=[-3])]


def _deep_config_file(tmp_path):
  path = tmp_path / "deep.json"
  path.write_text("[" * 200_000 + "]" * 200_000)
  return ["--config", str(path)]


def _huge_seed_in_file(tmp_path):
  return ["--config", _config_file(tmp_path, seeds=[10**20])]


def _tensorboard_under_a_file(tmp_path):
  (tmp_path / "a_file").write_text("")
  return ["--tensorboard", str(tmp_path / "a_file" / "tb")]


def _sweep_with_tensorboard(tmp_path):
  return ["--seeds", "0,1", "--tensorboard", str(tmp_path / "tb")]


# (extra flags, or a function of tmp_path giving them; what the line names).
BAD_FLAGS = [
    (["--seed", str(2**63)], "--seed"),
    (["--seed", str(10**20)], "--seed"),
    (["--seed", str(2**32 + 5)], "--seed"),
    (["--seeds", "0,4294967296"], "--seeds"),
    (_huge_seed_in_file, "--config"),
    (_deep_config_file, "--config"),
    (["--algorithm", "../escaped"], "--algorithm"),
    (["--algorithm", "/abs/path"], "--algorithm"),
    (_tensorboard_under_a_file, "--tensorboard"),
    (_sweep_with_tensorboard, "--tensorboard"),
    (["--aggregator", "fedadp", "--sweep", "alpha=5,5.0000001"], "--sweep"),
    (["--aggregator", "fedadp", "--sweep", "alpha=5,5"], "--sweep"),
    (["--aggregator", "trimmed_mean", "--sweep", "beta=0.1,0.2"],
     "--sweep"),
    (["--aggregator", "dp_fedavg", "--agg-arg", "noise_multiplier=0.3",
      "--target-epsilon", "0.01"], "--target-epsilon"),
    (["--early-stopping", "test_accuracy", "--patience", "0"],
     "--patience"),
    (["--early-stopping", "test_accuracy", "--min-delta", "-0.1"],
     "--min-delta"),
    (["--early-stopping-mode", "up"], "--early-stopping-mode"),
    (["--seed", "-1"], "--seed"),
    (["--lr", "nan"], "--lr"),
    (["--lr", "inf"], "--lr"),
    (["--participation", "1.5"], "--participation"),
    (["--aggregator", "fedavgg"], "--aggregator"),
    (["--aggregator", "fedadp", "--agg-arg", "alpha=abc"], "--agg-arg"),
    (["--aggregator", "fedadp", "--agg-arg", "alpah=1"], "--agg-arg"),
    (["--agg-arg", "alpha"], "--agg-arg"),
    (["--rounds", "-2"], "--rounds"),
    (["--rounds", "two"], "--rounds"),
    (["--batch-size", "0"], "--batch-size"),
    (["--epochs", "0"], "--epochs"),
    (["--momentum", "1"], "--momentum"),
    (["--optimizer", "rmsprop"], "--optimizer"),
    (["--weight-decay", "-1"], "--weight-decay"),
    (["--optimizer", "adam", "--momentum", "0.5"], "--momentum"),
    (["--partition-arg", "bogus=1"], "--partition-arg"),
    (["--partition", "nope"], "--partition"),
    (["--num-clients", "100000"], "--num-clients"),
    (["--objective", "fedprox", "--objective-arg", "mu=-1"],
     "--objective-arg"),
    (["--conv-impl", "fast"], "--conv-impl"),
    (["--max-train-examples", "0"], "--max-train-examples"),
    (["--seeds", "0,x"], "--seeds"),
    (["--seeds", "0,1", "--tensorboard", "tb"], "--tensorboard"),
    (["--sweep", "nope=1,2"], "--sweep"),
    (["--aggregator", "fedadp", "--sweep", "alpha=1,-5"], "--sweep"),
    (["--checkpoint-every", "-1"], "--checkpoint-every"),
    (["--rounds", "0"], "--rounds"),
    (["--devices", "4096"], "--devices"),
    (["--list", "widgets"], "--list"),
    (["--attack", "sign_flp"], "--attack"),
    (["--attack-fraction", "0.2"], "--attack-fraction"),
    (["--attack-arg", "scale=2"], "--attack-arg"),
    (["--attack", "sign_flip", "--attack-arg", "scal=2"], "--attack-arg"),
    (["--attack", "gaussian", "--attack-arg", "stddev=-1"], "--attack-arg"),
    (["--attack", "sign_flip", "--attack-fraction", "1.0"],
     "--attack-fraction"),
    (["--attack", "sign_flip", "--attack-fraction", "nan"],
     "--attack-fraction"),
    (["--attack", "sign_flip", "--adversaries", "some"], "--adversaries"),
    (["--bogus"], "--bogus"),
    (["--config", "no/such/file.json"], "--config"),
    (_unknown_config_key, "--config"),
    (_bad_file_value, "--config"),
    (_two_algorithms, "--agg-arg"),
    (_bad_out_file, "--out"),
    (_history_is_a_dir, "--out"),
    (_file_on_the_way, "--out"),
    (_checkpoint_dir_is_a_file, "--checkpoint-dir"),
    (_missing_data, "--data-dir"),
]


@pytest.mark.parametrize(
    "flags,flag", BAD_FLAGS,
    ids=[f if isinstance(f, str) else
         (f.__name__ if callable(f) else " ".join(f)) for f, _ in BAD_FLAGS])
def test_user_errors_are_one_line_naming_the_flag(flags, flag, tmp_path,
                                                  capsys):
  if callable(flags):
    flags = flags(tmp_path)
  out = ["--out", str(tmp_path / "run")]
  line = _error_line(capsys, TINY + out + flags)
  assert flag in line, line


def test_unwritable_out_is_refused_before_the_data(tmp_path, capsys,
                                                   monkeypatch):
  locked = tmp_path / "locked"
  locked.mkdir()
  locked.chmod(0o500)
  try:
    if os.access(locked, os.W_OK):
      pytest.skip("running as a user who can write anywhere")
    monkeypatch.setattr(experiment, "load_dataset", _never)
    line = _error_line(capsys, TINY + ["--out", str(locked)])
    assert "--out" in line and "not writable" in line
  finally:
    locked.chmod(0o700)


def _never(*args, **kwargs):
  raise AssertionError("the data must not be read")


@pytest.mark.parametrize("flags", [
    ["--aggregator", "dp_fedavg", "--agg-arg", "noise_multiplier=0.3",
     "--target-epsilon", "0.01"],
    ["--tensorboard", "TB_UNDER_FILE"],
])
def test_late_errors_come_before_the_data_and_config_json(
    flags, tmp_path, capsys, monkeypatch):
  (tmp_path / "a_file").write_text("")
  flags = [str(tmp_path / "a_file" / "tb") if f == "TB_UNDER_FILE" else f
           for f in flags]
  monkeypatch.setattr(experiment, "load_dataset", _never)
  out = tmp_path / "run"
  line = _error_line(capsys, TINY + ["--out", str(out)] + flags)
  assert flags[-2] in line, line
  assert not (out / "config.json").exists()


def test_internal_errors_keep_their_traceback(tmp_path, monkeypatch):
  def broken(*args, **kwargs):
    raise RuntimeError("a bug")
  monkeypatch.setattr(experiment, "run_algorithm", broken)
  with pytest.raises(RuntimeError, match="a bug"):
    cli.main(TINY + ["--out", str(tmp_path / "run")])


def test_list_runs_as_a_module():
  result = subprocess.run(
      [sys.executable, "-m", "fedjax_agg", "--list", "aggregators"],
      capture_output=True, text=True, check=False, timeout=120)
  assert result.returncode == 0, result.stderr
  assert "fedavg(" in result.stdout and "fednnnn(" in result.stdout


def _strict(text: str):
  def refuse(token):
    raise ValueError(f"not JSON: {token}")
  return json.loads(text, parse_constant=refuse)


def test_tiny_run_writes_config_json(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(TINY + ["--out", str(out), "--seed", "2"]) == 0
  captured = capsys.readouterr()
  resolved = [line for line in captured.err.splitlines()
              if line.startswith("config: ")]
  assert len(resolved) == 1
  assert json.loads(resolved[0][len("config: "):])["seeds"] == [2]
  summary = json.loads(captured.out.strip().splitlines()[-1])
  assert summary["config"] == str(out / "config.json")
  for name in ("history.csv", "history.json", "curves.png",
               "config.json"):
    assert os.path.getsize(out / name) > 0, name
  _strict((out / "history.json").read_text())
  record = _strict((out / "config.json").read_text())
  experiment.check_config(record)  # It can be run again as it is.
  assert record["dataset"]["name"] == "mnist"
  assert record["partition"] == {"name": "shards", "num_clients": 4,
                                 "args": {"shards_per_client": 2},
                                 "seed_offset": 0, "holdout_fraction": 0.0}
  assert record["model"]["name"] == "mlp2"
  assert record["train"]["learning_rate"] == 0.05
  assert record["seeds"] == [2]
  provenance = record["provenance"]
  data = provenance["data"]
  assert data["source"] == "mnist_5k"
  assert data["train_examples"] == 400 and data["test_examples"] == 1000
  clients = data["clients_by_seed"]["2"]
  assert clients["num_clients"] == 4
  assert 0 < clients["examples_min"] <= clients["examples_max"]
  rule = provenance["algorithms"]["fedavg"]
  assert rule["aggregator"] == "fedavg"
  assert rule["aggregator_args"] == {"weighting": "num_examples"}
  assert rule["objective"] == "cross_entropy"
  assert rule["train"]["batch_size"] == 20
  environment = provenance["environment"]
  for package in ("fedjax_agg", "jax", "flax", "optax", "numpy"):
    assert environment["versions"][package], package
  assert environment["python"].count(".") == 2
  assert environment["devices"]["count"] >= 1
  assert environment["devices"]["kind"]
  assert provenance["command"][:3] == ["python", "-m", "fedjax_agg"]
  assert "--seed" in provenance["command"]
  assert provenance["execution"]["out"] == str(out)


def test_tiny_sweep_writes_bands_and_a_summary_csv(tmp_path, capsys):
  out = tmp_path / "sweep"
  argv = [a for a in TINY if a != "fedavg"] + [
      "--aggregator", "fedadp", "--seeds", "0,1", "--sweep", "alpha=1,8",
      "--out", str(out)]
  assert cli.main(argv) == 0
  printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert len(printed["members"]) == 4
  frame = pd.read_csv(printed["summary"])
  assert sorted(frame["name"]) == ["alpha1", "alpha8"]
  assert list(frame["seeds"]) == [2, 2]
  assert {"final_test_accuracy_mean", "final_test_accuracy_std"} <= set(
      frame.columns)
  assert os.path.getsize(out / "curves.png") > 0


def test_a_config_of_several_algorithms_is_compared(tmp_path, capsys):
  out = tmp_path / "compare"
  config = _config_file(tmp_path, algorithms={
      "A": {"aggregator": "fedavg"}, "B": {"aggregator": "fedadp"}})
  assert cli.main(["--config", config, "--seeds", "0,1", "--out", str(out),
                   "--no-progress"]) == 0
  printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert set(printed["algorithms"]) == {"A", "B"}
  for name in ("A", "B"):
    for seed in (0, 1):
      assert (out / name / f"seed{seed}" / "history.json").exists()
  assert json.loads((out / "summary.json").read_text())["algorithms"][
      "B"]["seeds"] == 2
  assert os.path.getsize(out / "curves.png") > 0


def test_a_band_over_seeds_is_named_by_the_algorithm(tmp_path, capsys):
  # The mean over seeds 0 and 1 is not "seed0".
  out = tmp_path / "seeds"
  assert cli.main(TINY + ["--seeds", "0,1", "--out", str(out)]) == 0
  printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  frame = pd.read_csv(printed["summary"])
  assert list(frame["name"]) == ["fedavg"] and list(frame["seeds"]) == [2]


def test_dp_sweep_accounts_every_member(tmp_path, capsys):
  from fedjax_agg import privacy
  out = tmp_path / "sweep"
  assert cli.main(TINY + [
      "--out", str(out), "--rounds", "2", "--aggregator", "dp_fedavg",
      "--seeds", "0,1", "--sweep", "noise_multiplier=0.7,1.4",
      "--dp-delta", "1e-6"]) == 0
  printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert len(printed["members"]) == 4
  for z in (0.7, 1.4):
    want = privacy.epsilons(z, 2, num_clients=4, cohort_size=2,
                            delta=1e-6)
    for seed in (0, 1):
      member = sweep.member_name({"noise_multiplier": z}, seed)
      history = _strict((out / member / "history.json").read_text())
      got = [row["epsilon"] for row in history["rows"][1:]]
      np.testing.assert_allclose(got, want, rtol=1e-6)
      assert history["config"]["privacy"]["noise_multiplier"] == (
          pytest.approx(z))


def test_tiny_attacked_run_records_the_attack_and_the_malicious(tmp_path,
                                                               capsys):
  out = tmp_path / "run"
  assert cli.main(TINY + [
      "--out", str(out), "--participation", "1.0", "--attack", "sign_flip",
      "--attack-arg", "scale=4", "--attack-fraction", "0.5",
      "--adversaries", "fixed", "--aggregator", "fedmedian"]) == 0
  capsys.readouterr()
  record = _strict((out / "config.json").read_text())
  experiment.check_config(record)
  assert record["attack"] == {"name": "sign_flip", "args": {"scale": 4},
                              "fraction": 0.5, "adversaries": "fixed",
                              "seed": 0}
  history = _strict((out / "history.json").read_text())
  assert [row.get("num_malicious") for row in history["rows"]][1:] == [2.0]
  malicious = history["clients"][0]["malicious"]
  assert sorted(malicious) == [0.0, 0.0, 1.0, 1.0]


def test_a_backdoor_run_records_its_attack_success(tmp_path, capsys):
  """--attack backdoor scores the triggered test set after every
  evaluation (``attack_success``), from the CLI as from a config."""
  out = tmp_path / "run"
  assert cli.main(TINY + [
      "--out", str(out), "--participation", "1.0", "--attack", "backdoor",
      "--attack-arg", "target=3", "--attack-arg", "boost=2",
      "--attack-fraction", "0.5"]) == 0
  capsys.readouterr()
  record = _strict((out / "config.json").read_text())
  experiment.check_config(record)
  assert record["attack"]["args"] == {
      "target": 3, "boost": 2, "poison_fraction": 0.5, "trigger_size": 3,
      "trigger_value": None}
  rows = _strict((out / "history.json").read_text())["rows"]
  success = [row["attack_success"] for row in rows]
  assert len(success) == len(rows) and all(0 <= v <= 1 for v in success)


def test_tiny_dp_run_records_epsilon_and_stops_at_the_target(tmp_path,
                                                             capsys):
  from fedjax_agg import privacy
  want = privacy.epsilons(0.7, 4, num_clients=4, cohort_size=2,
                          delta=1e-6)
  target = float((want[1] + want[2]) / 2)  # allows exactly 2 rounds
  out = tmp_path / "run"
  with pytest.warns(UserWarning, match="target_epsilon"):
    assert cli.main(TINY + [
        "--out", str(out), "--rounds", "4", "--aggregator", "dp_fedavg",
        "--agg-arg", "noise_multiplier=0.7", "--target-epsilon",
        str(target), "--dp-delta", "1e-6"]) == 0
  capsys.readouterr()
  record = _strict((out / "config.json").read_text())
  experiment.check_config(record)
  assert record["privacy"]["delta"] == 1e-6
  assert record["provenance"]["algorithms"]["dp_fedavg"]["privacy"][
      "noise_multiplier"] == 0.7
  history = _strict((out / "history.json").read_text())
  got = [row["epsilon"] for row in history["rows"][1:]]
  np.testing.assert_allclose(got, want[:2], rtol=1e-12)
  assert history["config"]["privacy"]["stopped_by"] == "target_epsilon"
  assert history["config"]["privacy"]["rounds_run"] == 2


@pytest.mark.parametrize("flags,flag", [
    (["--target-epsilon", "5"], "--target-epsilon"),
    (["--aggregator", "dp_fedavg", "--target-epsilon", "-1"],
     "--target-epsilon"),
    (["--aggregator", "dp_fedavg", "--dp-delta", "2"], "--dp-delta"),
    (["--aggregator", "dp_fedavg", "--dp-accountant", "pld"],
     "--dp-accountant"),
])
def test_privacy_flag_errors_name_the_flag(flags, flag, tmp_path, capsys):
  line = _error_line(capsys, TINY + ["--out", str(tmp_path / "r")] + flags)
  assert flag in line, line


@pytest.mark.parametrize("sweep_flags", [[], ["--seeds", "0,1"]])
def test_early_stopping_from_the_command_line(sweep_flags, tmp_path,
                                              capsys):
  # min_delta 1: no accuracy improves by more, so round 1 ends each run.
  out = tmp_path / "run"
  assert cli.main(TINY + sweep_flags + [
      "--out", str(out), "--rounds", "4", "--early-stopping",
      "test_accuracy", "--patience", "1", "--min-delta", "1.0"]) == 0
  capsys.readouterr()
  record = _strict((out / "config.json").read_text())
  assert record["early_stopping"] == {"metric": "test_accuracy",
                                      "mode": "max", "patience": 1,
                                      "min_delta": 1.0}
  folders = ["seed0", "seed1"] if sweep_flags else [""]
  for folder in folders:
    history = _strict((out / folder / "history.json").read_text())
    assert [row["round"] for row in history["rows"]] == [0, 1]
    assert history["config"]["stopped_by"] == "EarlyStopping"


def test_cli_writes_history_and_plot(fashion, tmp_path, capsys):
  del fashion
  out = tmp_path / "run"
  code = cli.main([
      "--dataset", "fashion_mnist", "--source", "files", "--partition",
      "shards", "--num-clients", "10", "--max-train-examples", "2000",
      "--model", "mlp2", "--rounds", "2", "--participation", "0.5",
      "--lr", "0.1", "--out", str(out), "--no-progress", "--partition-plot"])
  assert code == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert summary["final_test_accuracy"] > summary["initial_test_accuracy"]
  for name in ("history.csv", "history.json", "curves.png",
               "partition.png"):
    assert os.path.getsize(out / name) > 0
  with open(out / "history.json") as f:
    saved = json.load(f)
  assert len(saved["rows"]) == 3 and saved["config"]["algorithm"] == "fedavg"
