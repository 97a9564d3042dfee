"""``report``: run folders read back, grouped into curves, tabulated
against numpy, and the ``report`` command's one-line errors."""

import os
import warnings

import numpy as np
import pytest

from fedjax_agg import cli
from fedjax_agg import history
from fedjax_agg import report
from fedjax_agg.history import History


def _history(accuracies, seconds=None, concurrency=None):
  rows = []
  for r, accuracy in enumerate(accuracies):
    row = {"round": r, "test_accuracy": accuracy}
    if seconds is not None:
      row.update(sim_time_s=seconds * r, uplink_bytes=1000 * r)
    rows.append(row)
  config = {} if concurrency is None else {"systems": {
      "concurrency": concurrency}}
  return History(rows, [], config)


@pytest.fixture
def runs(tmp_path):
  single = tmp_path / "plain"
  history.save_run(str(single), {"run": _history([0.1, 0.5, 0.7], 2.0)})
  seeds = tmp_path / "seeds"
  history.save_run(str(seeds), {
      "seed0": _history([0.1, 0.6, 0.8], 1.0, concurrency=4),
      "seed1": _history([0.1, 0.4, 0.6], 1.0, concurrency=4)})
  grid = tmp_path / "grid"
  history.save_run(str(grid), {
      "alpha1_seed0": _history([0.1, 0.2, 0.3], 1.0),
      "alpha5_seed0": _history([0.1, 0.3, 0.4], 1.0),
      "alpha5_seed1": _history([0.1, 0.5, 0.6], 1.0)})
  compared = tmp_path / "compared"
  for name, values in (("FedAvg", [0.1, 0.65]), ("FedProx", [0.1, 0.75])):
    history.save_run(str(compared / name), {"run": _history(values, 3.0)})
  return single, seeds, grid, compared


def test_run_folders_read_back_into_curves(runs):
  single, seeds, grid, compared = runs
  assert list(report.load_run(str(single))) == ["plain"]
  assert list(report.load_run(str(seeds))) == ["seeds (async, C=4)"]
  assert sorted(report.load_run(str(grid))) == ["grid alpha1",
                                                "grid alpha5"]
  assert sorted(report.load_run(str(compared))) == ["FedAvg", "FedProx"]
  loaded = report.load_run(str(seeds))["seeds (async, C=4)"]
  np.testing.assert_array_equal(loaded[1].column("test_accuracy"),
                                [0.1, 0.4, 0.6])


def test_tables_match_numpy_and_name_the_convention(runs, tmp_path):
  made = report.report([str(r) for r in runs], str(tmp_path / "out"),
                       target=0.55)
  rows = {row["name"]: row for row in made["rows"]}
  seeds = rows["seeds (async, C=4)"]
  assert seeds["final_mean"] == pytest.approx(np.mean([0.8, 0.6]))
  assert seeds["final_sd"] == pytest.approx(np.std([0.8, 0.6]))
  # Seed 0 reaches 0.55 at round 1, seed 1 at round 2.
  assert seeds["rounds_to_target"] == pytest.approx(1.5)
  assert seeds["time_s_to_target"] == pytest.approx(1.5)
  assert seeds["uplink_bytes_to_target"] == pytest.approx(1500)
  assert seeds["reached"] == "2/2"
  assert rows["grid alpha1"]["reached"] == "0/1"
  assert rows["grid alpha1"]["rounds_to_target"] is None
  markdown = open(made["paths"]["report.md"]).read()
  assert "ddof = 0" in markdown and "| seeds (async, C=4) | 2 |" in markdown
  latex = open(made["paths"]["report.tex"]).read()
  assert "\\begin{tabular}" in latex and "$\\pm$" in latex
  for axis in report.AXES:
    assert os.path.getsize(made["paths"][axis]) > 0


def test_the_report_command(runs, tmp_path, capsys):
  out = tmp_path / "cmd"
  assert cli.main(["report", str(runs[0]), str(runs[3]), "--out",
                   str(out)]) == 0
  assert "| FedProx | 1 |" in capsys.readouterr().out
  with pytest.raises(SystemExit) as raised:
    cli.main(["report", str(tmp_path / "nothing"), "--out", str(out)])
  assert raised.value.code == 2
  assert capsys.readouterr().err.startswith("error: ")
  with pytest.raises(SystemExit):
    cli.main(["report", str(runs[0]), "--metric", "test_acc",
              "--out", str(out)])
  assert "test_acc" in capsys.readouterr().err


def test_the_initial_model_is_drawn_at_zero_time_and_bytes(tmp_path):
  # A run's row 0 (the initial model) leaves the cumulative columns blank,
  # as the loop writes it; the curve starts at 0 s and 0 bytes, without
  # numpy's "Mean of empty slice" for the blank column.
  rows = [{"round": 0, "test_accuracy": 0.1},
          {"round": 1, "test_accuracy": 0.4, "sim_time_s": 5.0,
           "uplink_bytes": 2e6},
          {"round": 2, "test_accuracy": 0.6, "sim_time_s": 9.0,
           "uplink_bytes": 4e6}]
  run = History(rows, [], {})
  for axis, want in (("sim_time_s", [0.0, 5.0, 9.0]),
                     ("uplink_bytes", [0.0, 2e6, 4e6]),
                     ("round", [0.0, 1.0, 2.0])):
    np.testing.assert_allclose(report.curve_x([run, run], axis), want)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      path = report.plot_curves({"a": [run, run]}, "test_accuracy", axis,
                                str(tmp_path / f"{axis}.png"))
    assert os.path.getsize(path) > 0


def test_a_comparison_keeps_its_records_order_colours_and_setting(
    tmp_path, monkeypatch):
  """The report draws a run_config folder's algorithms in its config's
  order with the colours its curves.png gives them, names the setting in
  the title and puts the loss beside the accuracy."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import plotting  # pylint: disable=g-import-not-at-top
  from tests.experiment.test_runs import MNIST_5K  # pylint: disable=g-import-not-at-top
  config = experiment.override(MNIST_5K, {"algorithms": {
      "Zeta": {"aggregator": "fedavg"}, "Alpha": {"aggregator": "fedadp"}}})
  run = tmp_path / "run"
  experiment.run_config(config, str(run), progress=False)
  assert list(report.load_run(str(run))) == ["Zeta", "Alpha"]
  figures = []
  save = plotting.save_figure
  monkeypatch.setattr(plotting, "save_figure", lambda fig, path, **kw: (
      figures.append(fig), save(fig, path, **kw))[1])
  made = report.report([str(run)], str(tmp_path / "report"))
  assert [row["name"] for row in made["rows"]] == ["Zeta", "Alpha"]
  (fig,) = figures
  accuracy, loss = fig.axes
  assert loss.get_ylabel() == plotting.axis_label("test_loss")
  for ax in (accuracy, loss):
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["Zeta", "Alpha"]
    assert [line.get_color() for line in lines] == ["C0", "C1"]
  title = fig.texts[0].get_text().replace("\n", " ")
  # The setting as the run's record states it (every default written).
  import json  # pylint: disable=g-import-not-at-top
  record = json.loads((run / "config.json").read_text())
  del record["provenance"]
  assert experiment.setting_title(record) in title, title
  assert "shards(N=4" in title and "mlp2" in title
