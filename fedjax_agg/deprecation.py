"""Public names that moved to another module.

Each public name is exported by one module, its home. Where a name lived
in a second module before, that module still answers to it through its
``__getattr__`` (``moved``), with a ``DeprecationWarning`` naming the
home, so that code written against the old place keeps running.
"""

import warnings
from typing import Any

__all__ = ["moved"]


def moved(module: str, name: str, homes: dict[str, tuple[str, Any]]):
  """For a module's ``__getattr__(name)``: ``homes[name]``'s object, with
  a warning that names its home (``homes[name] = (home module, object)``).

  Raises:
    AttributeError: ``name`` is not a moved name of ``module`` (as Python
      says of any missing attribute).
  """
  if name not in homes:
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
  home, value = homes[name]
  # stacklevel 3: the warning points at the user's line, past this
  # function and the module's ``__getattr__``.
  warnings.warn(f"{module}.{name} is deprecated: use {home}.{name}",
                DeprecationWarning, stacklevel=3)
  return value
