"""The population's models by name, and their arguments checked up front.

``AVAILABILITY`` (with ``PROFILES`` of ``_profiles``) names the models a
run builds its population from once it knows N. ``check_model_arguments``
runs their argument checks before that, where a ``config.Systems`` is
built: each factory's own checks (ranges, required arguments), called on a
population of one client, since none of them depends on N; for the models
read from a CSV file, that the file exists (the rows, whose client ids do
depend on N, are checked when the run reads them).
"""

import os
from typing import Mapping

from fedjax_agg.registry import Registry
from fedjax_agg.systems._availability import always
from fedjax_agg.systems._availability import diurnal
from fedjax_agg.systems._availability import read_intervals
from fedjax_agg.systems._markov import markov
from fedjax_agg.systems._profiles import PROFILES

__all__ = ["AVAILABILITY", "check_model_arguments"]

AVAILABILITY = Registry("availability", {
    "always": always,
    "markov": markov,
    "diurnal": diurnal,
    "intervals": read_intervals,
}, context=("num_clients", "seed"))
"""Availability models by name: name -> factory of an ``Availability``;
``AVAILABILITY.build(name, num_clients=N, seed=s, **kwargs)`` passes N and the
seed to the models that take them."""

TRACE = "trace"
"""The profiles read from a CSV file (``read_profiles``), by ``path``."""


def _check_path(where: str, path) -> None:
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"{where}: path must be a file path (str), got "
                    f"{path!r}")
  if not os.path.isfile(path):
    raise ValueError(f"{where}: path {os.fspath(path)!r}: no such file")


def _check_model(registry: Registry, name: str, arguments: Mapping,
                 where: str, seed: int) -> None:
  """``name``'s arguments: known, and accepted by its factory."""
  registry.check_arguments(name, arguments, where)
  given_context = sorted(set(arguments) & set(registry.context))
  if given_context:
    raise TypeError(f"{where}: {given_context} come from the run (the "
                    f"data's N, Systems.seed), not from {where}")
  if registry.takes(name, "path"):
    if "path" not in arguments:
      raise ValueError(f"{where}: {registry.kind} {name!r} reads a CSV "
                       f"file: give its {{'path': csv}}")
    _check_path(where, arguments["path"])
    return
  try:
    # Built for real, on one client: the factory's own checks run, at the cost
    # of a population of one.
    registry.build(name, num_clients=1, seed=seed, **arguments)
  except (TypeError, ValueError) as error:
    raise type(error)(f"{where}: {error}") from None


def check_model_arguments(profiles: str, profile_args: Mapping,
                          availability: str, availability_args: Mapping,
                          seed: int) -> None:
  """Raises unless the population's models would build (module docstring).

  Args:
    profiles: a ``PROFILES`` name or "trace".
    profile_args: its arguments ({'path': csv} for "trace").
    availability: an ``AVAILABILITY`` name.
    availability_args: its arguments.
    seed: the population's seed (an int >= 0).

  Raises:
    TypeError: an unknown argument, or one of the wrong kind (named, with
      "profile_args: " or "availability_args: " first).
    ValueError: an argument out of range, a missing required one, or a
      path where there is no file (named, with the path).
  """
  if profiles == TRACE:
    if set(profile_args) != {"path"}:
      raise ValueError("profile_args: profiles='trace' takes exactly "
                       f"{{'path': csv}}, got {dict(profile_args)!r}")
    _check_path("profile_args", profile_args["path"])
  else:
    _check_model(PROFILES, profiles, profile_args, "profile_args", seed)
  _check_model(AVAILABILITY, availability, availability_args,
               "availability_args", seed)
