"""What the tests of ``experiments/`` share: the repository root and a
script of it loaded as a module (the scripts are not a package)."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def load_script(*parts: str):
  """``experiments/<parts...>`` (a ``.py`` file) as a module."""
  path = os.path.join(ROOT, "experiments", *parts)
  name = "_experiments_" + "_".join(parts).replace(".py", "").replace(
      os.sep, "_")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
