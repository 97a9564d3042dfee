"""The errors of an experiment config, the checks of values every part of
a config uses and the checks of its setting: the dataset, partition,
model, train values and seeds (with the arguments a config may give each
partition recipe and network).

Part of ``fedjax_agg.experiment`` (its docstring describes the config);
``_checks`` adds the algorithms and the blocks around them and puts the
whole check together (``check_config``).
"""

import functools
import inspect
from typing import Any

import numpy as np

from fedjax_agg import checks
from fedjax_agg import data as data_lib
from fedjax_agg import models
from fedjax_agg import partitions
from fedjax_agg import loop
from fedjax_agg import spec as spec_lib
from fedjax_agg import stragglers
from fedjax_agg.config import MATMUL_PRECISIONS
from fedjax_agg.config import OPTIMIZERS
from fedjax_agg.experiment._build import seeds_of
from fedjax_agg.experiment._build import TRAIN_DEFAULTS
from fedjax_agg.experiment._data import DATASET_DEFAULTS
from fedjax_agg.experiment._data import MAX_CONFIG_DEPTH
from fedjax_agg.experiment._data import SUBSET_SOURCES


class ConfigError(ValueError):
  """A bad config entry.

  Attributes:
    path: its dotted key, e.g. "train.rounds", "seeds[1]",
      "algorithms.FedAdp.aggregator_args.alpha".
  """

  def __init__(self, path: str, message: str):
    super().__init__(message)
    self.path = path


class ConfigTypeError(ConfigError, TypeError):
  """A config entry of the wrong type (a ``TypeError`` too)."""


PARTITION_KEYS = spec_lib.keys(spec_lib.PartitionSpec)
"""The keys of a config's "partition" block (see ``fedjax_agg.experiment``)."""
MODEL_KEYS = spec_lib.keys(spec_lib.ModelSpec)
"""The keys of a config's "model" block (see ``fedjax_agg.experiment``)."""
# Partition arguments the runner gives: the labels, N and the seed.
_PARTITION_GIVEN = ("labels", "num_clients", "seed")
# Model arguments the runner gives (from the dataset).
_MODEL_GIVEN = ("name", "num_classes", "input_shape")


def _built(path: str, build, /, *args, **kwargs) -> None:
  """Calls ``build(...)`` (a factory, so that its own checks run); its
  errors become ConfigError / ConfigTypeError "<path>: <error>"."""
  try:
    build(*args, **kwargs)
  except TypeError as error:
    raise ConfigTypeError(path, f"{path}: {error}") from None
  except ValueError as error:
    raise ConfigError(path, f"{path}: {error}") from None


def _checked(path: str, check, *args, **kwargs) -> None:
  """Runs ``check(path, ...)`` of ``fedjax_agg.checks``; its errors become
  ConfigError / ConfigTypeError at ``path``."""
  try:
    check(path, *args, **kwargs)
  except TypeError as error:
    raise ConfigTypeError(path, str(error)) from None
  except ValueError as error:
    raise ConfigError(path, str(error)) from None


def _check_number(path: str, value, low=None, high=None, *,
                  low_open: bool = False, high_open: bool = False) -> None:
  """A finite int or float scalar in the range (not an array, not a bool)."""
  if not isinstance(value, (int, float, np.integer, np.floating)):
    expected = checks.describe_range(low, high, low_open=low_open,
                                     high_open=high_open)
    raise ConfigTypeError(path, f"{path} must be a number {expected}, got "
                          f"{value!r} ({type(value).__name__})")
  _checked(path, checks.check_range, value, low, high, low_open=low_open,
           high_open=high_open)


def _check_optional_int(path: str, value, low: int) -> None:
  if value is not None:
    _check_int(path, value, low)


def _check_compute_losses(path: str, value) -> None:
  if not (isinstance(value, bool) or value == "auto"):
    raise ConfigTypeError(path, f"{path} must be true, false or \"auto\", "
                          f"got {value!r}")


def _check_eval_clients(path: str, value) -> None:
  if value == "auto" or isinstance(value, bool):
    return
  _check_int(path, value, 1)


def _check_int(path: str, value, low: int) -> None:
  _checked(path, checks.check_int, value, low)


def _check_bool(path: str, value) -> None:
  _checked(path, checks.check_bool, value)


TRAIN_CHECKS = {
    "rounds": functools.partial(_check_int, low=0),
    "participation": functools.partial(_check_number, low=0, high=1,
                                       low_open=True),
    "local_epochs": functools.partial(_check_int, low=1),
    "batch_size": functools.partial(_check_int, low=1),
    "learning_rate": functools.partial(_check_number, low=0, low_open=True),
    "momentum": functools.partial(_check_number, low=0, high=1,
                                  high_open=True),
    "stragglers": functools.partial(_check_number, low=0, high=1),
    "straggler_unit": lambda path, value: _check_name(path, value,
                                                      stragglers.UNITS),
    "eval_every": functools.partial(_check_int, low=1),
    "eval_clients": _check_eval_clients,
    "clients_per_step": functools.partial(_check_optional_int, low=1),
    "compute_losses": _check_compute_losses,
    "matmul_precision": lambda path, value: _check_name(path, value,
                                                        MATMUL_PRECISIONS),
    "devices": functools.partial(_check_optional_int, low=1),
    "optimizer": lambda path, value: _check_name(path, value, OPTIMIZERS),
    "weight_decay": functools.partial(_check_number, low=0),
    "personalized": lambda path, value: _check_bool(path, value),
    "finetune_steps": functools.partial(_check_int, low=0),
}
"""Train key -> ``check(path, value)``, the check of that key of a config's
"train" block (raises naming ``path``)."""


def _check_mapping(path: str, value) -> dict:
  if not isinstance(value, dict):
    raise ConfigTypeError(path, f"{path} must be a mapping (a JSON object), "
                          f"got {value!r}")
  return value


def _check_keys(path: str, mapping, allowed, required=()) -> dict:
  """``mapping`` is a dict holding every required key and only allowed
  ones; ``path`` "" is the top level."""
  _check_mapping(path or "config", mapping)
  prefix = f"{path}." if path else ""
  for key in mapping:
    if key not in allowed:
      raise ConfigError(f"{prefix}{key}", f"{prefix}{key}: unknown key; "
                        f"allowed: {sorted(allowed)}")
  for key in required:
    if key not in mapping:
      raise ConfigError(f"{prefix}{key}", f"{path or 'config'} must have a "
                        f"{key!r} entry")
  return mapping


def _check_name(path: str, value, names) -> None:
  if not isinstance(value, str) or value not in names:
    raise ConfigError(path, f"{path} must be one of {list(names)}, got "
                      f"{value!r}")


def describe_parameters(parameters: dict[str, inspect.Parameter]
                        ) -> dict[str, Any]:
  """Argument -> default (``"<required>"`` where there is none), as
  ``Registry.describe``."""
  return {name: ("<required>" if p.default is inspect.Parameter.empty
                 else p.default) for name, p in parameters.items()}


def takes_any_keyword(factory) -> bool:
  """Whether ``factory`` takes keyword arguments it does not declare."""
  return any(p.kind == p.VAR_KEYWORD
             for p in inspect.signature(factory).parameters.values())


def _keyword_parameters(factory) -> dict[str, inspect.Parameter]:
  return {p.name: p for p in inspect.signature(factory).parameters.values()
          if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def partition_parameters(name: str) -> dict[str, inspect.Parameter]:
  """The arguments a config's ``partition.args`` may give recipe ``name``
  (all but the labels, ``num_clients`` and the seed; none for a natural
  federation's own clients)."""
  if name == partitions.NATURAL:
    return {}
  return {arg: p for arg, p in partitions.REGISTRY.parameters(name).items()
          if arg not in _PARTITION_GIVEN}


def model_parameters(name: str) -> dict[str, inspect.Parameter]:
  """The declared arguments a config's ``model.args`` may give network
  ``name`` (see also ``model_takes_options``)."""
  registry = getattr(models, "REGISTRY", None)
  if registry is not None:
    parameters = registry.parameters(name)
    return {arg: p for arg, p in parameters.items()
            if arg not in _MODEL_GIVEN + tuple(registry.context)}
  return {arg: p for arg, p in _keyword_parameters(models.get).items()
          if arg not in _MODEL_GIVEN}


def model_takes_options(name: str) -> bool:
  """Whether network ``name`` also takes options ``model_parameters`` does
  not list (``models.get``'s ``**kwargs``, known to ``models.module``)."""
  registry = getattr(models, "REGISTRY", None)
  return takes_any_keyword(registry.factory(name) if registry is not None
                           else models.get)


def _check_arguments(path: str, arguments, parameters) -> None:
  """Known keys only and every argument without a default given."""
  _check_keys(path, arguments, parameters)
  for name, parameter in parameters.items():
    if parameter.default is inspect.Parameter.empty and name not in arguments:
      raise ConfigError(f"{path}.{name}", f"{path}.{name}: required (no "
                        "default)")


def _check_depth(config) -> None:
  """Refuses a config nested deeper than ``MAX_CONFIG_DEPTH`` (walked
  without recursion, so any depth gives this error, never a
  ``RecursionError``)."""
  stack = [(config, "config", 0)]
  while stack:
    node, path, depth = stack.pop()
    if depth > MAX_CONFIG_DEPTH:
      top = path.split(".")[0].split("[")[0]
      raise ConfigError(top, f"{path[:80]}...: the config is nested "
                        f"deeper than {MAX_CONFIG_DEPTH} levels")
    if isinstance(node, dict):
      stack.extend((value, f"{key}" if path == "config" else f"{path}.{key}",
                    depth + 1) for key, value in node.items())
    elif isinstance(node, (list, tuple)):
      stack.extend((value, f"{path}[{i}]", depth + 1)
                   for i, value in enumerate(node))


def _check_dataset(config: dict) -> None:
  dataset = _check_keys("dataset", config["dataset"],
                        ("name", *DATASET_DEFAULTS), required=("name",))
  _check_name("dataset.name", dataset["name"], data_lib.ALL_NAMES)
  dataset = {**DATASET_DEFAULTS, **dataset}
  arguments = _check_mapping("dataset.args", dataset["args"])
  if dataset["name"] in data_lib.FEDERATIONS:
    # A natural federation brings its own clients and test rows.
    _check_arguments("dataset.args", arguments,
                     data_lib.federation_parameters(
                         dataset["name"]))
    for key in ("standardize", "max_train_examples", "max_test_examples"):
      if dataset[key] not in (None, False):
        raise ConfigError(f"dataset.{key}", f"dataset.{key} applies to the "
                          "image datasets, not to the natural federation "
                          f"{dataset['name']!r} (its clients are its own)")
    if dataset["source"] != "auto":
      raise ConfigError("dataset.source", f"dataset.source must be 'auto' "
                        f"for the natural federation {dataset['name']!r}")
  elif arguments:
    raise ConfigError("dataset.args", f"dataset.args are a natural "
                      f"federation's ({data_lib.FEDERATIONS}); dataset "
                      f"{dataset['name']!r} takes none, got "
                      f"{sorted(arguments)}")
  _check_name("dataset.source", dataset["source"], data_lib.SOURCES)
  if dataset["source"] == "mnist_5k" and dataset["name"] != "mnist":
    raise ConfigError("dataset.source", "dataset.source 'mnist_5k' holds "
                      f"only dataset 'mnist', not {dataset['name']!r}")
  if dataset["data_dir"] is not None and not isinstance(
      dataset["data_dir"], str):
    raise ConfigTypeError("dataset.data_dir", "dataset.data_dir must be a "
                          f"path string or null, got {dataset['data_dir']!r}")
  _check_bool("dataset.standardize", dataset["standardize"])
  _check_bool("dataset.allow_subset", dataset["allow_subset"])
  if not dataset["allow_subset"] and dataset["source"] in SUBSET_SOURCES:
    raise ConfigError("dataset.allow_subset", "dataset.allow_subset false "
                      f"with source {dataset['source']!r} (a subset)")
  for split in ("train", "test"):
    key = f"max_{split}_examples"
    _check_optional_int(f"dataset.{key}", dataset[key], 1)


def _check_partition(config: dict) -> None:
  partition = _check_keys("partition", config["partition"], PARTITION_KEYS,
                          required=("name", "num_clients"))
  _check_name("partition.name", partition["name"], partitions.ALL_NAMES)
  _check_int("partition.num_clients", partition["num_clients"], 1)
  _check_int("partition.seed_offset", partition.get("seed_offset", 0), 0)
  natural = partition["name"] == partitions.NATURAL
  federation = config["dataset"]["name"] in data_lib.FEDERATIONS
  if natural != federation:
    raise ConfigError("partition.name", (
        f"partition.name {partitions.NATURAL!r} takes a natural federation "
        f"{data_lib.FEDERATIONS} as dataset, not "
        f"{config['dataset']['name']!r}") if natural else (
            f"dataset {config['dataset']['name']!r} is a natural federation: "
            f"partition.name must be {partitions.NATURAL!r} (its own "
            f"clients), not {partition['name']!r}"))
  _check_arguments("partition.args", partition.get("args", {}),
                   partition_parameters(partition["name"]))
  _check_number("partition.holdout_fraction",
                partition.get("holdout_fraction", 0.0), 0, 1,
                high_open=True)


def _check_model(config: dict) -> None:
  model = _check_keys("model", config["model"], MODEL_KEYS,
                      required=("name",))
  _check_name("model.name", model["name"], models.NAMES)
  _check_model_arguments("model.args", model["name"],
                         _check_mapping("model.args", model.get("args", {})))


def _check_model_arguments(path: str, name: str, arguments: dict) -> None:
  if not model_takes_options(name):
    _check_arguments(path, arguments, model_parameters(name))
  elif getattr(models, "REGISTRY", None) is None:
    # Only the module knows its options: ask it (nothing is built).
    try:
      models.module(name, 2, **arguments)
    except TypeError as error:
      raise ConfigError(path, f"{path}: {error}") from None
  if "conv_impl" in arguments:
    from fedjax_agg.models import layers  # pylint: disable=g-import-not-at-top
    _check_name(f"{path}.conv_impl", arguments["conv_impl"],
                layers.CONV_IMPLS)


def _check_train(path: str, train) -> None:
  _check_keys(path, train, TRAIN_DEFAULTS)
  for key, value in train.items():
    if key in TRAIN_CHECKS:
      TRAIN_CHECKS[key](f"{path}.{key}", value)


def _check_seeds(config: dict) -> None:
  seeds = config["seeds"] if "seeds" in config else seeds_of(config)
  if not isinstance(seeds, list) or not seeds:
    raise ConfigTypeError("seeds", f"seeds must be a non-empty list of ints "
                          f">= 0, got {seeds!r}")
  for i, seed in enumerate(seeds):
    _checked(f"seeds[{i}]", checks.check_int, seed, 0, loop.MAX_SEED)
  if len(set(seeds)) != len(seeds):
    raise ConfigError("seeds", f"seeds must be distinct, got {seeds}")
