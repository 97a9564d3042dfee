"""The command line writes nothing before the run has passed its checks,
and what a config says of its seeds and systems is what runs."""

import json

import pytest

from fedjax_agg import cli
from fedjax_agg import experiment
from fedjax_agg import spec

from tests.cli.test_cli import TINY
from tests.cli.test_cli import _error_line
from tests.cli.test_sweep_checkpoints import CONFIG as SEEDS_CONFIG


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
    (["--aggregator", "fednova", "--secagg-bits", "16"],
     "systems.secagg_bits: algorithms.fednova (fednova): secure "
     "aggregation cannot run fednova"),
    (["--availability", "intervals", "--availability-arg",
      "path=MISSING.csv"], "MISSING.csv"),
])
def test_refusals_inside_the_run_come_before_any_file(flags, named,
                                                      tmp_path, capsys):
  out = tmp_path / "run"
  line = _error_line(capsys, TINY + ["--out", str(out)] + flags)
  assert named in line, line
  assert not out.exists(), _files(out)


def _leaf_shakespeare(folder) -> str:
  """A LEAF Shakespeare split of two speakers: its task (next-character
  prediction, per-token targets) is known only from its files."""
  line = ("To be, or not to be: that is the question; whether 'tis nobler "
          "in the mind to suffer")[:80]
  for split, rows in (("train", 3), ("test", 1)):
    users = {f"HAMLET_{i}": {"x": [line] * rows, "y": ["s"] * rows}
             for i in range(2)}
    (folder / split).mkdir(parents=True)
    (folder / split / f"{split}.json").write_text(json.dumps({
        "users": list(users), "num_samples": [rows] * 2,
        "user_data": users}))
  return str(folder)


def _refused_configs(tmp_path) -> dict:
  """Name -> (a config every entry point must refuse before writing, the
  key path its error names)."""
  from tests.experiment.test_runs import MNIST_5K  # pylint: disable=g-import-not-at-top
  return {
      "fednova_on_a_secure_sum": (experiment.override(MNIST_5K, {
          "algorithms": {"FedNova": {"aggregator": "fednova"}},
          "systems": {"secagg_bits": 16}}), "systems.secagg_bits"),
      "backdoor_on_a_text_federation": ({
          "name": "leaf_text",
          "dataset": {"name": "leaf",
                      "data_dir": _leaf_shakespeare(tmp_path / "leaf")},
          "partition": {"name": "natural", "num_clients": 2},
          "model": {"name": "char_lstm",
                    "args": {"embed_dim": 4, "hidden": 8}},
          "train": {"rounds": 1, "batch_size": 2},
          "attack": {"name": "backdoor", "args": {"target": 1}},
          "algorithms": {"FedAvg": {"aggregator": "fedavg"}}}, "attack"),
  }


@pytest.mark.parametrize("name", ["fednova_on_a_secure_sum",
                                  "backdoor_on_a_text_federation"])
def test_every_entry_point_refuses_alike_before_any_file(name, tmp_path,
                                                         capsys):
  config, path = _refused_configs(tmp_path)[name]
  # Python and JSON: the description's checks, with those that need the
  # data read (``load_dataset``), before anything is written.
  with pytest.raises(spec.ConfigError) as raised:
    experiment.load_dataset(experiment.check_config(config))
  assert raised.value.path == path
  message = str(raised.value)
  out = tmp_path / "run_config"
  with pytest.raises(spec.ConfigError) as raised:
    experiment.run_config(config, str(out), progress=False)
  assert str(raised.value) == message
  assert not out.exists(), _files(out)
  # The command line, from the same config file.
  file = tmp_path / "config.json"
  file.write_text(json.dumps(config))
  out = tmp_path / "cli"
  line = _error_line(capsys, ["--config", str(file), "--out", str(out),
                              "--no-progress"])
  assert line == f"error: --config {file}: {message}", line
  assert not out.exists(), _files(out)


def test_a_config_file_giving_a_key_twice_is_refused_before_any_file(
    tmp_path, capsys):
  from tests.cli._util import _config_file  # pylint: disable=g-import-not-at-top
  path = _config_file(tmp_path)
  text = open(path).read()
  assert text.count('"train": {') == 1
  with open(path, "w") as f:
    f.write(text.replace('"train": {', '"train": {"rounds": 30, '))
  out = tmp_path / "run"
  line = _error_line(capsys, ["--config", path, "--out", str(out)])
  assert line.startswith(f"error: --config {path}: train.rounds: given "
                         "twice (30, then 5)"), line
  assert not out.exists()


def test_a_configs_vmap_seeds_false_runs_its_seeds_one_after_the_other(
    tmp_path, capsys):
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  config = {**SEEDS_CONFIG, "vmap_seeds": False}
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


def test_a_run_never_overwrites_an_earlier_run(tmp_path, capsys):
  out = tmp_path / "run"
  first = TINY + ["--out", str(out), "--lr", "0.05"]
  cli.main(first)
  capsys.readouterr()
  before = _files(out)
  line = _error_line(capsys, first[:-1] + ["0.1"])
  assert line.startswith("error: --out: "), line
  assert "already holds a run" in line and "--overwrite" in line, line
  assert _files(out) == before
  # --overwrite replaces it; a sweep into it keeps none of its files.
  cli.main(first + ["--seeds", "0,1", "--overwrite"])
  capsys.readouterr()
  after = _files(out)
  assert "history.csv" not in after and "history.json" not in after
  assert {"seed0/history.csv", "seed1/history.csv", "summary.csv",
          "config.json"} <= set(after)
  # And a single run over the sweep leaves no member folder behind.
  cli.main(first + ["--overwrite"])
  capsys.readouterr()
  assert not (out / "seed0").exists() and not (out / "summary.csv").exists()
  assert json.loads((out / "config.json").read_text())["provenance"][
      "execution"]["overwrite"] is True


def test_a_compared_configs_refusal_is_one_line_naming_out(tmp_path,
                                                           capsys):
  """Several algorithms without --algorithm (run_config's path): a
  reused --out is refused in one line naming --out, before the resolved
  config is shown; the config is shown once the runs pass their checks."""
  config = experiment.override(SEEDS_CONFIG, {
      "seeds": [0], "train.rounds": 1,
      "algorithms": {"A": {"aggregator": "fedavg"},
                     "B": {"aggregator": "fedmedian"}}})
  path = tmp_path / "two.json"
  path.write_text(json.dumps(config))
  out = tmp_path / "run"
  assert cli.main(["--config", str(path), "--out", str(out),
                   "--no-progress"]) == 0
  shown = [line for line in capsys.readouterr().err.splitlines()
           if line.startswith("config: ")]
  assert len(shown) == 1
  before = _files(out)
  with pytest.raises(SystemExit):
    cli.main(["--config", str(path), "--out", str(out), "--no-progress"])
  err = [line for line in capsys.readouterr().err.splitlines()
         if not line.startswith("note: ")]
  assert len(err) == 1 and err[0].startswith("error: --out: "), err
  assert "already holds a run" in err[0]
  assert _files(out) == before


def test_an_earlier_runs_checkpoints_are_resumed_or_deleted_by_the_user(
    tmp_path, capsys):
  """An interrupted run leaves checkpoints (written whatever
  --checkpoint-every says): a fresh run over it, --overwrite included,
  is refused up front naming the folder and both ways on; nothing is
  deleted. The same from run_config."""
  out = tmp_path / "run"
  assert cli.main(TINY + ["--out", str(out)]) == 0
  (out / "checkpoint" / "7").mkdir(parents=True)  # as a stopped run's
  capsys.readouterr()
  before = _files(out)
  line = _error_line(capsys, TINY + ["--out", str(out), "--overwrite"])
  assert line.startswith("error: --overwrite: "), line
  assert "holds the checkpoints of an earlier run (rounds [7])" in line
  assert "--resume" in line and "delete that folder" in line, line
  assert _files(out) == before and (out / "checkpoint" / "7").is_dir()
  folder = tmp_path / "python"
  experiment.run_config(SEEDS_CONFIG, str(folder), progress=False)
  (folder / "checkpoints" / "FedAvg" / "seed1" / "3").mkdir(parents=True)
  with pytest.raises(ValueError, match="holds the checkpoints"):
    experiment.run_config(SEEDS_CONFIG, str(folder), progress=False,
                          overwrite=True)
  assert (folder / "checkpoints" / "FedAvg" / "seed1" / "3").is_dir()


def test_overwrite_and_resume_are_exclusive_and_version_prints(tmp_path,
                                                               capsys):
  line = _error_line(capsys, TINY + ["--out", str(tmp_path / "r"),
                                     "--resume", "--overwrite"])
  assert line.startswith("error: --overwrite: "), line
  with pytest.raises(SystemExit) as raised:
    cli.main(["--version"])
  assert raised.value.code == 0
  assert capsys.readouterr().out.startswith("fedjax_agg ")


def test_run_config_and_save_run_refuse_a_folder_holding_a_run(tmp_path):
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import history  # pylint: disable=g-import-not-at-top
  from tests.experiment.test_runs import MNIST_5K
  experiment.run_config(MNIST_5K, str(tmp_path), progress=False)
  before = _files(tmp_path)
  with pytest.raises(ValueError, match="already holds a run"):
    experiment.run_config(MNIST_5K, str(tmp_path), progress=False)
  assert _files(tmp_path) == before
  experiment.run_config(MNIST_5K, str(tmp_path), progress=False,
                        overwrite=True)
  one = history.History([{"round": 0}], [], {})
  with pytest.raises(ValueError, match="already holds a run"):
    history.save_run(str(tmp_path), {"run": one})
  history.save_run(str(tmp_path), {"run": one}, overwrite=True)
  assert not (tmp_path / "FedAdp").exists()  # the earlier run is gone
  assert sorted(_files(tmp_path)) == [
      ".fedjax_agg-manifest.json", "history.csv", "history.json"]
  # ... and the manifest lists exactly what the new one wrote.
  from fedjax_agg import manifest  # pylint: disable=g-import-not-at-top
  assert sorted(manifest.read(str(tmp_path))["files"]) == [
      "history.csv", "history.json"]


def test_a_subset_in_place_of_the_dataset_is_announced(tmp_path, capsys):
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  out = tmp_path / "run"
  cli.main(TINY + ["--out", str(out)])
  err = capsys.readouterr().err
  notes = [line for line in err.splitlines() if line.startswith("note: ")]
  # Once the subset, once the cut that kept one class of its sorted rows.
  assert len([n for n in notes if "'mnist_5k' subset" in n]) == 1, err
  assert len([n for n in notes if "hold 1 of its 10 classes" in n]) == 1, err
  assert len(notes) == 2, err
  saved = json.loads((out / "history.json").read_text())
  assert "mnist_5k" in saved["config"]["data_substitution"]
  config = json.loads((out / "config.json").read_text())
  dataset = experiment.load_dataset(config)
  assert experiment.setting_title(config, dataset).endswith(
      "[subset: mnist_5k]")
  assert "subset" not in experiment.setting_title(config)


def test_resume_says_where_it_picks_up(tmp_path, capsys):
  out = tmp_path / "run"
  run = TINY + ["--out", str(out), "--checkpoint-every", "1"]
  cli.main(run)
  capsys.readouterr()
  cli.main(run + ["--resume"])
  err = capsys.readouterr().err
  assert "resumed from round 1 of 1 (already finished)" in err, err
  assert "rounds:" not in err  # no empty progress bar


def test_an_async_run_is_named_as_such_and_plotted_against_time(tmp_path,
                                                                 capsys):
  from fedjax_agg import history  # pylint: disable=g-import-not-at-top
  from fedjax_agg import report  # pylint: disable=g-import-not-at-top
  out = tmp_path / "async"
  cli.main(TINY + ["--out", str(out), "--concurrency", "3",
                   "--num-clients", "6", "--rounds", "2"])
  capsys.readouterr()
  run = history.History.load(str(out))
  assert report.async_tag(run) == " (async, C=3)"
  assert (out / "accuracy_by_time.png").stat().st_size > 0
  assert list(report.load_run(str(out))) == ["async (async, C=3)"]


def test_warnings_are_one_line_without_their_source(monkeypatch):
  import warnings  # pylint: disable=g-import-not-at-top
  shown = []

  def warns(argv):
    del argv
    shown.append(warnings.formatwarning(
        "a short run for its agent", UserWarning, "fedjax_agg/x.py", 12,
        "warnings.warn(...)"))
    return 0
  before = warnings.formatwarning
  monkeypatch.setattr(cli, "_main", warns)
  assert cli.main([]) == 0
  assert shown == ["warning: a short run for its agent\n"]
  assert warnings.formatwarning is before  # restored when the run ends


def test_run_config_builds_every_algorithm_before_its_first_file(tmp_path):
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from tests.experiment.test_runs import MNIST_5K
  # The second algorithm's model cannot take the data: refused when it is
  # built, before config.json or partition.png exists.
  config = experiment.override(MNIST_5K, {"algorithms": {
      "A": {"aggregator": "fedavg"}, "B": {"aggregator": "fedavg"}},
      "model": {"name": "char_lstm"}})
  with pytest.raises(ValueError, match="input_shape of 'char_lstm'"):
    experiment.run_config(config, str(tmp_path / "out"), progress=False)
  assert not (tmp_path / "out").exists()
