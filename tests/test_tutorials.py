"""The tutorial notebooks (``experiments/notebooks/``, besides the quick
start, which ``test_notebook.py`` executes): committed with their outputs
and figures, and made by today's code. ``experiments/notebooks/build.py``
runs a tutorial and stamps it with the fingerprint of the library's code
and of its own cells; a stamp that is not today's fails here, so outputs
made by other code cannot stay committed. (Re-executing every tutorial in
the suite would cost about 20 s each.)"""

import os

import nbformat
import pytest

from tests.experiments_scripts._util import load_script

build = load_script("notebooks", "build.py")
TUTORIALS = build.tutorials()
LIBRARY = build.library_fingerprint()
# A cell draws when it calls plt.show() or its value (last line) is an
# image: it must then hold a PNG.
VALUE_DRAWS = ("Image(", "display(", "show(")


def _draws(source: str) -> bool:
  lines = [line for line in source.splitlines() if line.strip()]
  value = lines[-1] if lines and not lines[-1][0].isspace() else ""
  return "plt.show()" in source or any(call in value
                                       for call in VALUE_DRAWS)
_IDS = [os.path.basename(p) for p in TUTORIALS]


def test_there_are_tutorials():
  assert set(_IDS) == {"attacks_robust_rules.ipynb",
                       "custom_aggregator.ipynb", "dp_fedavg.ipynb",
                       "personalisation.ipynb", "sweep_bands.ipynb"}


@pytest.mark.parametrize("path", TUTORIALS, ids=_IDS)
def test_committed_tutorial_holds_its_outputs(path):
  nb = nbformat.read(path, as_version=4)
  code = [cell for cell in nb.cells if cell.cell_type == "code"]
  assert code
  for cell in code:
    kinds = {o.get("output_type") for o in cell.get("outputs", [])}
    assert "error" not in kinds, cell.source[:80]
    if _draws(cell.source):
      assert any("image/png" in o.get("data", {})
                 for o in cell.get("outputs", [])), cell.source[:80]
  assert all(cell.get("execution_count") for cell in code)
  text = nbformat.writes(nb)
  for prefix in ("/home/", "/root/", "/work/", "/tmp/"):
    assert prefix not in text  # no machine paths


@pytest.mark.parametrize("path", TUTORIALS, ids=_IDS)
def test_tutorial_was_made_by_the_current_code(path):
  nb = nbformat.read(path, as_version=4)
  stamp = nb.metadata.get("fedjax_agg", {})
  assert stamp.get("code") == build.fingerprint(nb, LIBRARY), (
      f"{os.path.basename(path)} was run with other code than today's "
      f"fedjax_agg or its own cells were edited since: run "
      f"python experiments/notebooks/build.py {os.path.basename(path)}")
  assert 0 < stamp["seconds"] < 180, stamp  # a tutorial runs in < 3 min


def _package(tmp_path, body: str):
  pkg = tmp_path / "pkg"
  pkg.mkdir(exist_ok=True)
  (pkg / "mod.py").write_text(body)
  return str(pkg)


def test_fingerprint_follows_code_not_documentation(tmp_path):
  base = _package(tmp_path, '"""Doc."""\ndef f(x):\n  """One."""\n'
                  '  return x + 1  # note\n')
  first = build.library_fingerprint(base)
  _package(tmp_path, '"""Other doc."""\ndef f(x):\n  """Two."""\n\n'
           '  return x + 1  # other note\n')
  assert build.library_fingerprint(base) == first
  _package(tmp_path, '"""Doc."""\ndef f(x):\n  """One."""\n'
           '  return x + 2\n')
  assert build.library_fingerprint(base) != first
  with pytest.raises(FileNotFoundError, match="no Python modules"):
    build.library_fingerprint(str(tmp_path / "missing"))


def test_an_edited_cell_makes_a_tutorial_stale(tmp_path):
  path = TUTORIALS[0]
  nb = nbformat.read(path, as_version=4)
  assert build.stale([path], LIBRARY) == []
  code = next(c for c in nb.cells if c.cell_type == "code")
  code.source += "\nx = 1"
  edited = tmp_path / "edited.ipynb"
  nbformat.write(nb, str(edited))
  assert build.stale([str(edited)], LIBRARY) == [str(edited)]
  assert build.stale([path], "0" * 64) == [path]
