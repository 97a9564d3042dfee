"""The quick-start notebook runs end to end (small settings)."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

from fedjax_agg import data as data_lib
from tests import agg_testutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "experiments", "notebooks", "quickstart.ipynb")


def test_quickstart_notebook_executes(tmp_path, monkeypatch):
  try:
    data_lib.load("fashion_mnist")
  except data_lib.DatasetNotFoundError as e:
    pytest.skip(f"Fashion-MNIST not installed: {e}")
  monkeypatch.setenv("FEDJAX_AGG_QUICKSTART_SMALL", "1")
  # The kernel compiles fast (the test checks that every cell runs and
  # draws, not how fast the compiled code is), on this process's devices.
  monkeypatch.setenv("XLA_FLAGS", " ".join(
      [os.environ.get("XLA_FLAGS", ""), *agg_testutil.fast_compile_flags()]
  ).strip())
  monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get(
      "PYTHONPATH", ""))
  nb = nbformat.read(NOTEBOOK, as_version=4)
  client = NotebookClient(nb, timeout=600, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}})
  client.execute()
  outputs = "".join(
      o.get("text", "") for cell in nb.cells if cell.cell_type == "code"
      for o in cell.get("outputs", []))
  assert "fedlayerwise" in outputs
  assert (tmp_path / "quickstart_accuracy.png").stat().st_size > 0
  # Every cell that draws shows its figure (no backend swallowed it).
  for cell in nb.cells:
    if cell.cell_type == "code" and any(
        call in cell.source for call in ("plt.show()", "Image(", "display(")):
      assert any("image/png" in o.get("data", {})
                 for o in cell.get("outputs", [])), cell.source[:80]


def test_committed_notebook_shows_its_figures():
  nb = nbformat.read(NOTEBOOK, as_version=4)
  drawing = [cell for cell in nb.cells if cell.cell_type == "code" and any(
      call in cell.source for call in ("plt.show()", "Image(", "display("))]
  assert drawing
  for cell in drawing:
    assert any("image/png" in o.get("data", {})
               for o in cell.get("outputs", [])), cell.source[:80]
