"""The tutorial notebooks (``experiments/notebooks/``, besides the quick
start): committed with their outputs, and those outputs are what the
current code prints: each is run again here and its printed numbers must
match the committed ones (within what a run on another machine may move:
0.01 absolute plus 1 % relative), its words exactly."""

import glob
import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUTORIALS = sorted(
    path for path in glob.glob(os.path.join(ROOT, "experiments", "notebooks",
                                            "*.ipynb"))
    if os.path.basename(path) != "quickstart.ipynb")
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
DRAWS = ("plt.show()", "Image(", "display(")
_IDS = [os.path.basename(p) for p in TUTORIALS]


def _printed(cell) -> str:
  """What a code cell printed (standard output), the figures left out."""
  return "".join(
      "".join(o.get("text", "")) for o in cell.get("outputs", [])
      if o.get("output_type") == "stream" and o.get("name") == "stdout")


def _same_print(got: str, want: str, where: str) -> None:
  assert NUMBER.sub("#", got) == NUMBER.sub("#", want), (where, got, want)
  for a, b in zip(NUMBER.findall(got), NUMBER.findall(want), strict=True):
    assert abs(float(a) - float(b)) <= 0.01 + 0.01 * abs(float(b)), (
        where, a, b)


def test_there_are_tutorials():
  assert {"custom_aggregator.ipynb", "dp_fedavg.ipynb"} <= set(_IDS)


@pytest.mark.parametrize("path", TUTORIALS, ids=_IDS)
def test_committed_tutorial_holds_its_outputs(path):
  nb = nbformat.read(path, as_version=4)
  code = [cell for cell in nb.cells if cell.cell_type == "code"]
  assert code
  for cell in code:
    kinds = {o.get("output_type") for o in cell.get("outputs", [])}
    assert "error" not in kinds, cell.source[:80]
    if any(call in cell.source for call in DRAWS):
      assert any("image/png" in o.get("data", {})
                 for o in cell.get("outputs", [])), cell.source[:80]
  assert all(cell.get("execution_count") for cell in code)
  text = nbformat.writes(nb)
  assert "/home/" not in text and "/root/" not in text  # no machine paths


@pytest.mark.parametrize("path", TUTORIALS, ids=_IDS)
def test_tutorial_prints_what_is_committed(path, tmp_path, monkeypatch):
  monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get(
      "PYTHONPATH", ""))
  committed = nbformat.read(path, as_version=4)
  run = nbformat.read(path, as_version=4)
  NotebookClient(run, timeout=600, kernel_name="python3", resources={
      "metadata": {"path": str(tmp_path)}}).execute()
  pairs = [(a, b) for a, b in zip(run.cells, committed.cells, strict=True)
           if a.cell_type == "code"]
  for i, (got, want) in enumerate(pairs):
    _same_print(_printed(got), _printed(want),
                f"{os.path.basename(path)} code cell {i}")
