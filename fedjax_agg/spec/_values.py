"""The errors of a run's description and the checks of its values.

Every section of the spec (``_sections``) and the whole experiment
(``_experiment``) check their values with these functions, so that one
wrong value gives the same error, naming its key path, whether the
description came from Python, a JSON config or the command line.
"""

import dataclasses
import inspect
import os
import re
from typing import Any

import numpy as np

from fedjax_agg import checkpoint
from fedjax_agg import checks
from fedjax_agg.checks import did_you_mean
from fedjax_agg import models
from fedjax_agg import partitions
from fedjax_agg import registry as registry_lib
from fedjax_agg.models import layers
from fedjax_agg.models import pretrained

MAX_CONFIG_DEPTH = 32
"""Deeper than this, a config is refused (the deepest legitimate entry, an
algorithm's argument holding a list, is 5 levels down)."""
# Partition arguments the run gives: the labels, N and the seed.
_PARTITION_GIVEN = ("labels", "num_clients", "seed")
# Model arguments the run gives (from the dataset).
_MODEL_GIVEN = ("name", "num_classes", "input_shape")


class ConfigError(ValueError):
  """A bad entry of a run's description.

  Attributes:
    path: its dotted key, e.g. "train.rounds", "seeds[1]",
      "algorithms.FedAdp.aggregator_args.alpha".
  """

  def __init__(self, path: str, message: str):
    super().__init__(message)
    self.path = path


class ConfigTypeError(ConfigError, TypeError):
  """An entry of the wrong type (a ``TypeError`` too)."""


def refusal(path: str, error: Exception, message: str) -> ConfigError:
  """The refusal at ``path`` of an entry that raised ``error``: a
  ``ConfigTypeError`` (a TypeError too) for a TypeError, else a
  ``ConfigError``."""
  kind = ConfigTypeError if isinstance(error, TypeError) else ConfigError
  return kind(path, message)


def plain(value, _level: int = 0):
  """``value`` with every numpy scalar (``np.bool_``, ``np.integer``,
  ``np.floating``, ``np.str_``), also inside lists, tuples and dicts (to
  ``MAX_CONFIG_DEPTH`` levels), replaced by its Python value
  (``.item()``): a description takes numpy scalars as the Python values
  they hold, so that they pass the same checks (``np.bool_`` is a bool,
  not an int) and serialise to JSON. Anything else is returned as it
  is."""
  if isinstance(value, (np.bool_, np.integer, np.floating, np.str_)):
    return value.item()
  if _level > MAX_CONFIG_DEPTH:
    return value  # refused as too deep where the depth is checked
  if isinstance(value, dict):
    converted = {key: plain(item, _level + 1)
                 for key, item in value.items()}
    # The original object is kept when nothing changed, so ``plain_fields``
    # reassigns only fields that held a numpy scalar.
    same = all(converted[key] is item for key, item in value.items())
    return value if same else converted
  # Exact types: a NamedTuple's constructor takes fields, not one iterable, so
  # subclasses are left as they are.
  if type(value) in (list, tuple):
    converted = [plain(item, _level + 1) for item in value]
    same = all(new is old for new, old in zip(converted, value, strict=True))
    return value if same else type(value)(converted)
  return value


def plain_fields(spec) -> None:
  """Replaces each field of the frozen dataclass ``spec`` by its
  ``plain`` value (before its checks run)."""
  for f in dataclasses.fields(spec):
    value = getattr(spec, f.name)
    converted = plain(value)
    if converted is not value:
      object.__setattr__(spec, f.name, converted)


def built(path: str, build, /, *args, **kwargs):
  """``build(...)`` (a factory, so that its own checks run); its errors
  become ConfigError / ConfigTypeError "<path>: <error>"."""
  try:
    return build(*args, **kwargs)
  # Kept a TypeError (``ConfigTypeError`` is both): callers that catch the
  # factory's TypeError still do.
  except TypeError as error:
    raise ConfigTypeError(path, f"{path}: {error}") from None
  except ValueError as error:
    raise ConfigError(path, f"{path}: {error}") from None


def _checked(path: str, check, *args, **kwargs) -> None:
  """Runs ``check(path, ...)`` of ``fedjax_agg.checks``; its errors become
  ConfigError / ConfigTypeError at ``path``."""
  try:
    registry_lib.argument(path, check, *args, **kwargs)
  except registry_lib.ArgumentError as error:
    raise refusal(path, error, str(error)) from None


def number(path: str, value, low=None, high=None, *, low_open: bool = False,
           high_open: bool = False) -> None:
  """A finite int or float scalar in the range (not an array, not a bool)."""
  # A bool is an int to Python, and an array would pass ``check_range``
  # (it checks every entry): both are refused as not a number.
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, (int, float, np.integer, np.floating)):
    expected = checks.describe_range(low, high, low_open=low_open,
                                     high_open=high_open)
    raise ConfigTypeError(path, f"{path} must be a number {expected}, got "
                          f"{value!r} ({type(value).__name__})")
  _checked(path, checks.check_range, value, low, high, low_open=low_open,
           high_open=high_open)


def integer(path: str, value, low: int, high=None) -> None:
  _checked(path, checks.check_int, value, low, high)


def optional_integer(path: str, value, low: int) -> None:
  if value is not None:
    integer(path, value, low)


def boolean(path: str, value) -> None:
  _checked(path, checks.check_bool, value)


def name_in(path: str, value, names) -> None:
  if not isinstance(value, str) or value not in names:
    raise ConfigError(path, f"{path} must be one of {list(names)}, got "
                      f"{value!r}{did_you_mean(value, names)}")
  # A registry's ``module:factory`` name is resolved here, so that a
  # refusal (a module the user did not allow, an undeclared object) names
  # the key.
  resolve = getattr(names, "resolve", None)
  if resolve is not None:
    try:
      resolve(value)
    except ValueError as error:
      raise ConfigError(path, f"{path}: {error}") from None


def mapping(path: str, value) -> dict:
  if not isinstance(value, dict):
    raise ConfigTypeError(path, f"{path} must be a mapping (a JSON object), "
                          f"got {value!r}")
  return value


def keys_in(path: str, value, allowed, required=()) -> dict:
  """``value`` is a dict holding every required key and only allowed
  ones; ``path`` "" is the top level."""
  mapping(path or "config", value)
  prefix = f"{path}." if path else ""
  for key in value:
    if key not in allowed:
      raise ConfigError(f"{prefix}{key}", f"{prefix}{key}: unknown key"
                        f"{did_you_mean(key, allowed)}; allowed: "
                        f"{sorted(allowed)}")
  for key in required:
    if key not in value:
      raise ConfigError(f"{prefix}{key}", f"{path or 'config'} must have a "
                        f"{key!r} entry")
  return value


def arguments_of(path: str, arguments, parameters) -> None:
  """Known keys only and every argument without a default given."""
  keys_in(path, arguments, parameters)
  for name, parameter in parameters.items():
    if parameter.default is inspect.Parameter.empty and name not in arguments:
      raise ConfigError(f"{path}.{name}", f"{path}.{name}: required (no "
                        "default)")


def depth(config) -> None:
  """Refuses a config nested deeper than ``MAX_CONFIG_DEPTH`` (walked
  without recursion, so any depth gives this error, never a
  ``RecursionError``)."""
  stack = [(config, "config", 0)]
  while stack:
    node, path, level = stack.pop()
    if level > MAX_CONFIG_DEPTH:
      top = path.split(".")[0].split("[")[0]
      raise ConfigError(top, f"{path[:80]}...: the config is nested "
                        f"deeper than {MAX_CONFIG_DEPTH} levels")
    if isinstance(node, dict):
      stack.extend((value, f"{key}" if path == "config" else f"{path}.{key}",
                    level + 1) for key, value in node.items())
    elif isinstance(node, (list, tuple)):
      stack.extend((value, f"{path}[{i}]", level + 1)
                   for i, value in enumerate(node))


def describe_parameters(parameters: dict[str, inspect.Parameter]
                        ) -> dict[str, Any]:
  """Argument -> default (``"<required>"`` where there is none), as
  ``Registry.describe``."""
  return {name: ("<required>" if p.default is inspect.Parameter.empty
                 else p.default) for name, p in parameters.items()}


def defaults_of(parameters: dict[str, inspect.Parameter]) -> dict[str, Any]:
  """The arguments' defaults (those without one left out)."""
  return {name: p.default for name, p in parameters.items()
          if p.default is not inspect.Parameter.empty}


def takes_any_keyword(factory) -> bool:
  """Whether ``factory`` takes keyword arguments it does not declare."""
  return any(p.kind == p.VAR_KEYWORD
             for p in inspect.signature(factory).parameters.values())


def keyword_parameters(factory) -> dict[str, inspect.Parameter]:
  """``factory``'s declared arguments (no ``*args`` / ``**kwargs``)."""
  return {p.name: p for p in inspect.signature(factory).parameters.values()
          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def rule_parameters(registry, name: str) -> dict[str, inspect.Parameter]:
  """A rule's arguments a description may give (all but the context
  ones, which the run passes)."""
  return {arg: p for arg, p in registry.parameters(name).items()
          if arg not in registry.context}


def partition_parameters(name: str) -> dict[str, inspect.Parameter]:
  """The arguments ``partition.args`` may give recipe ``name`` (all but
  the labels, ``num_clients`` and the seed; none for a natural
  federation's own clients)."""
  if name == partitions.NATURAL:
    return {}
  return {arg: p for arg, p in partitions.REGISTRY.parameters(name).items()
          if arg not in _PARTITION_GIVEN}


# The arguments of a checkpoint's network (``models.PRETRAINED``): its
# variables' storage and the blocks' rematerialisation.
_PRETRAINED_ARGUMENTS = {
    name: inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                            default=default)
    for name, default in (("dtype", "float32"), ("remat", False))}


def model_parameters(name: str) -> dict[str, inspect.Parameter]:
  """The declared arguments ``model.args`` may give network ``name``
  (see also ``model_takes_options``)."""
  if name == models.PRETRAINED:
    return dict(_PRETRAINED_ARGUMENTS)
  registry = models.REGISTRY
  return {arg: p for arg, p in registry.parameters(name).items()
          if arg not in _MODEL_GIVEN + tuple(registry.context)}


def model_takes_options(name: str) -> bool:
  """Whether network ``name`` also takes options ``model_parameters`` does
  not list (``**kwargs``)."""
  return takes_any_keyword(models.REGISTRY.factory(name))


def model_arguments(path: str, name: str, arguments: dict) -> None:
  """``arguments`` are network ``name``'s (its conv lowering a known
  one), each of its declared type and range (``models.check_option``),
  a bad one named by its path."""
  if name == models.PRETRAINED:  # the checkpoint's storage and remat
    keys_in(path, arguments, _PRETRAINED_ARGUMENTS)
    if "dtype" in arguments:
      name_in(f"{path}.dtype", arguments["dtype"], pretrained.DTYPES)
    if "remat" in arguments:
      boolean(f"{path}.remat", arguments["remat"])
    return
  if not model_takes_options(name):
    arguments_of(path, arguments, model_parameters(name))
  if "conv_impl" in arguments:
    name_in(f"{path}.conv_impl", arguments["conv_impl"], layers.CONV_IMPLS)
  options = {key: value for key, value in arguments.items()
             if key != "conv_impl"}
  if name in models.NAMES:  # the library's own networks
    for key, value in options.items():
      built(f"{path}.{key}", models.check_option, name, key, value)
    built(path, models.check_options, name, options)


def base_folder(path: str, folder, model: str) -> None:
  """``model.base`` (at ``path``) of network ``model``: None, or for
  ``models.PRETRAINED`` a Hugging Face checkpoint folder (config.json and
  every weight file's header checked, no tensor read), else a folder of
  ``checkpoint.save_variables``; refused naming the folder and the file
  at fault."""
  if model == models.PRETRAINED:
    if folder is None:
      raise ConfigError(path, f"{path} must name the checkpoint folder "
                        f"(config.json + safetensors) of model.name "
                        f"{models.PRETRAINED!r}, got None")
    if not isinstance(folder, str) or not pretrained.is_checkpoint(folder):
      raise ConfigError(path, f"{path} must be a Hugging Face checkpoint "
                        f"folder holding config.json and model.safetensors "
                        f"(model.name {models.PRETRAINED!r}), got {folder!r}")
    built(path, pretrained.check_checkpoint, folder)
  elif folder is not None:
    if isinstance(folder, str) and pretrained.is_checkpoint(folder):
      raise ConfigError(path, f"{path}: {folder!r} is a Hugging Face "
                        f"checkpoint (config.json), whose network is its own: "
                        f"set model.name to {models.PRETRAINED!r} (--model "
                        f"{models.PRETRAINED}) to start from it, not "
                        f"{model!r}")
    saved_variables(path, folder)


def saved_variables(path: str, folder) -> None:
  """``folder`` (at ``path``, e.g. "model.base") holds readable variables
  written by ``checkpoint.save_variables``: a missing, empty or damaged
  one is refused here, naming the folder, before anything runs."""
  if not isinstance(folder, str) or not os.path.isdir(folder):
    raise ConfigError(path, f"{path} must be a folder of pre-trained "
                      "variables (checkpoint.save_variables), got "
                      f"{folder!r}")
  try:
    checkpoint.saved_variables(folder)
  except checkpoint.CheckpointError as error:
    raise ConfigError(path, f"{path}: {error}") from None


# An algorithm's name becomes a folder of the output (results and
# checkpoints): one path component, no separators, no leading dot (".."
# would write outside the output folder, ".x" would hide it).
_SAFE_NAME = re.compile(r"[A-Za-z0-9_(][A-Za-z0-9 _.,()+=-]{0,127}")


RESERVED_NAMES = frozenset((
    "config.json", "summary.json", "summary.csv", "curves.png",
    "partition.png", "accuracy_by_time.png", "history.csv", "history.json",
    "checkpoint", "checkpoints"))
"""Names of the run folder's own files and folders (``experiment.RunFolder``,
checkpoints), lower case (a case-insensitive file system would mix them):
no algorithm's folder may take one."""


def check_algorithm_name(name) -> None:
  """Refuses an algorithm name that is not a safe folder name."""
  if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or (
      # Windows drops a trailing space or dot from a folder name: "a." and "a"
      # would be one folder there.
      name.endswith((" ", "."))):
    raise ConfigError(
        "algorithms", f"algorithms: the name {name!r} is not a safe folder "
        "name (results are written to <out>/<name>): use 1-128 letters, "
        "digits, spaces and _ . , ( ) + = -, starting with a letter, digit, "
        "_ or (, not ending with a space or a dot")
  if name.lower() in RESERVED_NAMES:
    raise ConfigError(
        "algorithms", f"algorithms: the name {name!r} is a file or folder "
        "the run itself writes in <out> (one of "
        f"{', '.join(sorted(RESERVED_NAMES))}); name the algorithm "
        "otherwise")
