"""Runs the tutorial notebooks and stamps each with the code that made it.

  python experiments/notebooks/build.py                  # every tutorial
  python experiments/notebooks/build.py dp_fedavg.ipynb  # one
  python experiments/notebooks/build.py --check          # which are stale

Each tutorial is executed top to bottom in a fresh kernel (working folder:
a temporary directory) and written back with its outputs and figures. Its
metadata gets ``fedjax_agg.code``, the fingerprint of the library's code
and of the notebook's own code cells (``fingerprint``), with the seconds
the run took and the versions it ran under. ``tests/test_tutorials.py``
requires the committed fingerprint to equal today's, so a tutorial whose
outputs were made by other code than the repository's fails the suite
until it is built again here.

The library's part of the fingerprint hashes every module's syntax tree
without docstrings, so editing documentation or comments keeps the
tutorials current and any change to what the code does makes them stale.
"""

import argparse
import ast
import glob
import hashlib
import importlib.metadata
import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(ROOT, "fedjax_agg")
QUICKSTART = "quickstart.ipynb"  # executed by tests/test_notebook.py instead
VERSIONS = ("jax", "jaxlib", "flax", "optax", "numpy", "dp-accounting")


def tutorials() -> list:
  """The tutorial notebooks' paths (the quick start excluded), sorted."""
  return sorted(p for p in glob.glob(os.path.join(HERE, "*.ipynb"))
                if os.path.basename(p) != QUICKSTART)


def _without_docstrings(tree: ast.AST) -> ast.AST:
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      body = node.body
      if (body and isinstance(body[0], ast.Expr)
          and isinstance(body[0].value, ast.Constant)
          and isinstance(body[0].value.value, str)):
        node.body = body[1:] or [ast.Pass()]
  return tree


def library_fingerprint(package: str = PACKAGE) -> str:
  """sha256 over the package's modules (relative path and syntax tree
  without docstrings), in path order."""
  digest = hashlib.sha256()
  paths = sorted(glob.glob(os.path.join(package, "**", "*.py"),
                           recursive=True))
  if not paths:
    raise FileNotFoundError(f"no Python modules under {package!r}")
  for path in paths:
    with open(path, encoding="utf-8") as f:
      tree = _without_docstrings(ast.parse(f.read(), filename=path))
    digest.update(os.path.relpath(path, package).encode())
    digest.update(ast.dump(tree).encode())
  return digest.hexdigest()


def fingerprint(notebook, library: str) -> str:
  """The library fingerprint joined with the notebook's code cells."""
  digest = hashlib.sha256(library.encode())
  for cell in notebook.cells:
    if cell.cell_type == "code":
      digest.update(b"\0" + cell.source.encode())
  return digest.hexdigest()


def _versions() -> dict:
  out = {"python": platform.python_version()}
  for name in VERSIONS:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def build(path: str, library: str, timeout: int = 600) -> float:
  """Executes ``path`` in place and stamps it; returns the seconds taken."""
  import nbformat  # pylint: disable=g-import-not-at-top
  from nbclient import NotebookClient  # pylint: disable=g-import-not-at-top
  notebook = nbformat.read(path, as_version=4)
  env_path = os.environ.get("PYTHONPATH", "")
  os.environ["PYTHONPATH"] = ROOT + (os.pathsep + env_path if env_path
                                     else "")
  with tempfile.TemporaryDirectory() as work:
    start = time.perf_counter()
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": work}}).execute()
    seconds = time.perf_counter() - start
  notebook.metadata["fedjax_agg"] = {
      "code": fingerprint(notebook, library),
      "seconds": round(seconds, 1), "versions": _versions()}
  tmp = path + ".tmp"
  nbformat.write(notebook, tmp)
  os.replace(tmp, path)  # an interrupted build leaves the old notebook
  return seconds


def stale(paths, library: str) -> list:
  """The notebooks whose stamp is not today's fingerprint."""
  import nbformat  # pylint: disable=g-import-not-at-top
  out = []
  for path in paths:
    notebook = nbformat.read(path, as_version=4)
    stamp = notebook.metadata.get("fedjax_agg", {}).get("code")
    if stamp != fingerprint(notebook, library):
      out.append(path)
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("names", nargs="*",
                      help="notebook file names (default: every tutorial)")
  parser.add_argument("--check", action="store_true",
                      help="only list the tutorials that need a build")
  args = parser.parse_args(argv)
  paths = tutorials()
  if args.names:
    by_name = {os.path.basename(p): p for p in paths}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
      parser.error(f"unknown tutorial(s) {unknown}; expected some of "
                   f"{sorted(by_name)}")
    paths = [by_name[n] for n in args.names]
  library = library_fingerprint()
  if args.check:
    old = stale(paths, library)
    for path in old:
      print(f"stale: {os.path.basename(path)}")
    return 1 if old else 0
  for path in paths:
    seconds = build(path, library)
    print(f"{os.path.basename(path)}: {seconds:.1f} s", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
