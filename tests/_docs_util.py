"""What the documentation tests share: the repository root and
``docs/build.py`` (a script, not a package) loaded as a module."""

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
_NAME = "_fedjax_agg_docs_build"


def load_docs_build():
  """``docs/build.py`` as a module (loaded once)."""
  if _NAME not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        _NAME, ROOT / "docs" / "build.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
  return sys.modules[_NAME]
