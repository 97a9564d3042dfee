"""The library deletes only files it wrote and recorded (``manifest``).

A user's files beside, inside or named like a run's are never removed or
changed, by a fresh run, an overwrite or a resume, from ``save_run``,
``run_config`` or the command line; a changed or unlisted file stops an
overwrite with its name; a hostile or broken manifest clears nothing.
"""

import json
import os

import hypothesis
from hypothesis import strategies as st
import pytest

from fedjax_agg import cli
from fedjax_agg import experiment
from fedjax_agg import history
from fedjax_agg import manifest
from tests.cli.test_cli import TINY
from tests.experiment.test_runs import MNIST_5K

NOT_RECORDED = "no recorded run wrote.*removed nothing"
ONE = history.History([{"round": 0, "test_accuracy": 0.1}], [], {})
TWO = {"seed0": ONE, "seed1": ONE}


def _user_files(folder, files: dict) -> None:
  for name, text in files.items():
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)


def _intact(folder, files: dict) -> None:
  for name, text in files.items():
    with open(os.path.join(folder, name)) as f:
      assert f.read() == text, name


# Files named like a run's, where the issue found them deleted.
USERS = {"figs/curves.png": "mine", "paper/fig/accuracy.png": "mine",
         "data/config.json": "{}", "a/b/summary.json": "{}",
         "analysis/summary.csv": "x", ".devcontainer/config.json": "{}",
         ".docker/config.json": "{}", "Documents/summary.csv": "y"}


def test_a_fresh_run_and_an_overwrite_never_touch_users_files(tmp_path):
  _user_files(tmp_path, USERS)
  history.save_run(str(tmp_path), {"run": ONE})  # fresh: written beside
  _intact(tmp_path, USERS)
  # The user's files are not the run's: the overwrite stops, naming them.
  with pytest.raises(ValueError, match=NOT_RECORDED) as raised:
    history.save_run(str(tmp_path), TWO, overwrite=True)
  assert ".devcontainer/config.json" in str(raised.value)
  _intact(tmp_path, USERS)
  assert (tmp_path / "history.json").exists()
  # Named to stay, they stay; the earlier run's files go.
  plan = history.check_fresh(str(tmp_path), True, keep=list(USERS))
  assert sorted(plan) == ["history.csv", "history.json"]
  with manifest.recording(str(tmp_path), plan):
    history.write_run(str(tmp_path), TWO)
  _intact(tmp_path, USERS)
  assert not (tmp_path / "history.json").exists()
  assert sorted(manifest.read(str(tmp_path))["files"]) == [
      "seed0/history.csv", "seed0/history.json", "seed1/history.csv",
      "seed1/history.json"]


def test_a_users_file_named_like_a_runs_output_is_never_replaced(tmp_path):
  _user_files(tmp_path, {"history.json": "my notes"})
  for overwrite in (False, True):
    with pytest.raises(ValueError, match="history.json"):
      history.save_run(str(tmp_path), {"run": ONE}, overwrite=overwrite)
    _intact(tmp_path, {"history.json": "my notes"})
  other = tmp_path / "other"
  _user_files(other, {"seed1/history.csv": "mine"})
  with pytest.raises(ValueError, match="which this run would replace"):
    history.save_run(str(other), TWO, overwrite=True)
  _intact(other, {"seed1/history.csv": "mine"})


def test_a_changed_file_stops_the_overwrite(tmp_path):
  history.save_run(str(tmp_path), {"run": ONE})
  (tmp_path / "history.csv").write_text("edited by hand")
  with pytest.raises(ValueError, match="history.csv changed since"):
    history.save_run(str(tmp_path), {"run": ONE}, overwrite=True)
  assert (tmp_path / "history.csv").read_text() == "edited by hand"
  assert (tmp_path / "history.json").exists()
  # A listed file replaced by a link to a user's file: also changed.
  target = tmp_path.parent / f"{tmp_path.name}_target"
  target.write_text("precious")
  os.remove(tmp_path / "history.csv")
  os.symlink(target, tmp_path / "history.csv")
  with pytest.raises(ValueError, match="changed since"):
    history.save_run(str(tmp_path), {"run": ONE}, overwrite=True)
  assert target.read_text() == "precious"


@pytest.mark.parametrize("files", [
    {"../outside.txt": {"size": 8, "sha256": "0" * 64}},
    {"/etc/passwd": {"size": 1, "sha256": "0" * 64}},
    {"a/../../x": {"size": 1, "sha256": "0" * 64}},
    {"history.csv": {"size": "big", "sha256": None}},
    "not a mapping",
])
def test_a_hostile_manifest_clears_nothing(tmp_path, files):
  run = tmp_path / "run"
  history.save_run(str(run), {"run": ONE})
  (tmp_path / "outside.txt").write_text("precious")
  saved = json.loads((run / manifest.FILE).read_text())
  saved["files"] = files
  (run / manifest.FILE).write_text(json.dumps(saved))
  with pytest.raises(ValueError, match="nothing was removed"):
    history.save_run(str(run), {"run": ONE}, overwrite=True)
  assert (tmp_path / "outside.txt").read_text() == "precious"
  assert (run / "history.csv").exists()


@pytest.mark.parametrize("text", ["{", "[]", "null", "{\"format\": 1}",
                                  "[" * 100_000])
def test_a_broken_manifest_clears_nothing(tmp_path, text):
  history.save_run(str(tmp_path), {"run": ONE})
  (tmp_path / manifest.FILE).write_text(text)
  with pytest.raises(ValueError, match="nothing was removed"):
    history.save_run(str(tmp_path), {"run": ONE}, overwrite=True)
  assert (tmp_path / "history.csv").exists()


def test_a_run_without_a_manifest_is_never_cleared(tmp_path):
  history.save_run(str(tmp_path), {"run": ONE})
  os.remove(tmp_path / manifest.FILE)  # e.g. written by older code
  with pytest.raises(ValueError, match="already holds a run"):
    history.save_run(str(tmp_path), {"run": ONE})
  with pytest.raises(ValueError, match="never clears such a folder"):
    history.save_run(str(tmp_path), {"run": ONE}, overwrite=True)
  assert (tmp_path / "history.csv").exists()


def test_an_interrupted_write_is_cleared_with_its_run(tmp_path):
  history.save_run(str(tmp_path), {"run": ONE})
  leftover = tmp_path / f".history.json.123.{'ab' * 16}.tmp"
  leftover.write_text("half")
  history.save_run(str(tmp_path), {"run": ONE}, overwrite=True)
  assert not leftover.exists()
  assert (tmp_path / "history.json").exists()


def test_the_manifest_records_what_was_written(tmp_path):
  history.save_run(str(tmp_path), TWO)
  import hashlib  # pylint: disable=g-import-not-at-top
  for name, entry in manifest.read(str(tmp_path))["files"].items():
    data = (tmp_path / name).read_bytes()
    assert entry == {"size": len(data),
                     "sha256": hashlib.sha256(data).hexdigest()}
  assert sorted(manifest.read(str(tmp_path))["folders"]) == ["seed0",
                                                             "seed1"]


_NAMES = st.sampled_from(["config.json", "history.csv", "history.json",
                          "summary.csv", "curves.png", "notes.txt",
                          "seed0", "seed1", "run", "figs", "a"])


@hypothesis.settings(max_examples=40, deadline=None,
                     suppress_health_check=[
                         hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(
    users=st.dictionaries(st.lists(_NAMES, min_size=1, max_size=3).map(
        "/".join), st.text(max_size=5), max_size=6),
    steps=st.lists(st.tuples(st.sampled_from(["fresh", "overwrite",
                                              "resume", "keep"]),
                             st.integers(1, 3)), min_size=1, max_size=5))
def test_no_user_file_ever_disappears(tmp_path_factory, users, steps):
  folder = str(tmp_path_factory.mktemp("run"))
  # A user's tree (a name may not be both a file and a folder).
  placed = {}
  for name, text in sorted(users.items()):
    path = os.path.join(folder, name)
    if any(os.path.lexists(os.path.join(folder, *name.split("/")[:i]))
           and not os.path.isdir(os.path.join(folder,
                                              *name.split("/")[:i]))
           for i in range(1, name.count("/") + 2)) or os.path.isdir(path):
      continue
    _user_files(folder, {name: text})
    placed[name] = text
  for how, members in steps:
    histories = ({"run": ONE} if members == 1 else
                 {f"seed{i}": ONE for i in range(members)})
    try:
      if how == "resume":
        with manifest.recording(folder, resume=True):
          history.write_run(folder, histories)
      elif how == "keep":
        plan = history.check_fresh(folder, True, keep=list(placed))
        with manifest.recording(folder, plan):
          history.write_run(folder, histories)
      else:
        history.save_run(folder, histories, overwrite=how == "overwrite")
    except (ValueError, OSError):
      pass  # refused (or a user's file where a folder goes): fine
    _intact(folder, {name: text for name, text in placed.items()
                     if not _replaced_by_resume(name, steps)})


def _replaced_by_resume(name: str, steps) -> bool:
  """A resume rewrites its run's files where they are, a user's file of
  that name included: the one place a file is replaced (never removed)
  without a check, as it continues a run the user pointed it at."""
  return any(how == "resume" for how, _ in steps) and (
      os.path.basename(name) in ("history.csv", "history.json"))


def test_the_command_line_never_clears_users_files(tmp_path, capsys):
  out = tmp_path / "project"
  _user_files(out, USERS)
  cli.main(TINY + ["--out", str(out)])  # fresh, beside the user's files
  _intact(out, USERS)
  capsys.readouterr()
  with pytest.raises(SystemExit):
    cli.main(TINY + ["--out", str(out), "--overwrite"])
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.startswith("error: --out: ") and "--keep" in err, err
  _intact(out, USERS)
  with pytest.raises(SystemExit):  # --keep only with --overwrite
    cli.main(TINY + ["--out", str(out), "--keep", "figs/curves.png"])
  capsys.readouterr()
  keep = [f for name in USERS for f in ("--keep", name)]
  cli.main(TINY + ["--out", str(out), "--overwrite", "--seeds", "0,1"]
           + keep)
  _intact(out, USERS)
  assert not (out / "history.json").exists()  # the single run went
  assert (out / "seed1" / "history.json").exists()
  listed = manifest.read(str(out))["files"]
  assert "seed1/history.json" in listed and "config.json" in listed


def test_run_config_never_clears_users_files(tmp_path):
  _user_files(tmp_path, USERS)
  experiment.run_config(MNIST_5K, str(tmp_path), progress=False)
  _intact(tmp_path, USERS)
  with pytest.raises(ValueError, match=NOT_RECORDED):
    experiment.run_config(MNIST_5K, str(tmp_path), progress=False,
                          overwrite=True)
  _intact(tmp_path, USERS)
  experiment.run_config(MNIST_5K, str(tmp_path), progress=False,
                        overwrite=True, keep=list(USERS))
  _intact(tmp_path, USERS)
  listed = manifest.read(str(tmp_path))["files"]
  assert {"config.json", "summary.json", "curves.png",
          "history.json"} <= set(listed)


def test_a_name_too_long_is_refused_before_the_first_round(tmp_path,
                                                          capsys):
  out = tmp_path / ("x" * 300)
  with pytest.raises(SystemExit):
    cli.main(TINY + ["--out", str(out)])
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.startswith("error: --out: ") and "longer than" in err, err
  with pytest.raises(ValueError, match="longer than"):
    experiment.run_config(MNIST_5K, str(out), progress=False)
  assert not os.path.exists(str(out))


def test_the_docs_build_replaces_only_its_own_site(tmp_path):
  from tests._docs_util import load_docs_build  # pylint: disable=g-import-not-at-top
  build = load_docs_build()
  site = tmp_path / "site"
  # A folder that only looks like a site (the old test of one) is refused.
  _user_files(site, {"fedjax_agg.html": "<html>", "thesis.tex": "precious"})
  with pytest.raises(SystemExit, match="no record of a site"):
    build._plan(site)  # pylint: disable=protected-access
  _intact(site, {"thesis.tex": "precious"})
  # A site the script recorded is replaced file by file ...
  built = tmp_path / "built"
  with manifest.recording(str(built)):
    _user_files(built, {"index.html": "<html>", "docs/a.html": "a"})
    manifest.note(*build._written(built))  # pylint: disable=protected-access
  assert sorted(build._plan(built)) == ["docs/a.html", "index.html"]  # pylint: disable=protected-access
  # ... unless a user's file joined it or a page was edited.
  _user_files(built, {"thesis.tex": "precious"})
  with pytest.raises(SystemExit, match="thesis.tex"):
    build._plan(built)  # pylint: disable=protected-access
  os.remove(built / "thesis.tex")
  (built / "index.html").write_text("edited")
  with pytest.raises(SystemExit, match="index.html changed"):
    build._plan(built)  # pylint: disable=protected-access
  with pytest.raises(SystemExit, match="not a folder"):
    build._plan(built / "index.html")  # pylint: disable=protected-access


def test_a_report_replaces_only_its_own_files(tmp_path):
  from fedjax_agg import report  # pylint: disable=g-import-not-at-top
  run = tmp_path / "run"
  history.save_run(str(run), {"run": history.History(
      [{"round": 0, "test_accuracy": 0.1},
       {"round": 1, "test_accuracy": 0.5}], [], {})})
  out = tmp_path / "report"
  _user_files(out, {"notes.md": "mine"})
  made = report.report([str(run)], str(out))
  again = report.report([str(run)], str(out))  # its own files: replaced
  assert made["paths"] == again["paths"]
  _intact(out, {"notes.md": "mine"})
  assert "report.md" in manifest.read(str(out))["files"]
  # A report into the run's own folder leaves the run's files as they were.
  before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()
            and p.name != manifest.FILE}
  report.report([str(run)], str(run))
  assert all(p.read_bytes() == data for p, data in before.items())
  # A user's report.md, or an edited one, is never written over.
  (out / "report.md").write_text("my edits")
  with pytest.raises(ValueError, match="report.md"):
    report.report([str(run)], str(out))
  assert (out / "report.md").read_text() == "my edits"
