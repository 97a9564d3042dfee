"""Checks of the arguments of public entry points.

Hyperparameters. Factories check their hyperparameters when they are
built: ``check_range`` for numbers, ``check_int``, ``check_bool`` and
``check_choice`` for the others. Each raises ``TypeError`` for a value of
the wrong kind (a string, None, a bool where a number is expected) and
``ValueError`` for a value out of range, with the argument's name and what
was expected in the message. NaN is never in range; neither is +-inf unless
the range names it as a closed bound (``check_range(name, v, 0, math.inf)``
admits +inf). No registered factory takes an infinite hyperparameter: every
bound is finite.

Traced values. A sweep (``fedjax_agg.sweep``) builds the same factories a
second time inside ``jax.vmap`` with the hyperparameters as traced scalars,
whose value is not known there; the checks then let them through. The sweep
has already built every member with its concrete values first, so a bad
value still raises the factory's error before anything runs.

Cohorts. ``check_cohort`` checks what an aggregator's ``aggregate`` is given:
shapes always; values (positive example counts and in-range client ids of
the real clients) when they are concrete, i.e. outside ``jax.jit``. Under
jit the rules rely on the round's conventions instead (``ClientInfo``):
rows with mask 0 may hold anything and never matter, and per-client state
ignores real rows whose id is out of range (``tree_math.scatter_clients``).
"""

from collections.abc import Hashable
import difflib
import math
from typing import Any, Optional, Sequence

import jax
import numpy as np

__all__ = ["check_bool", "check_choice", "check_cohort", "check_int",
    "check_number", "check_range", "check_stacked", "describe_range",
    "did_you_mean", "is_traced"]


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


def _kind(value) -> str:
  return type(value).__name__


def check_range(name: str, value, low=None, high=None, *,
                low_open: bool = False, high_open: bool = False,
                expected: Optional[str] = None) -> None:
  """Raises unless the concrete number(s) ``value`` lie in the range.

  Args:
    name: the argument's name, used in the message.
    value: a Python number, numpy/jax scalar or array (every entry is
      checked), or a tracer (not checked).
    low, high: bounds (None: unbounded on that side, finite values only).
      An infinite value is accepted only where the matching infinity is a
      closed bound: ``high=math.inf`` admits +inf, ``low=-math.inf`` -inf.
    low_open, high_open: exclude the bound itself.
    expected: the message's description of the range (default from the
      bounds, e.g. "> 0", "in [0, 1)").

  Raises:
    TypeError: ``value`` is not numeric (bools, strings, None are not
      numbers here).
    ValueError: ``value`` (or an entry) is outside the range, infinite
      (unless admitted) or NaN.
  """
  # Inside a sweep's vmapped build the value is unknown; the concrete build of
  # every member has already checked it (module docstring).
  if is_traced(value):
    return
  expected = expected or describe_range(low, high, low_open=low_open,
                                        high_open=high_open)
  try:
    array = np.asarray(value)
  except (TypeError, ValueError) as error:
    raise TypeError(f"{name} must be a number {expected}, got {value!r} "
                    f"({_kind(value)})") from error
  # Signed, unsigned or float only: a bool (kind "b") is an int to Python but
  # never a hyperparameter's number here; strings and objects fail too.
  if array.dtype.kind not in "iuf":
    raise TypeError(f"{name} must be a number {expected}, got {value!r} "
                    f"({_kind(value)})")
  if array.dtype.kind == "f":
    if np.any(np.isnan(array)):
      raise ValueError(f"{name} must be {expected}, got {value!r}")
    # Explicit, since ``inf <= inf`` holds: an infinite bound alone would let
    # infinity through every range open to that side.
    plus_inf_ok = high == math.inf and not high_open
    minus_inf_ok = low == -math.inf and not low_open
    if ((np.any(array == np.inf) and not plus_inf_ok)
        or (np.any(array == -np.inf) and not minus_inf_ok)):
      raise ValueError(f"{name} must be finite and {expected}, got {value!r}")
  ok = True
  if low is not None:
    ok &= bool(np.all(array > low if low_open else array >= low))
  if high is not None:
    ok &= bool(np.all(array < high if high_open else array <= high))
  if not ok:
    raise ValueError(f"{name} must be {expected}, got {value!r}")


def check_int(name: str, value, low: Optional[int] = None,
              high: Optional[int] = None) -> None:
  """Raises unless ``value`` is a Python/numpy int (not a bool) in range.

  Tracers pass unchecked (as in ``check_range``).

  Raises:
    TypeError: ``value`` is not an int (a float, even 2.0, is not).
    ValueError: ``value`` is outside [low, high].
  """
  if is_traced(value):
    return
  expected = describe_range(low, high)
  expected = "an int" if expected == "a number" else f"an int {expected}"
  # bool first (it subclasses int); a float, even 2.0, is refused: an int
  # argument given a float is usually another argument mixed up.
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, (int, np.integer)):
    raise TypeError(f"{name} must be {expected}, got {value!r} "
                    f"({_kind(value)})")
  if (low is not None and value < low) or (high is not None and value > high):
    raise ValueError(f"{name} must be {expected}, got {value!r}")


def check_bool(name: str, value) -> None:
  """Raises TypeError unless ``value`` is a bool (tracers pass)."""
  if not is_traced(value) and not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be a bool, got {value!r} ({_kind(value)})")


def check_number(name: str, value, low=None, high=None, *,
                 low_open: bool = False, high_open: bool = False) -> None:
  """``check_range`` of one number: a Python or numpy scalar (or a 0-d
  array, or a tracer), never a bool, a string, None or a list.

  Raises:
    TypeError: ``value`` is not one number.
    ValueError: it is outside the range, NaN or infinite.
  """
  if is_traced(value):
    return
  if (isinstance(value, (bool, np.bool_))
      or not isinstance(value, (int, float, np.number, np.ndarray,
                                jax.Array))
      # One number: ``check_range`` would accept a list and check each entry.
      or np.ndim(value) != 0):
    expected = describe_range(low, high, low_open=low_open,
                              high_open=high_open)
    raise TypeError(f"{name} must be a number {expected}, got {value!r} "
                    f"({_kind(value)})")
  check_range(name, value, low, high, low_open=low_open,
              high_open=high_open)


def check_choice(name: str, value, choices: Sequence[Any]) -> None:
  """Raises ValueError unless ``value`` is one of ``choices`` (naming the
  nearest choices to a misspelt name)."""
  # Unhashable values are refused up front: ``in`` on a set or dict of choices
  # would raise a TypeError of its own.
  if not isinstance(value, Hashable) or value not in choices:
    raise ValueError(f"{name} must be one of {tuple(choices)}, got "
                     f"{value!r}{did_you_mean(value, choices)}")


def did_you_mean(key, allowed) -> str:
  """" (did you mean X?)" for a close match of ``key`` among ``allowed``
  (case ignored), else ""."""
  if not isinstance(key, str):
    return ""
  # Matched case-insensitively ("lr" finds "LR", "SGDM" finds "SGD") but
  # suggested as spelled.
  by_lower = {str(name).lower(): name for name in allowed}
  close = difflib.get_close_matches(key.lower(), list(by_lower), n=2,
                                    cutoff=0.6)
  return (f" (did you mean {' or '.join(repr(by_lower[c]) for c in close)}?)"
          if close else "")


def check_stacked(client_params, global_params,
                  arrays: Sequence[jax.Array] = ()) -> int:
  """Checks ``client_params`` is ``global_params`` with a leading [K] axis.

  Returns K. ``arrays`` are [K] arrays (e.g. ClientInfo fields) to check.
  """
  leaves = jax.tree.leaves(client_params)
  if not leaves:
    raise ValueError("client_params is empty")
  num_clients = leaves[0].shape[0]
  if jax.tree.structure(client_params) != jax.tree.structure(global_params):
    raise ValueError(
        "client_params must have the tree structure of global_params, got "
        f"{jax.tree.structure(client_params)} vs "
        f"{jax.tree.structure(global_params)}")
  for c, g in zip(leaves, jax.tree.leaves(global_params), strict=True):
    if c.shape != (num_clients,) + g.shape:
      raise ValueError(
          "client_params leaves must be global_params leaves with a leading "
          f"client axis [K={num_clients}, ...]; got {c.shape} for a leaf of "
          f"shape {g.shape}")
  for a in arrays:
    if a.shape != (num_clients,):
      raise ValueError(
          f"client info arrays must have shape [K={num_clients}], got "
          f"{a.shape}")
  return num_clients


def check_cohort(global_params, client_params, info, *,
                 num_clients: Optional[int] = None,
                 uses_num_examples: bool = True,
                 fields: Sequence[str] = ()) -> int:
  """Checks the arguments of an ``Aggregator.aggregate``; returns K.

  Shapes: ``client_params`` is ``global_params`` with a leading [K] axis;
  ``info.client_ids``, ``num_examples``, ``mask`` and the named ``fields``
  are [K]. Values, when concrete (outside jit; padding rows, mask 0, are
  never checked): the real clients' ``num_examples`` are positive and
  finite (when the rule reads them), their ids in [0, ``num_clients``)
  (when given: rules with per-client state).

  Raises:
    ValueError: naming the offending argument.
  """
  names = ("client_ids", "num_examples", "mask") + tuple(fields)
  size = check_stacked(client_params, global_params,
                       [getattr(info, n) for n in names])
  # Under jit only the shapes (static) are known; the values are checked only
  # where they are concrete, in an eager call.
  if is_traced(info.mask):
    return size
  # Only real rows are checked: padding rows (mask 0) may hold anything (a
  # repeated id, a zero count) and never reach the result.
  real = np.asarray(info.mask) > 0
  if uses_num_examples and not is_traced(info.num_examples):
    counts = np.asarray(info.num_examples)[real]
    if not np.all(np.isfinite(counts) & (counts > 0)):
      raise ValueError(
          "info.num_examples must be positive and finite for the real "
          f"clients (mask 1), got {counts.tolist()}")
  if num_clients is not None and not is_traced(info.client_ids):
    ids = np.asarray(info.client_ids)[real]
    if np.any((ids < 0) | (ids >= num_clients)):
      raise ValueError(
          f"info.client_ids of the real clients (mask 1) must be in [0, "
          f"num_clients={num_clients}), the federation the rule was built "
          f"for; got {ids.tolist()}")
  return size
