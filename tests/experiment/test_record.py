"""What a run records: paths shown relative to the repository, output
folders checked before anything runs.
"""

import os

import numpy as np
import pytest

from fedjax_agg import experiment
from tests.experiment.test_runs import MNIST_5K


def test_records_show_paths_inside_the_repository_relative(tmp_path):
  import os
  root = os.path.dirname(os.path.dirname(
      os.path.dirname(os.path.abspath(__file__))))
  inside = os.path.join(root, "experiments", "x", "results")
  assert experiment.shown_path(inside) == os.path.join("experiments", "x",
                                                       "results")
  assert experiment.shown_path(str(tmp_path)) == str(tmp_path)


def test_check_output_dir(tmp_path):
  out = tmp_path / "new" / "out"
  assert experiment.check_output_dir(str(out), ["a/b.csv"]) == str(out)
  assert not (tmp_path / "new").exists()  # checked, not created
  out.mkdir(parents=True)
  (out / "taken").mkdir()
  with pytest.raises(ValueError, match="taken is a directory"):
    experiment.check_output_dir(str(out), ["ok.csv", "taken"])
  (out / "a_file").write_text("")
  with pytest.raises(ValueError, match="a_file is a file"):
    experiment.check_output_dir(str(out), ["a_file/seed0.csv"])
  with pytest.raises(ValueError, match="exists and is not a directory"):
    experiment.check_output_dir(str(out / "a_file"))
  with pytest.raises(ValueError, match="cannot create"):
    experiment.check_output_dir(str(out / "a_file" / "below"))


def test_check_output_dir_refuses_a_folder_it_cannot_write(tmp_path,
                                                          monkeypatch):
  locked = str(tmp_path / "locked")
  os.mkdir(locked)
  real_access = os.access
  monkeypatch.setattr(os, "access", lambda path, mode: (
      False if str(path) == locked else real_access(path, mode)))
  with pytest.raises(ValueError, match="locked is not writable"):
    experiment.check_output_dir(locked)
  with pytest.raises(ValueError, match="locked is not writable"):
    experiment.check_output_dir(str(tmp_path), ["locked/history.csv"])


def test_the_record_gives_fednova_the_normalisers_the_run_used(tmp_path):
  """FedNova's momentum and proximal mu come from the training; the
  record holds the values the run normalised with, which the history's
  tau_eff recomputes (||a||_1 of the paper, numpy), not the factory's
  defaults."""
  import json  # pylint: disable=g-import-not-at-top
  config = experiment.override(MNIST_5K, {
      "partition": {"name": "iid", "num_clients": 4},
      "algorithms": {
          "FedNova": {"aggregator": "fednova"},
          "FedNovaMomentum": {"aggregator": "fednova",
                              "train": {"momentum": 0.9}},
          "FedNovaProx": {"aggregator": "fednova", "objective": "fedprox",
                          "objective_args": {"mu": 0.5}}}})
  experiment.run_config(config, str(tmp_path), progress=False)
  record = json.loads((tmp_path / "config.json").read_text())
  used = {name: entry["aggregator_args"] for name, entry in
          record["provenance"]["algorithms"].items()}
  assert used["FedNovaMomentum"]["momentum"] == 0.9
  assert used["FedNovaProx"]["proximal_mu"] == 0.5
  assert used["FedNova"]["momentum"] == used["FedNova"]["proximal_mu"] == 0

  def tau_eff(name):
    rows = json.loads((tmp_path / name / "history.json").read_text())["rows"]
    return rows[-1]["tau_eff"]
  # 100 examples a client, batches of 20: plain SGD's ||a||_1 is tau = 5.
  tau = tau_eff("FedNova")
  assert tau == 5
  for name in ("FedNovaMomentum", "FedNovaProx"):
    args = used[name]
    rho, shrink = args["momentum"], args["learning_rate"] * args[
        "proximal_mu"]
    powers = np.arange(tau)
    want = (np.sum((1 - shrink) ** powers) if shrink else
            np.sum((1 - rho ** (tau - powers)) / (1 - rho)))
    assert tau_eff(name) == pytest.approx(want, rel=1e-5), name
    # The config part says no other value: the training's (or none).
    stated = record["algorithms"][name]["aggregator_args"]
    assert stated.get("momentum", rho) == rho
    assert stated.get("proximal_mu", args["proximal_mu"]) == args[
        "proximal_mu"]
