"""Range checks of numeric hyperparameters that let traced values through.

Factories check their hyperparameters when they are built. A sweep
(``fedjax_agg.sweep``) builds the same factories a second time inside
``jax.vmap`` with the hyperparameters as traced scalars, whose value is not
known there; ``check_range`` then skips the check. The sweep has already
built every member with its concrete values first, so a bad value still
raises the factory's ``ValueError`` before anything runs.
"""

from typing import Optional

import jax
import numpy as np


def is_traced(value) -> bool:
  """Whether ``value`` is a tracer (its value unknown at trace time)."""
  return isinstance(value, jax.core.Tracer)


def describe_range(low=None, high=None, *, low_open: bool = False,
                   high_open: bool = False) -> str:
  """"> 0", ">= 0", "in [0, 1)", ... for the messages of ``check_range``."""
  if low is not None and high is not None:
    return (f"in {'(' if low_open else '['}{low}, "
            f"{high}{')' if high_open else ']'}")
  if low is not None:
    return f"{'>' if low_open else '>='} {low}"
  if high is not None:
    return f"{'<' if high_open else '<='} {high}"
  return "a number"


def check_range(name: str, value, low=None, high=None, *,
                low_open: bool = False, high_open: bool = False,
                expected: Optional[str] = None) -> None:
  """Raises unless the concrete number(s) ``value`` lie in the range.

  Args:
    name: the argument's name, used in the message.
    value: a Python number, numpy/jax scalar or array (every entry is
      checked), or a tracer (not checked).
    low, high: bounds (None: unbounded on that side).
    low_open, high_open: exclude the bound itself.
    expected: the message's description of the range (default from the
      bounds, e.g. "> 0", "in [0, 1)").

  Raises:
    TypeError: ``value`` is not numeric (bools are not numbers here).
    ValueError: ``value`` (or an entry) is outside the range, or NaN.
  """
  if is_traced(value):
    return
  try:
    array = np.asarray(value)
  except (TypeError, ValueError) as error:
    raise TypeError(f"{name} must be a number, got {value!r}") from error
  if array.dtype.kind not in "iuf":
    raise TypeError(f"{name} must be a number, got {value!r}")
  ok = True
  if low is not None:
    ok &= bool(np.all(array > low if low_open else array >= low))
  if high is not None:
    ok &= bool(np.all(array < high if high_open else array <= high))
  ok &= not bool(np.any(np.isnan(array)))
  if not ok:
    expected = expected or describe_range(low, high, low_open=low_open,
                                          high_open=high_open)
    raise ValueError(f"{name} must be {expected}, got {value!r}")
