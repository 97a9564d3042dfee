"""Every number in a paper re-run's verdict table comes from its committed
histories: each ``experiments/<paper>/summarize.py`` rebuilds the "ours"
cells of ``RESULTS.md``'s ``## Verdict`` table, and they must equal the
committed ones (``experiments/verdicts.py``)."""

import glob
import os

import numpy as np
import pytest

from tests.experiments_scripts._util import load_script
from tests.experiments_scripts._util import ROOT

EXPERIMENTS = os.path.join(ROOT, "experiments")
verdicts = load_script("verdicts.py")
WITH_VERDICT = sorted(
    os.path.basename(os.path.dirname(p))
    for p in glob.glob(os.path.join(EXPERIMENTS, "*", "RESULTS.md"))
    if "\n## Verdict\n" in open(p, encoding="utf-8").read())


def _read(paper: str) -> str:
  with open(os.path.join(EXPERIMENTS, paper, "RESULTS.md"),
            encoding="utf-8") as f:
    return f.read()


def test_the_five_papers_have_verdict_tables():
  assert WITH_VERDICT == ["adct", "feddrl", "fedlap", "fedlayerwise",
                          "fednnnn"]


@pytest.mark.parametrize("paper", WITH_VERDICT)
def test_verdict_numbers_are_rebuilt_from_the_histories(paper):
  script = os.path.join(EXPERIMENTS, paper, "summarize.py")
  assert os.path.exists(script), f"{paper} has no summarize.py"
  module = load_script(paper, "summarize.py")
  text = _read(paper)
  rebuilt = module.cells()
  assert verdicts.differences(text, rebuilt) == []
  # The check is a round trip: writing the rebuilt cells changes nothing.
  assert verdicts.replace_ours(text, rebuilt) == text


def test_a_changed_number_is_found():
  text = _read("fednnnn")
  cells = verdicts.ours_cells(text)
  assert len(cells) >= 3
  edited = list(cells)
  edited[1] = edited[1].replace("9", "8", 1)
  assert edited[1] != cells[1]
  diff = verdicts.differences(text, edited)
  assert [row for row, _, _ in diff] == [2]
  assert verdicts.ours_cells(verdicts.replace_ours(text, edited)) == edited
  assert verdicts.differences(text, cells[:-1])[0][0] is None
  with pytest.raises(ValueError, match="rows"):
    verdicts.replace_ours(text, cells[:-1])
  with pytest.raises(ValueError, match="Verdict"):
    verdicts.ours_cells("# no table here\n")


def test_formatting_matches_numpy():
  values = np.array([0.551, 0.539, 0.562])
  mean, sd = values.mean() * 100, values.std() * 100
  assert verdicts.pm(values) == f"{mean:.1f} ± {sd:.1f}"
  assert verdicts.signed(-1.25, 2) == "\u22121.25"
  assert verdicts.signed(0.7) == "+0.7"
  assert verdicts.fixed(-0.04) == "\u22120.0"
  with pytest.raises(ValueError, match="one value per seed"):
    verdicts.pm(np.zeros((2, 2)))


def test_runs_reads_seeds_in_order(tmp_path):
  for seed, acc in ((10, 0.5), (2, 0.25)):
    folder = tmp_path / "A" / f"seed{seed}"
    folder.mkdir(parents=True)
    (folder / "history.csv").write_text(
        f"round,test_accuracy,epsilon\n0,0.1,\n1,{acc},\n")
  got = verdicts.column(str(tmp_path), "A")
  np.testing.assert_array_equal(got, [[0.1, 0.25], [0.1, 0.5]])
  assert np.isnan(verdicts.runs(str(tmp_path), "A")[0]["epsilon"]).all()
  assert verdicts.first_round(got[1], 0.5) == 1
  assert verdicts.first_round(got[0], 0.5) is None
  assert verdicts.rounds_to(got, 0.5) == [None, 1]
  np.testing.assert_array_equal(verdicts.reader(str(tmp_path))("", "A"), got)
  np.testing.assert_allclose(verdicts.window(got, 0, 1), [0.175, 0.3])
  with_gap = np.array([[0.1, np.nan, 0.3]])
  np.testing.assert_allclose(verdicts.window(with_gap, 0, 2), [0.2])
  with pytest.raises(FileNotFoundError, match="no history of 'B'"):
    verdicts.runs(str(tmp_path), "B")
