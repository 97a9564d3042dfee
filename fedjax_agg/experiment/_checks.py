"""Checks of an experiment config before anything runs (``check_config``):
the setting's (``_checks_setting``), each algorithm's (its name, rules and
client side) and those of the blocks around them (attack, privacy,
systems, early stopping); the keys of those parts of a config.

Part of ``fedjax_agg.experiment`` (its docstring describes the config).
"""

import inspect
import re

import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import clients
from fedjax_agg import data as data_lib
from fedjax_agg import loop
from fedjax_agg import objectives
from fedjax_agg import rounds
from fedjax_agg import spec as spec_lib
from fedjax_agg.config import Privacy
from fedjax_agg.config import Systems
from fedjax_agg.experiment._build import _rule_parameters
from fedjax_agg.experiment._build import _train_config
from fedjax_agg.experiment._build import objective_of
from fedjax_agg.experiment._build import OWN_OBJECTIVE_CLIENTS
from fedjax_agg.experiment._build import PAIRED_RULES
from fedjax_agg.experiment._build import PRIVATE_AGGREGATORS
from fedjax_agg.experiment._build import rule_arguments
from fedjax_agg.experiment._build import run_privacy
from fedjax_agg.experiment._checks_setting import _built
from fedjax_agg.experiment._checks_setting import _check_bool
from fedjax_agg.experiment._checks_setting import _check_dataset
from fedjax_agg.experiment._checks_setting import _check_depth
from fedjax_agg.experiment._checks_setting import _check_int
from fedjax_agg.experiment._checks_setting import _check_keys
from fedjax_agg.experiment._checks_setting import _check_mapping
from fedjax_agg.experiment._checks_setting import _check_model
from fedjax_agg.experiment._checks_setting import _check_model_arguments
from fedjax_agg.experiment._checks_setting import _check_name
from fedjax_agg.experiment._checks_setting import _check_number
from fedjax_agg.experiment._checks_setting import _check_partition
from fedjax_agg.experiment._checks_setting import _check_seeds
from fedjax_agg.experiment._checks_setting import _check_train
from fedjax_agg.experiment._checks_setting import _keyword_parameters
from fedjax_agg.experiment._checks_setting import ConfigError
from fedjax_agg.experiment._checks_setting import ConfigTypeError
from fedjax_agg.experiment._checks_setting import takes_any_keyword

# Importable from here as before ``_checks_setting`` was split off
# (``_record`` takes them from here).
from fedjax_agg.experiment._checks_setting import (
    model_parameters as model_parameters)
from fedjax_agg.experiment._checks_setting import (
    partition_parameters as partition_parameters)


TOP_KEYS = spec_lib.keys(spec_lib.Experiment)
"""The top-level keys of a config (see ``fedjax_agg.experiment``); "provenance"
is what ``run_record`` adds to the configs it writes."""
# "attack": simulated malicious clients (``fedjax_agg.attacks``) in every
# algorithm's runs: the attack's registered name and arguments, the
# fraction of malicious clients, and whether they are a fixed set (drawn
# once from "seed") or drawn anew from each round's cohort (defaults:
# ``_build.ATTACK_DEFAULTS``).
ATTACK_KEYS = spec_lib.keys(spec_lib.AttackSpec)
ADVERSARY_MODES = spec_lib.ADVERSARY_MODES
# "privacy": the accounting of dp_fedavg algorithms (``config.Privacy``;
# the noise multiplier is the rule's own). Every dp_fedavg run records
# epsilon, with these defaults when the block is absent.
PRIVACY_KEYS = spec_lib.keys(spec_lib.PrivacySpec)
ALGORITHM_KEYS = spec_lib.keys(spec_lib.AlgorithmSpec)
"""The keys of one algorithm's entry in a config's "algorithms"."""
SCRIPT_KEYS = spec_lib.SCRIPT_KEYS
SCRIPT_ALGORITHM_KEYS = spec_lib.SCRIPT_ALGORITHM_KEYS


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
  # A "module:factory" name is imported here, its failure named.
  _built(f"{path}.aggregator", aggregators.REGISTRY.factory,
         spec["aggregator"])
  _built(f"{path}.objective", objectives.REGISTRY.factory, objective_of(spec))
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
  model_args = _check_mapping(f"{path}.model_args", spec.get("model_args",
                                                             {}))
  _check_model_arguments(f"{path}.model_args", config["model"]["name"],
                         {**config["model"].get("args", {}), **model_args})
  train = _train_config(config, name)
  _check_client(config, name, spec, train)
  if train["optimizer"] == "adam" and train["momentum"]:
    key = ("train.momentum" if "momentum" in config.get("train", {})
           else f"{path}.train.momentum")
    raise ConfigError(key, f"{key}: momentum is for optimizer 'sgd' (Adam "
                      "has its own betas), got momentum="
                      f"{train['momentum']!r} with optimizer 'adam'")


# The client options a config may give besides a client's own arguments
# (``clients.ClientOptions``; how its training runs comes from "train").
CLIENT_OPTIONS = ("placement", "path")


def _check_pair(config, name, spec, client, arguments) -> None:
  """A client side that needs its server rule gets it, with the same
  value of the argument they share (FedDyn's alpha)."""
  if client not in PAIRED_RULES:
    return
  rule, shared = PAIRED_RULES[client]
  path = f"algorithms.{name}"
  if spec["aggregator"] != rule:
    raise ConfigError(f"{path}.aggregator", f"{path}.aggregator: the "
                      f"{client} client needs the {rule!r} rule (its server "
                      f"side), got {spec['aggregator']!r}; pair the client "
                      f"side with its own rule (e.g. clients.{client} with "
                      f"aggregators.{rule})")
  ours = arguments.get(shared, clients.REGISTRY.parameters(client)[
      shared].default)
  theirs = rule_arguments(config, name)[0][shared]
  if ours != theirs:
    raise ConfigError(
        f"{path}.client_args.{shared}", f"{path}.client_args.{shared}: "
        f"the {client} client and rule must share {shared}, got {ours!r} "
        f"(client) and {theirs!r} (aggregator_args)")


def _check_client(config: dict, name: str, spec: dict, train: dict) -> None:
  """The algorithm's client side and what needs one: personalised
  evaluation needs personal models, held-out evaluation a held-out split."""
  path = f"algorithms.{name}"
  client = spec.get("client")
  arguments = _check_mapping(f"{path}.client_args",
                             spec.get("client_args", {}))
  if client is None:
    if arguments:
      raise ConfigError(f"{path}.client_args", f"{path}.client_args: "
                        "given without a client")
  else:
    _check_name(f"{path}.client", client, clients.REGISTRY.names)
    allowed = [arg for arg in clients.REGISTRY.parameters(client)
               if arg not in clients.REGISTRY.context]
    _check_keys(f"{path}.client_args", arguments,
                allowed + list(CLIENT_OPTIONS))
    if (client in OWN_OBJECTIVE_CLIENTS
        and objective_of(spec) != "cross_entropy"):
      raise ConfigError(
          f"{path}.objective", f"{path}.objective: the {client} client sets "
          f"its own local objective; got {objective_of(spec)!r} (leave it "
          "cross_entropy)")
    _check_pair(config, name, spec, client, arguments)
    if config.get("attack") is not None:
      raise ConfigError(
          "attack", f"attack: {name} has a client side ({client!r}); "
          "attacks replace the plain local training and are not combined "
          "with a client side")
  if train["personalized"] and client not in _PERSONAL_CLIENTS:
    key = ("train.personalized" if "personalized" in config.get("train", {})
           else f"{path}.train.personalized")
    raise ConfigError(key, f"{key}: personal models need a client side "
                      f"that keeps them ({list(_PERSONAL_CLIENTS)}), got "
                      f"{path}.client={client!r}")
  if (train["personalized"] or train["finetune_steps"]) and not config[
      "partition"].get("holdout_fraction", 0.0):
    raise ConfigError(
        "partition.holdout_fraction", "partition.holdout_fraction: "
        f"{name}'s personalized / finetune_steps evaluate on each client's "
        "held-out split; set a fraction in (0, 1)")


# Client sides with personal models (a ``personalize``).
_PERSONAL_CLIENTS = ("fedbn", "ditto", "fedper", "fedrep", "apfl")


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
    _built(f"algorithms.{name}.{key}", registry.build, rule, **arguments,
           **({"num_clients": config["partition"]["num_clients"]}
              if "num_clients" in registry.context else {}))


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
  _built("attack.args", attacks.build, attack["name"], **arguments)
  dataset = config["dataset"]
  task = data_lib.federation_task(dataset.get("name"), dataset.get("args")
                                  or {}) if isinstance(dataset, dict) else None
  tasks = attacks.TASKS.get(attack["name"])
  if task is not None and tasks is not None and task not in tasks:
    raise ConfigError(
        "attack", f"attack: {attack['name']} is defined for "
        f"{' and '.join(tasks)} tasks; dataset {dataset.get('name')!r} is a "
        f"{task} task (per-token targets, no class to relabel with)")


def _check_early_stopping(config: dict) -> None:
  if config.get("early_stopping") is None:
    return
  block = _check_keys("early_stopping", config["early_stopping"],
                      spec_lib.keys(spec_lib.EarlyStoppingSpec))
  for key, value in block.items():
    _built(f"early_stopping.{key}", loop.EarlyStopping, **{key: value})


def _check_privacy(config: dict) -> None:
  if config.get("privacy") is None:
    return
  block = _check_keys("privacy", config["privacy"], PRIVACY_KEYS)
  if not any(spec.get("aggregator") in PRIVATE_AGGREGATORS
             for spec in config["algorithms"].values()):
    path = f"privacy.{next(iter(block))}" if block else "privacy"
    raise ConfigError(path, f"{path}: every algorithm's aggregator adds no "
                      "calibrated Gaussian noise, so the runs have no privacy "
                      "guarantee to account; use a private rule "
                      f"{PRIVATE_AGGREGATORS}, or drop privacy")
  for key, value in block.items():
    _built(f"privacy.{key}", Privacy, 1.0, **{key: value})
  try:
    Privacy(1.0, **block)
  except ValueError as error:
    raise ConfigError("privacy.accountant",
                      f"privacy.accountant: {error}") from None


def _check_systems(config: dict) -> None:
  if config.get("systems") is None:
    return
  block = _check_keys("systems", config["systems"],
                      spec_lib.keys(spec_lib.SystemsSpec))
  # Each key checked with the key it depends on (a name's arguments, the
  # codec of error feedback), so that an error names the key at fault.
  parents = {"profile_args": ("profiles",),
             "availability_args": ("availability",), "codec_args": ("codec",),
             "error_feedback": ("codec",),
             "staleness": ("concurrency",),
             "staleness_args": ("staleness", "concurrency"),
             "max_staleness": ("concurrency",),
             "secagg_clip": ("secagg_bits",)}
  # Arguments first, each with its name, so that a bad argument is named;
  # then a name with its arguments ("trace" profiles need their path).
  for key, value in sorted(block.items(), key=lambda kv: kv[0] not in
                           parents):
    related = set(parents.get(key, ())) | {
        child for child, names in parents.items() if key in names}
    together = {key: value}
    together.update({other: block[other] for other in related
                     if other in block})
    _built(f"systems.{key}", Systems, **together)
  _built("systems", Systems, **block)


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
  _check_systems(config)
  _check_early_stopping(config)
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
    cohort = rounds.num_sampled(num_clients, train["participation"])
    if config["algorithms"][name]["aggregator"] == "dp_ftrl":
      # Tree aggregation: round 1 is one node, each client in it once,
      # whatever cohort is drawn (no amplification by sampling).
      first = privacy_lib.tree_epsilons(
          privacy.noise_multiplier, np.arange(cohort)[None],
          delta=privacy.delta,
          restart_every=rule_arguments(config, name)[0].get(
              "restart_every"))[0]
    else:
      first = privacy_lib.epsilon(
          privacy.noise_multiplier, 1, num_clients=num_clients,
          cohort_size=cohort, delta=privacy.delta,
          sampling=privacy.sampling, accountant=privacy.accountant)
    if first > target:
      raise ConfigError(
          "privacy.target_epsilon",
          f"privacy.target_epsilon: {target} cannot be met by "
          f"{name}: a single round already costs epsilon={first:.4g} "
          f"(noise_multiplier={privacy.noise_multiplier}); raise the "
          "target or the noise")
