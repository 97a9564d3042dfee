"""``report`` against hostile input: folder names that look like other
layouts, markup in names, broken history files, seeds of different
lengths, loss-like metrics and wrong arguments.

Expected values are computed here, independently, from the histories'
values (numpy) and from the Markdown and LaTeX rules (a table-row parser
and a LaTeX text decoder written in this file)."""

import math
import os
import re

import numpy as np
import pytest

from fedjax_agg import cli
from fedjax_agg import history
from fedjax_agg import report
from fedjax_agg.history import History
from fedjax_agg.report import _plots as report_plots


def _history(values, metric="test_accuracy", seconds=None):
  rows = []
  for r, value in enumerate(values):
    row = {"round": r, metric: value}
    if seconds is not None and r:
      row.update(sim_time_s=seconds * r, uplink_bytes=1000 * r)
    rows.append(row)
  return History(rows, [], {})


def _write_json(folder, text):
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "history.json"), "w") as f:
    f.write(text)
  return os.path.join(str(folder), "history.json")


def _error_of(argv, capsys):
  """The ``report`` command's stderr for ``argv``; it must exit with 2."""
  capsys.readouterr()
  with pytest.raises(SystemExit) as raised:
    cli.main(["report", *argv])
  assert raised.value.code == 2
  captured = capsys.readouterr()
  assert captured.out == ""
  return captured.err


def _figures(monkeypatch):
  """The figures ``report`` draws from now on, as it draws them."""
  figures = []
  new_figure = report_plots.new_figure
  monkeypatch.setattr(report_plots, "new_figure",
                      lambda size: figures.append(new_figure(size))
                      or figures[-1])
  return figures


def _one_error_line(err):
  lines = err.splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), err
  return lines[0]


# Member and algorithm folders.


def test_an_algorithm_named_like_a_member_keeps_its_siblings(tmp_path):
  compared = tmp_path / "compared"
  history.save_run(str(compared / "FedAvg"), {"run": _history([0.1, 0.6])})
  history.save_run(str(compared / "FedProx_seed2"),
                   {"run": _history([0.2, 0.7])})
  history.save_run(str(compared / "FedNova"), {
      "seed0": _history([0.1, 0.5]), "seed1": _history([0.1, 0.3])})
  curves = report.load_run(str(compared))
  assert sorted(curves) == ["FedAvg", "FedNova", "FedProx_seed2"]
  np.testing.assert_array_equal(
      curves["FedProx_seed2"][0].column("test_accuracy"), [0.2, 0.7])
  assert len(curves["FedNova"]) == 2
  # A run of members is still one: its points end in a number.
  grid = tmp_path / "grid"
  history.save_run(str(grid), {"lr0.1_seed0": _history([0.1, 0.2]),
                               "lr1e-05_seed0": _history([0.1, 0.3]),
                               "lr1e-05_seed1": _history([0.1, 0.4])})
  assert sorted(report.load_run(str(grid))) == ["grid lr0.1",
                                                "grid lr1e-05"]


def test_a_run_folder_beside_member_folders_is_refused(tmp_path):
  mixed = tmp_path / "mixed"
  history.save_run(str(mixed), {"run": _history([0.1, 0.6])})
  history.save_run(str(mixed / "seed0"), {"run": _history([0.1, 0.7])})
  with pytest.raises(ValueError, match="mixed.*history.json.*seed0"):
    report.load_run(str(mixed))


# Target reaching.


def test_reached_counts_the_runs_that_reach_the_target(tmp_path):
  # No systems clock: no uplink bytes column, yet the count is per run.
  values = {"seed0": [0.1, 0.6, 0.7], "seed1": [0.1, 0.2, 0.55],
            "seed2": [0.1, 0.3, 0.4]}
  history.save_run(str(tmp_path / "run"),
                   {name: _history(v) for name, v in values.items()})
  target = 0.5
  row, = report.report([str(tmp_path / "run")], str(tmp_path / "out"),
                       target=target)["rows"]
  firsts = [int(np.argmax(np.array(v) >= target)) for v in values.values()
            if max(v) >= target]
  assert row["reached"] == f"{len(firsts)}/{len(values)}"
  assert row["rounds_to_target"] == pytest.approx(np.mean(firsts))
  assert row["time_s_to_target"] is None
  assert row["uplink_bytes_to_target"] is None
  row, = report.report([str(tmp_path / "run")], str(tmp_path / "huge"),
                       target=1e308)["rows"]
  assert row["reached"] == "0/3" and row["rounds_to_target"] is None


def test_a_target_reached_by_the_initial_model_takes_no_time(tmp_path):
  history.save_run(str(tmp_path / "run"),
                   {"run": _history([0.6, 0.7], seconds=3.0)})
  row, = report.report([str(tmp_path / "run")], str(tmp_path / "out"),
                       target=0.5)["rows"]
  assert (row["rounds_to_target"], row["time_s_to_target"],
          row["uplink_bytes_to_target"], row["reached"]) == (0, 0, 0, "1/1")


@pytest.mark.parametrize("target", ["nan", "inf", "-inf", "1e999", "0.5x",
                                    "", "seven"])
def test_the_command_refuses_a_target_that_is_no_finite_number(
    target, tmp_path, capsys):
  history.save_run(str(tmp_path / "run"), {"run": _history([0.1, 0.6])})
  out = tmp_path / "out"
  err = _error_of([str(tmp_path / "run"), "--target", target, "--out",
                   str(out)], capsys)
  assert "--target" in _one_error_line(err)
  assert not out.exists()


@pytest.mark.parametrize("target, error", [
    (math.nan, ValueError), (math.inf, ValueError), (-math.inf, ValueError),
    (np.float64("nan"), ValueError), (10**400, ValueError),
    ("0.5", TypeError), (True, TypeError),
    (np.bool_(True), TypeError), ([0.5], TypeError), (1j, TypeError)])
def test_report_refuses_a_target_that_is_no_finite_number(target, error,
                                                          tmp_path):
  history.save_run(str(tmp_path / "run"), {"run": _history([0.1, 0.6])})
  out = tmp_path / "out"
  with pytest.raises(error, match="target"):
    report.report([str(tmp_path / "run")], str(out), target=target)
  assert not out.exists()
  with pytest.raises(error, match="target"):
    report.table_rows(report.load_run(str(tmp_path / "run")),
                      "test_accuracy", target)


# Markup in names.

_MARKDOWN_PUNCTUATION = re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _markdown_cells(line):
  """A GitHub-flavoured Markdown table row's cells, as text: cells are
  split at pipes not escaped by a backslash; a backslash before ASCII
  punctuation stands for that character (CommonMark)."""
  assert line.startswith("|") and line.endswith("|"), line
  cells, cell, escaped = [], "", False
  for char in line[1:-1]:
    if escaped:
      assert re.fullmatch(f"[{_MARKDOWN_PUNCTUATION}]", char), line
      cell, escaped = cell + char, False
    elif char == "\\":
      escaped = True
    elif char == "|":
      cells, cell = cells + [cell.strip()], ""
    else:
      # Unescaped, these would start emphasis, code, links or HTML.
      assert char not in "*_`[]<>$&~", (char, line)
      cell += char
  assert not escaped, line
  return cells + [cell.strip()]


_LATEX_WORDS = {"textbackslash": "\\", "textasciicircum": "^",
                "textasciitilde": "~", "textbar": "|", "textless": "<",
                "textgreater": ">"}


def _latex_cells(line):
  """A LaTeX tabular row's cells, as the text they typeset: cells are
  split at unescaped ``&``; ``\\X`` for X in ``# $ % & _ { }`` and the
  ``\\text...{}`` commands stand for one character each; ``$\\pm$`` for
  ``±``. Any other special character, unescaped, fails."""
  assert line.endswith(" \\\\"), line
  tokens = re.finditer(r"\\(\w+)\{\}|\\([#$%&_{}])|\$\\pm\$|(.)",
                       line[:-3])
  cells, cell = [], ""
  for token in tokens:
    word, escaped, char = token.groups()
    if word is not None:
      cell += _LATEX_WORDS[word]
    elif escaped is not None:
      cell += escaped
    elif char is None:
      cell += "±"
    elif char == "&":
      cells, cell = cells + [cell.strip()], ""
    else:
      assert char not in "\\{}$^~_%#|<>", (char, line)
      cell += char
  return cells + [cell.strip()]


NAMES = ["a$b{c}^d~e_f&g%h#i\\j", "x|y", "*bold* [link](z) <b>", "50%_off",
         "tab\there", "back\\slash|pipe"]


def test_names_with_markup_keep_the_tables_intact(tmp_path):
  compared = tmp_path / "compared"
  for i, name in enumerate(NAMES):
    history.save_run(str(compared / name),
                     {"run": _history([0.1, 0.2 + 0.1 * i])})
  made = report.report([str(compared)], str(tmp_path / "out"), target=0.35)
  shown = {name: name.replace("\t", "\\t") for name in NAMES}
  markdown = open(made["paths"]["report.md"]).read().splitlines()
  header = _markdown_cells(markdown[0])
  body = [_markdown_cells(line) for line in markdown[2:2 + len(NAMES)]]
  assert all(len(cells) == len(header) for cells in body)
  assert sorted(cells[0] for cells in body) == sorted(shown.values())
  latex = open(made["paths"]["report.tex"]).read().splitlines()
  rows = [line for line in latex if line.endswith(" \\\\")]
  cells = [_latex_cells(line) for line in rows]
  assert all(len(c) == len(header) for c in cells)
  assert sorted(c[0] for c in cells[1:]) == sorted(shown.values())
  assert all(line.startswith("%") or "\t" not in line for line in latex)


def test_a_metric_with_markup_and_path_characters(tmp_path):
  metric = "../../a|b$c_loss"
  history.save_run(str(tmp_path / "run"), {
      "seed0": _history([2.0, 1.0], metric, seconds=1.0),
      "seed1": _history([2.0, 1.5], metric, seconds=1.0)})
  out = tmp_path / "deep" / "out"
  made = report.report([str(tmp_path / "run")], str(out), metric=metric)
  for path in made["paths"].values():
    assert os.path.dirname(os.path.abspath(path)) == str(out)
  assert sorted(os.listdir(tmp_path)) == ["deep", "run"]
  markdown = open(made["paths"]["report.md"]).read().splitlines()
  header = _markdown_cells(markdown[0])
  assert len(header) == len(_markdown_cells(markdown[2]))
  assert any(metric.replace("_", " ") in cell for cell in header)
  latex = open(made["paths"]["report.tex"]).read().splitlines()
  head = _latex_cells(next(line for line in latex if line.endswith("\\\\")))
  assert head == header


# Hostile history files.


@pytest.mark.parametrize("text, where", [
    ("[" * 1000 + "]" * 1000, "history.json"),
    ('{"rows": ' + "[" * 5000 + "]" * 5000 + "}", "history.json"),
    ('{"rows": [1, 2, 3]}', "rows[0]"),
    ('{"rows": []}', "rows"),
    ('{"rows": [{"round": 0, "test_accuracy": "n/a"}]}',
     "rows[0]['test_accuracy']"),
    ('{"rows": [{"round": 0, "test_accuracy": 0.1}, '
     '{"round": 1, "test_accuracy": true}]}', "rows[1]['test_accuracy']"),
    ('{"rows": [{"round": 0, "test_accuracy": [0.5]}]}',
     "rows[0]['test_accuracy']"),
    ('{"rows": [{"round": 0, "test_accuracy": 1e999}]}',
     "rows[0]['test_accuracy']"),
    ('{"rows": [{"round": 0, "test_accuracy": NaN}]}',
     "rows[0]['test_accuracy']"),
    ('{"rows": [{"round": 0, "test_accuracy": 0.1, "sim_time_s": "x"}]}',
     "rows[0]['sim_time_s']"),
    ('{"rows": [{"test_accuracy": 0.1}]}', "rows[0]['round']"),
    ('{"rows": [{"round": 0, "test_accuracy": 0.1}, '
     '{"round": 0, "test_accuracy": 0.2}]}', "rows[1]['round']"),
    ('{"rows": [{"round": "0", "test_accuracy": 0.1}]}', "rows[0]['round']"),
    ('{"rows": [{"round": 0, "test_accuracy": 0.1}], "config": [1]}',
     "config"),
    ('{"rows": [{"round": 0, "test_accuracy": 0.1}], '
     '"config": {"systems": 3}}', "config['systems']"),
    ('{"rows": [{"round": 0, "test_loss": 0.1}]}', "test_accuracy"),
    ('{"rows": [{"round": 0, "test_accuracy": null}]}', "test_accuracy"),
])
def test_a_hostile_history_is_one_error_naming_file_and_row(
    text, where, tmp_path, capsys):
  good = tmp_path / "good"
  history.save_run(str(good), {"run": _history([0.1, 0.6])})
  path = _write_json(tmp_path / "bad", text)
  with pytest.raises(ValueError) as raised:
    report.report([str(good), str(tmp_path / "bad")], str(tmp_path / "out"))
  assert path in str(raised.value) and where in str(raised.value)
  out = tmp_path / "cmd"
  line = _one_error_line(_error_of(
      [str(good), str(tmp_path / "bad"), "--out", str(out)], capsys))
  assert path in line and where in line
  assert not out.exists() and not (tmp_path / "out").exists()


def test_a_member_without_the_metric_is_named(tmp_path):
  # Every member, not only the first, must record the metric.
  history.save_run(str(tmp_path / "run"), {
      "seed0": _history([0.1, 0.6]),
      "seed1": _history([0.1, 0.6], metric="test_loss")})
  with pytest.raises(ValueError, match=r"seed1.history\.json.*test_accuracy"):
    report.report([str(tmp_path / "run")], str(tmp_path / "out"))


def test_seeds_of_different_lengths_are_reported_each_to_its_end(
    tmp_path, monkeypatch):
  # Early stopping ended seed 1 after round 2, seed 0 ran 4 rounds.
  long, short = [0.1, 0.4, 0.6, 0.5, 0.7], [0.1, 0.5, 0.3]
  history.save_run(str(tmp_path / "run"), {
      "seed0": _history(long, seconds=2.0),
      "seed1": _history(short, seconds=2.0)})
  figures = _figures(monkeypatch)
  made = report.report([str(tmp_path / "run")], str(tmp_path / "out"),
                       target=0.55)
  row, = made["rows"]
  assert row["final_rounds"] == [len(long) - 1, len(short) - 1]
  assert row["final_mean"] == pytest.approx(np.mean([long[-1], short[-1]]))
  assert row["final_sd"] == pytest.approx(np.std([long[-1], short[-1]]))
  assert row["best_mean"] == pytest.approx(np.mean([max(long), max(short)]))
  assert row["reached"] == "1/2" and row["rounds_to_target"] == 2
  markdown = open(made["paths"]["report.md"]).read()
  assert "different rounds" in markdown and "4, 2" in markdown
  for axis in report.AXES:
    assert os.path.getsize(made["paths"][axis]) > 0
  # The curve: each round's mean over the seeds that ran it.
  line, = figures[0].axes[0].get_lines()
  np.testing.assert_allclose(line.get_xdata(), np.arange(len(long)))
  np.testing.assert_allclose(line.get_ydata(), [
      np.mean([v[r] for v in (long, short) if r < len(v)])
      for r in range(len(long))])
  runs = report.load_run(str(tmp_path / "run"))["run"]
  np.testing.assert_allclose(report.curve_x(runs, "round"),
                             np.arange(len(long)))
  np.testing.assert_allclose(report.curve_x(runs, "sim_time_s"),
                             2.0 * np.arange(len(long)))


def test_the_final_value_is_the_last_evaluated_one(tmp_path, monkeypatch):
  # Test metrics only at evaluated rounds (here 1, 3 and 5 of 0..6): the
  # final value is the last evaluated one, at its round.
  rows = [{"round": r, **({"test_accuracy": 0.1 * r} if r % 2 else {})}
          for r in range(7)]
  history.save_run(str(tmp_path / "run"), {"run": History(rows, [], {})})
  row, = report.report([str(tmp_path / "run")],
                       str(tmp_path / "out"))["rows"]
  assert row["final_rounds"] == [5]
  assert row["final_mean"] == pytest.approx(0.5)
  # In memory, a run that diverged holds NaN (saved as null): its final
  # value is NaN, at its round; its best is over the finite values.
  rows[5]["test_accuracy"] = math.nan
  run = History(rows, [], {})
  row, = report.table_rows({"run": [run]}, "test_accuracy")
  assert row["final_rounds"] == [5] and math.isnan(row["final_mean"])
  assert row["best_mean"] == pytest.approx(0.3)
  figures = _figures(monkeypatch)
  path = report.plot_curves({"run": [run]}, "test_accuracy", "round",
                            str(tmp_path / "plot.png"))
  assert os.path.getsize(path) > 0
  line, = figures[0].axes[0].get_lines()
  np.testing.assert_allclose(line.get_xdata(), [1, 3])
  np.testing.assert_allclose(line.get_ydata(), [0.1, 0.3])


def test_an_out_that_is_a_file_is_refused(tmp_path, capsys):
  history.save_run(str(tmp_path / "run"), {"run": _history([0.1, 0.6])})
  taken = tmp_path / "taken.txt"
  taken.write_text("keep me")
  for out in (taken, taken / "sub"):
    with pytest.raises(ValueError, match="out"):
      report.report([str(tmp_path / "run")], str(out))
    line = _one_error_line(_error_of(
        [str(tmp_path / "run"), "--out", str(out)], capsys))
    assert "--out" in line and str(taken) in line
  assert taken.read_text() == "keep me"
  # A folder where a file of the report goes: refused before any plot.
  out = tmp_path / "out"
  (out / "report.md").mkdir(parents=True)
  with pytest.raises(ValueError, match="report.md"):
    report.report([str(tmp_path / "run")], str(out))
  assert os.listdir(out) == ["report.md"]


# Loss-like metrics.


def test_metric_directions():
  for metric in ("test_loss", "train_loss", "cohort_loss_before",
                 "xentloss", "uplink_bytes", "sim_time_s", "wall_time",
                 "test_perplexity"):
    assert report.metric_direction(metric) == "min", metric
  for metric in ("test_accuracy", "f1", "test_auc"):
    assert report.metric_direction(metric) == "max", metric


def test_best_and_target_of_a_loss_are_the_lowest(tmp_path, capsys):
  losses = {"seed0": [2.3, 0.9, 0.4, 0.6], "seed1": [2.3, 1.2, 0.8, 0.7]}
  history.save_run(str(tmp_path / "run"), {
      name: _history(v, "test_loss") for name, v in losses.items()})
  target = 0.75
  made = report.report([str(tmp_path / "run")], str(tmp_path / "out"),
                       metric="test_loss", target=target)
  row, = made["rows"]
  values = np.array(list(losses.values()))
  assert row["best_mean"] == pytest.approx(values.min(1).mean())
  assert row["best_sd"] == pytest.approx(values.min(1).std())
  firsts = [int(np.argmax(v <= target)) for v in values]
  assert row["reached"] == "2/2"
  assert row["rounds_to_target"] == pytest.approx(np.mean(firsts))
  markdown = open(made["paths"]["report.md"]).read()
  assert "lowest" in markdown and f"<= {target}" in markdown
  assert cli.main(["report", str(tmp_path / "run"), "--metric",
                   "test_loss", "--out", str(tmp_path / "cmd")]) == 0
  printed = capsys.readouterr().out.splitlines()
  best = _markdown_cells(printed[0]).index("best test loss")
  shown = float(_markdown_cells(printed[2])[best].split()[0])
  assert shown == pytest.approx(values.min(1).mean(), abs=1e-4)


# Wrong arguments.


@pytest.mark.parametrize("run_dirs, error", [
    ("runs", TypeError), (None, TypeError), ([3], TypeError),
    ([b"run"], TypeError), ([None], TypeError),
    ({"run": 1}, TypeError)])
def test_report_refuses_run_dirs_of_the_wrong_kind(run_dirs, error,
                                                   tmp_path):
  with pytest.raises(error, match="run_dirs"):
    report.report(run_dirs, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("out, error", [
    (None, TypeError), (3, TypeError), (b"out", TypeError),
    ("", ValueError), (["out"], TypeError)])
def test_report_refuses_an_out_of_the_wrong_kind(out, error, tmp_path):
  history.save_run(str(tmp_path / "run"), {"run": _history([0.1, 0.6])})
  with pytest.raises(error, match="out"):
    report.report([str(tmp_path / "run")], out)


@pytest.mark.parametrize("metric, error", [
    (None, TypeError), (3, TypeError), (["test_accuracy"], TypeError)])
def test_report_refuses_a_metric_of_the_wrong_kind(metric, error, tmp_path):
  history.save_run(str(tmp_path / "run"), {"run": _history([0.1, 0.6])})
  with pytest.raises(error, match="metric"):
    report.report([str(tmp_path / "run")], str(tmp_path / "out"), metric)
  assert not (tmp_path / "out").exists()


def test_the_entry_points_name_their_wrong_arguments(tmp_path):
  curves = {"a": [_history([0.1, 0.6])]}
  with pytest.raises(TypeError, match="curves"):
    report.table_rows([_history([0.1])], "test_accuracy")
  with pytest.raises(TypeError, match=r"curves\['a'\]\[0\]"):
    report.table_rows({"a": [{"rows": []}]}, "test_accuracy")
  with pytest.raises(ValueError, match=r"curves\['a'\]"):
    report.table_rows({"a": []}, "test_accuracy")
  with pytest.raises(ValueError, match="axis"):
    report.plot_curves(curves, "test_accuracy", "time",
                       str(tmp_path / "x.png"))
  assert not (tmp_path / "x.png").exists()
  with pytest.raises(TypeError, match="runs"):
    report.curve_x(_history([0.1]), "round")
  # Paths as path objects are folders too.
  history.save_run(str(tmp_path / "run"), {"run": _history([0.1, 0.6])})
  made = report.report((tmp_path / "run",), tmp_path / "out")
  assert os.path.isfile(made["paths"]["report.md"])


@pytest.mark.parametrize("flags", [
    ["--out", ""], ["--target"], ["--bogus", "1"]])
def test_the_command_refuses_bad_flags_in_one_line(flags, tmp_path, capsys):
  history.save_run(str(tmp_path / "run"), {"run": _history([0.1, 0.6])})
  out = tmp_path / "out"
  argv = [str(tmp_path / "run"), "--out", str(out)] + flags
  line = _one_error_line(_error_of(argv, capsys))
  assert flags[0].lstrip("-") in line
  assert not out.exists()


def test_the_command_names_a_run_folder_with_odd_characters(tmp_path,
                                                            capsys):
  missing = str(tmp_path / "no\nsuch|folder")
  line = _one_error_line(_error_of([missing, "--out",
                                    str(tmp_path / "out")], capsys))
  assert "no\\nsuch|folder" in line


def test_a_label_that_matplotlib_would_parse_or_hide(tmp_path,
                                                     monkeypatch):
  # "$...$" would be parsed as a formula (a broken one raises), and a
  # label starting with "_" would be left out of the legend.
  names = ["_hidden", "a$^$b", "c$x$"]
  compared = tmp_path / "compared"
  for name in names:
    history.save_run(str(compared / name),
                     {"run": _history([0.1, 0.6], seconds=1.0)})
  figures = _figures(monkeypatch)
  made = report.report([str(compared)], str(tmp_path / "out"))
  assert [row["name"] for row in made["rows"]] == names
  assert len(figures) == len(report.AXES)
  for figure in figures:
    legend = figure.axes[0].get_legend()
    assert len(legend.get_texts()) == len(names)
  for axis in report.AXES:
    assert os.path.getsize(made["paths"][axis]) > 0
