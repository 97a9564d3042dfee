"""What a run records: paths shown relative to the repository, output
folders checked before anything runs.
"""

import os

import pytest

from fedjax_agg import experiment


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
