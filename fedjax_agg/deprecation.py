"""Public names that moved to another module.

Each public name is exported by one module, its home. Where a name lived
in a second module before, that module still answers to it through a
module ``__getattr__`` made by ``moved_names``, with a
``DeprecationWarning`` naming the home, so that code written against the
old place keeps running.
"""

import warnings
from typing import Any, Callable

__all__ = ["moved_names"]


def moved_names(module: str, homes: dict[str, tuple[str, Any]]
                ) -> Callable[[str], Any]:
  """A module ``__getattr__`` for ``module``'s moved names: ``homes[name]
  = (home module, object)``; ``__getattr__(name)`` warns, naming the
  home, and returns the object.

  Example::

    __getattr__ = deprecation.moved_names(__name__, {
        "EvalSet": ("fedjax_agg.evaluation", evaluation.EvalSet)})
  """
  def __getattr__(name: str):  # pylint: disable=invalid-name
    if name not in homes:  # as Python says of any missing attribute
      raise AttributeError(f"module {module!r} has no attribute {name!r}")
    home, value = homes[name]
    # stacklevel 2: the warning points at the user's line.
    warnings.warn(f"{module}.{name} is deprecated: use {home}.{name}",
                  DeprecationWarning, stacklevel=2)
    return value
  return __getattr__
