"""What runs write: strict atomic JSON, plots that leave matplotlib's
backend alone, and output folders checked before anything runs."""

import json
import math
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import experiment
from fedjax_agg import jsonio
from fedjax_agg import plotting
from fedjax_agg.history import History


def _strict_load(path):
  def refuse(token):
    raise ValueError(f"not JSON: {token}")
  with open(path) as f:
    return json.load(f, parse_constant=refuse)


def test_dump_json_is_strict_and_converts_arrays(tmp_path):
  path = tmp_path / "x.json"
  jsonio.dump_json({
      "nan": math.nan, "inf": -math.inf, "f32": np.float32(0.5),
      "int": np.int64(3), "bool": np.bool_(True),
      "array": np.array([1.0, np.nan, np.inf]),
      "jax": jnp.arange(3), "bf16": jnp.ones(2, jnp.bfloat16),
      "nested": ({"t": (1, 2)}, [math.nan]), 7: "int key",
      "other": object}, str(path))
  data = _strict_load(path)
  assert data["nan"] is None and data["inf"] is None
  assert data["f32"] == 0.5 and data["int"] == 3 and data["bool"] is True
  assert data["array"] == [1.0, None, None]
  assert data["jax"] == [0, 1, 2] and data["bf16"] == [1.0, 1.0]
  assert data["nested"] == [{"t": [1, 2]}, [None]]
  assert data["7"] == "int key" and "object" in data["other"]
  assert os.listdir(tmp_path) == ["x.json"]  # no temporary file left
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


def test_dump_json_failure_keeps_the_old_file(tmp_path):
  path = tmp_path / "x.json"
  jsonio.dump_json({"a": 1}, str(path))

  class Bad:
    def __array__(self, *args, **kwargs):
      raise RuntimeError("no")
  with pytest.raises(RuntimeError):
    jsonio.dump_json({"a": Bad()}, str(path))
  assert _strict_load(path) == {"a": 1}
  assert os.listdir(tmp_path) == ["x.json"]


def _history(values):
  rows = [{"round": r, "test_accuracy": v, "test_loss": 1 - v}
          for r, v in enumerate(values)]
  return History(rows=rows, client_rows=[], config={})


def test_curves_have_integer_round_ticks_and_a_title():
  fig = plotting.curves_figure(
      {"FedAvg": [_history([0.1, 0.5, 0.7]), _history([0.2, 0.4, 0.8])]},
      title="mnist, iid(N=10)")
  fig.canvas.draw()
  assert fig.get_suptitle() == "mnist, iid(N=10)"
  for ax in fig.axes:
    ticks = [t for t in ax.get_xticks() if 0 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_plotting_leaves_the_backend_alone(tmp_path):
  script = f"""
import sys
import matplotlib
matplotlib.use("svg")
from fedjax_agg import experiment, plotting
from fedjax_agg.history import History
rows = [{{"round": r, "test_accuracy": 0.1 * r, "test_loss": 1.0}}
        for r in range(3)]
plotting.plot_history({{"a": History(rows, [], {{}})}},
                      {str(tmp_path / "p.png")!r})
assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
assert "matplotlib.pyplot" not in sys.modules
"""
  result = subprocess.run([sys.executable, "-c", script], capture_output=True,
                          text=True, check=False, timeout=120)
  assert result.returncode == 0, result.stderr
  assert os.path.getsize(tmp_path / "p.png") > 0


def test_check_output_dir(tmp_path):
  out = tmp_path / "new" / "out"
  assert experiment.check_output_dir(str(out), ["a/b.csv"]) == str(out)
  assert out.is_dir()
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
