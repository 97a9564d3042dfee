"""``Experiment``: a whole run's description, the checks that need two of
its sections, what a run derives from it (each algorithm's training and
the rules' full arguments) and its JSON form.
"""

import dataclasses
import inspect
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import clients
from fedjax_agg import config as config_lib
from fedjax_agg import data as data_lib
from fedjax_agg import loop
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import privacy as privacy_lib
from fedjax_agg import rounds
from fedjax_agg import secagg
from fedjax_agg import systems as systems_lib
from fedjax_agg import types
from fedjax_agg.spec import _values as v
from fedjax_agg.spec._adapters import ADAPTER_ONLY_RULES
from fedjax_agg.spec._adapters import ADAPTER_RULES
from fedjax_agg.spec._adapters import AdaptersSpec
from fedjax_agg.spec._fields import spec_field as _field
from fedjax_agg.spec._sections import AlgorithmSpec
from fedjax_agg.spec._sections import AttackSpec
from fedjax_agg.spec._values import check_algorithm_name
from fedjax_agg.spec._sections import DataSpec
from fedjax_agg.spec._sections import EarlyStoppingSpec
from fedjax_agg.spec._fields import Flag
from fedjax_agg.spec._sections import keys
from fedjax_agg.spec._sections import ModelSpec
from fedjax_agg.spec._sections import PartitionSpec
from fedjax_agg.spec._sections import PrivacySpec
from fedjax_agg.spec._sections import SCRIPT_ALGORITHM_KEYS
from fedjax_agg.spec._sections import SCRIPT_KEYS
from fedjax_agg.spec._sections import SystemsSpec
from fedjax_agg.spec._train import TrainSpec

PAIRED_RULES = {"feddyn": ("feddyn", "alpha")}
"""Client side -> (the server rule it needs, the argument both must share)."""
PRIVATE_AGGREGATORS = ("dp_fedavg", "dp_ftrl")
"""Rules whose runs account their privacy (the "privacy" section)."""
PERSONAL_CLIENTS = ("fedbn", "ditto", "fedper", "fedrep", "apfl")
"""Client sides with personal models (a ``personalize``)."""


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A whole experiment: several algorithms x seeds on one setting.

  Build it in Python (each section a spec object, or a mapping of its
  keys), or from a JSON config with ``from_dict``; either way every key
  and value is checked when it is built (a ``ConfigError`` naming the key
  path): each section checks its own, and this class what needs two of
  them (the data and its partition, a client side and its rule, privacy
  and the rules, ...), building every rule once with its full arguments
  so that the rules' own checks run before anything is read or written.
  """
  dataset: DataSpec = _field(dataclasses.MISSING)
  partition: PartitionSpec = _field(dataclasses.MISSING)
  model: ModelSpec = _field(dataclasses.MISSING)
  algorithms: Mapping[str, AlgorithmSpec] = _field(dataclasses.MISSING)
  name: Optional[str] = _field(None)
  train: TrainSpec = dataclasses.field(default_factory=TrainSpec,
                                       metadata={"flags": ()})
  seeds: list = _field([0], Flag(
      "--seed", "seed of the run", kind="seed", type=int, preset=0),
      Flag("--seeds", "comma-separated seeds, run as ONE vmapped sweep "
           "(e.g. 0,1,2); replaces --seed", kind="seeds"))
  target_accuracy: Optional[float] = _field(None)
  vmap_seeds: bool = _field(False)
  attack: Optional[AttackSpec] = _field(None)
  privacy: Optional[PrivacySpec] = _field(None)
  systems: Optional[SystemsSpec] = _field(None)
  early_stopping: Optional[EarlyStoppingSpec] = _field(None)
  provenance: Optional[dict] = _field(None)

  def __post_init__(self):
    # Numpy scalars are taken as their Python values; mappings become
    # spec objects (each checking itself); then what needs several
    # sections is checked once.
    v.plain_fields(self)
    for name, cls in SECTIONS.items():
      value = getattr(self, name, None)
      if name == "algorithms" or (value is None and name in _OPTIONAL):
        continue
      if isinstance(value, Mapping):
        object.__setattr__(self, name, _section(cls, name, value))
      elif not isinstance(value, cls):
        raise v.ConfigTypeError(
            name, f"{name} must be a {cls.__name__} (or a mapping of its "
            f"keys){' or null' if name in _OPTIONAL else ''}, got "
            f"{value!r}")
    if not isinstance(self.algorithms, Mapping):
      raise v.ConfigTypeError(
          "algorithms", "algorithms must be a mapping name -> "
          f"AlgorithmSpec (or its keys), got {type(self.algorithms).__name__}")
    algorithms = {}
    for name, spec in self.algorithms.items():
      check_algorithm_name(name)
      if isinstance(spec, Mapping):
        spec = _section(AlgorithmSpec, f"algorithms.{name}", spec)
      elif not isinstance(spec, AlgorithmSpec):
        raise v.ConfigTypeError(
            f"algorithms.{name}", f"algorithms.{name} must be an "
            f"AlgorithmSpec (or a mapping of its keys), got {spec!r}")
      algorithms[name] = spec
    object.__setattr__(self, "algorithms", algorithms)
    if isinstance(self.seeds, (list, tuple)):
      object.__setattr__(self, "seeds", list(self.seeds))
    _check(self)

  @classmethod
  def from_dict(cls, config: Mapping) -> "Experiment":
    """A JSON config -> the checked ``Experiment`` (the one reader of a
    config's dict). Script keys (``SCRIPT_KEYS``) are the scripts' own and
    are dropped.

    Raises:
      ConfigError: naming the key path of the first bad entry.
    """
    if isinstance(config, Experiment):
      return config
    if not isinstance(config, Mapping):
      raise v.ConfigTypeError(
          "config", f"config must be a mapping (a JSON object), got "
          f"{type(config).__name__}")
    v.depth(config)
    v.keys_in("", dict(config), keys(cls) + SCRIPT_KEYS,
              required=("dataset", "partition", "model", "algorithms"))
    for name in SECTIONS:
      if config.get(name) is not None or name not in _OPTIONAL:
        v.mapping(name, config.get(name, {}))
    for name, spec in config["algorithms"].items():
      check_algorithm_name(name)
      v.mapping(f"algorithms.{name}", spec)
    fields = keys(cls)
    return cls(**{key: value for key, value in config.items()
                  if key in fields})

  def to_dict(self, written_out: bool = True) -> dict:
    """The JSON config of this experiment; ``written_out``: with every
    default written out (the rules' full arguments too, as
    ``written_out``), else only what differs from the defaults."""
    config = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if dataclasses.is_dataclass(value):
        value = _section_dict(value)
      elif f.name == "algorithms":
        value = {name: _section_dict(spec) for name, spec in value.items()}
      if (value is None and f.name in ("name", "target_accuracy", "attack",
                                       "privacy", "systems",
                                       "early_stopping", "provenance")) or (
                                           f.name == "vmap_seeds"
                                           and value is False
                                           and not written_out):
        continue  # Left out unless set, as a config file does.
      config[f.name] = value
    return _written_out(self, config) if written_out else config

  def adapters_of(self, algorithm: str) -> Optional[AdaptersSpec]:
    """``algorithm``'s LoRA adapters: "model.adapters" with the
    algorithm's ``adapters`` over them, or None (the whole model)."""
    override = self.algorithms[algorithm].adapters
    if override is None:
      return None
    if not override:
      return self.model.adapters
    path = f"algorithms.{algorithm}.adapters"
    merged = ({} if self.model.adapters is None
              else dataclasses.asdict(self.model.adapters))
    merged.update(override)
    if "rank" not in merged:
      raise v.ConfigError(f"{path}.rank", f"{path}.rank: the model has no "
                          "adapters (model.adapters), so the algorithm's "
                          "must give their rank")
    return AdaptersSpec(**merged, path=path)

  def train_of(self, algorithm: str) -> TrainSpec:
    """``algorithm``'s training: "train" with its overrides."""
    return dataclasses.replace(self.train,
                               **self.algorithms[algorithm].train)

  def cohort_size(self, algorithm: str) -> int:
    """m: the clients drawn per round."""
    return rounds.num_sampled(self.partition.num_clients,
                              self.train_of(algorithm).participation)

  def expected_clients(self, algorithm: str) -> Optional[float]:
    """The fixed denominator q N = m of a private rule under Poisson
    sampling (McMahan et al. 2018), else None."""
    if self.privacy is not None and self.privacy.sampling == "poisson":
      return float(self.cohort_size(algorithm))
    return None

  def run_context(self, algorithm: str,
                  objective: Optional[types.LocalObjective] = None
                  ) -> types.RunContext:
    """What a run of ``algorithm`` fixes that a rule is built from
    (``fedjax_agg.run_context``), as this description says it: the
    federation's and the cohort's sizes, Poisson's q N, the client
    learning rate, the local SGD momentum (None for another optimizer)
    and FedProx's mu (of ``objective``, the algorithm's built local
    objective; default: built here). The client side's shared settings
    are left empty (a client side and its rule are checked by
    ``PAIRED_RULES``), as are the data's sizes."""
    train = self.train_of(algorithm)
    if objective is None:
      spec = self.algorithms[algorithm]
      objective = v.built(f"algorithms.{algorithm}.objective_args",
                          objectives.get, spec.objective,
                          **spec.objective_args)
    optimizer = train.run_objects()["training"]["optimizer"]
    return types.RunContext(
        num_clients=self.partition.num_clients,
        cohort_size=self.cohort_size(algorithm),
        expected_clients=self.expected_clients(algorithm),
        learning_rate=train.learning_rate,
        momentum=config_lib.sgd_momentum(optimizer),
        proximal_mu=getattr(objective, "proximal_mu", None),
        client_side={}, batch_size=train.batch_size)

  def run_arguments(self, algorithm: str) -> dict[str, Any]:
    """Aggregator arguments the run fills in unless the algorithm gives
    them: the client learning rate, the cohort size, Poisson's q N, and
    whatever else the rule's factory takes from the run
    (``run_context.derived_from_run``: FedNova's momentum and proximal
    mu from the training and the local objective), with the values this
    run uses."""
    filled = {"learning_rate": self.train_of(algorithm).learning_rate,
              "num_participants": self.cohort_size(algorithm)}
    expected = self.expected_clients(algorithm)
    if expected is not None:
      filled["expected_clients"] = expected
    factory = aggregators.REGISTRY.factory(
        self.algorithms[algorithm].aggregator)
    derived = getattr(factory, "run_arguments", {})
    if any(field in _DERIVED for field in derived.values()):
      context = self.run_context(algorithm)
      for name, field in derived.items():
        if field in _DERIVED and getattr(context, field) is not None:
          filled[name] = getattr(context, field)
    return filled

  def rule_arguments(self, algorithm: str) -> tuple[dict, dict]:
    """``algorithm``'s full aggregator and objective arguments: the
    factories' defaults, the arguments the run fills in
    (``run_arguments``, to rules that take them), then the algorithm's
    own; context arguments (``num_clients``, FedACS's model and data)
    are left out. -> ``(aggregator_args, objective_args)``."""
    spec = self.algorithms[algorithm]
    parameters = v.rule_parameters(aggregators.REGISTRY, spec.aggregator)
    aggregator_args = v.defaults_of(parameters)
    for name, value in self.run_arguments(algorithm).items():
      if name in parameters:
        aggregator_args[name] = value
    aggregator_args.update(spec.aggregator_args)
    objective_args = {
        **v.defaults_of(v.rule_parameters(objectives.REGISTRY,
                                          spec.objective)),
        **spec.objective_args}
    return aggregator_args, objective_args

  def check_loaded(self, dataset) -> None:
    """The checks that need the data read (``experiment.load_dataset``
    makes them, before anything is written): a natural federation's task
    where only its files tell it (a LEAF split without its
    ``dataset.args.dataset``, a TFF or FedJAX file), against the attack.

    Raises:
      ConfigError: naming the key path ("attack").
    """
    _check_attack(self, getattr(dataset, "task", None))

  def privacy_of(self, algorithm: str) -> Optional[config_lib.Privacy]:
    """The accounting of ``algorithm``'s runs (None for a non-private
    rule): the "privacy" section with the rule's noise multiplier."""
    if self.algorithms[algorithm].aggregator not in PRIVATE_AGGREGATORS:
      return None
    block = {} if self.privacy is None else dataclasses.asdict(self.privacy)
    return config_lib.Privacy(
        self.rule_arguments(algorithm)[0]["noise_multiplier"], **block)


# Sections a description may leave out (None).
_OPTIONAL = ("attack", "privacy", "systems", "early_stopping")
# The run settings a rule may derive an argument from that
# ``run_arguments`` does not fill in by the argument's name.
_DERIVED = ("momentum", "proximal_mu")
SECTIONS = {"dataset": DataSpec, "partition": PartitionSpec,
            "model": ModelSpec, "train": TrainSpec,
            "algorithms": AlgorithmSpec, "attack": AttackSpec,
            "privacy": PrivacySpec, "systems": SystemsSpec,
            "early_stopping": EarlyStoppingSpec}
"""A config's sections by key: key -> the spec class of that block."""


def _section(cls, path: str, mapping: Mapping):
  """``cls(**mapping)``, an unknown or missing key named as a config
  error (the values are checked by the section)."""
  allowed = keys(cls)
  extra = SCRIPT_ALGORITHM_KEYS if cls is AlgorithmSpec else ()
  v.mapping(path, mapping)
  for key in mapping:
    if key not in allowed and key not in extra:
      raise v.ConfigError(
          f"{path}.{key}", f"{path}.{key}: unknown key"
          f"{v.did_you_mean(key, allowed)}; allowed: "
          f"{sorted(allowed)}")
  required = [f.name for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING
              and f.default_factory is dataclasses.MISSING]
  for key in required:
    if key not in mapping:
      raise v.ConfigError(f"{path}.{key}", f"{path} must have a "
                          f"{key!r} entry")
  arguments = {k: value for k, value in mapping.items() if k in allowed}
  if cls is AlgorithmSpec:
    arguments["path"] = path
  return cls(**arguments)


def _section_dict(spec) -> dict:
  """A section's keys that differ from their defaults (and the required
  ones)."""
  out = {}
  for f in dataclasses.fields(spec):
    value = getattr(spec, f.name)
    default = (f.default_factory() if f.default_factory
               is not dataclasses.MISSING else f.default)
    if default is dataclasses.MISSING or value != default:
      if dataclasses.is_dataclass(value):
        value = _section_dict(value)
      out[f.name] = dict(value) if isinstance(value, Mapping) else value
  return out


def _check(experiment: Experiment) -> None:
  """The checks that need more than one section."""
  if not isinstance(experiment.name, (str, type(None))):
    raise v.ConfigTypeError("name", f"name must be a string, got "
                            f"{experiment.name!r}")
  _check_seeds(experiment.seeds)
  if experiment.target_accuracy is not None:
    v.number("target_accuracy", experiment.target_accuracy, 0, 1)
  v.boolean("vmap_seeds", experiment.vmap_seeds)
  dataset, partition = experiment.dataset, experiment.partition
  natural = partition.name == partitions.NATURAL
  if natural != (dataset.name in data_lib.FEDERATIONS):
    raise v.ConfigError("partition.name", (
        f"partition.name {partitions.NATURAL!r} takes a natural federation "
        f"{data_lib.FEDERATIONS} as dataset, not {dataset.name!r}"
    ) if natural else (
        f"dataset {dataset.name!r} is a natural federation: partition.name "
        f"must be {partitions.NATURAL!r} (its own clients), not "
        f"{partition.name!r}"))
  _check_attack(experiment)
  if not experiment.algorithms:
    raise v.ConfigError("algorithms", "algorithms must name at least one "
                        "algorithm")
  if experiment.privacy is not None and not any(
      spec.aggregator in PRIVATE_AGGREGATORS
      for spec in experiment.algorithms.values()):
    given = _section_dict(experiment.privacy)
    path = f"privacy.{next(iter(given))}" if given else "privacy"
    raise v.ConfigError(path, f"{path}: every algorithm's aggregator adds "
                        "no calibrated Gaussian noise, so the runs have no "
                        "privacy guarantee to account; use a private rule "
                        f"{PRIVATE_AGGREGATORS}, or drop privacy")
  for name in experiment.algorithms:
    _check_algorithm(experiment, name)
  for name in experiment.algorithms:
    _check_rules(experiment, name)
  _check_privacy_target(experiment)


def _check_seeds(seeds) -> None:
  if not isinstance(seeds, list) or not seeds:
    raise v.ConfigTypeError("seeds", f"seeds must be a non-empty list of "
                            f"ints >= 0, got {seeds!r}")
  for i, seed in enumerate(seeds):
    v.integer(f"seeds[{i}]", seed, 0, loop.MAX_SEED)
  if len(set(seeds)) != len(seeds):
    raise v.ConfigError("seeds", f"seeds must be distinct, got {seeds}")


def _check_attack(experiment: Experiment,
                  task: Optional[str] = None) -> None:
  """An attack on a task it is defined for (``task``: the data's, where
  it was read; else the federation's where known before its files are
  read), on plain local training."""
  attack = experiment.attack
  if attack is None:
    return
  dataset = experiment.dataset
  if task is None:
    task = data_lib.federation_task(dataset.name, dataset.args)
  tasks = attacks.TASKS.get(attack.name)
  if task is not None and tasks is not None and task not in tasks:
    raise v.ConfigError(
        "attack", f"attack: {attack.name} is defined for "
        f"{' and '.join(tasks)} tasks; dataset {dataset.name!r} is a "
        f"{task} task (per-token targets, no class to relabel with)")
  for name, spec in experiment.algorithms.items():
    if spec.client is not None:
      raise v.ConfigError(
          "attack", f"attack: {name} has a client side ({spec.client!r}); "
          "attacks replace the plain local training and are not combined "
          "with a client side")


def _train_key(experiment: Experiment, name: str, key: str) -> str:
  """Where ``key`` of ``name``'s training is set: its override, else the
  "train" section."""
  if key in experiment.algorithms[name].train:
    return f"algorithms.{name}.train.{key}"
  return f"train.{key}"


def _check_algorithm(experiment: Experiment, name: str) -> None:
  """An algorithm with the setting: its model arguments, its optimizer,
  its client side's rule and what personal evaluation needs."""
  spec, path = experiment.algorithms[name], f"algorithms.{name}"
  v.model_arguments(f"{path}.model_args", experiment.model.name,
                    {**experiment.model.args, **spec.model_args})
  _check_adapters(experiment, name)
  train = experiment.train_of(name)
  if train.optimizer == "adam" and train.momentum:
    key = _train_key(experiment, name, "momentum")
    raise v.ConfigError(key, f"{key}: momentum is for optimizer 'sgd' (Adam "
                        f"has its own betas), got momentum={train.momentum!r}"
                        " with optimizer 'adam'")
  if spec.client in PAIRED_RULES:
    rule, shared = PAIRED_RULES[spec.client]
    if spec.aggregator != rule:
      raise v.ConfigError(
          f"{path}.aggregator", f"{path}.aggregator: the {spec.client} "
          f"client needs the {rule!r} rule (its server side), got "
          f"{spec.aggregator!r}; pair the client side with its own rule "
          f"(e.g. clients.{spec.client} with aggregators.{rule})")
    ours = spec.client_args.get(shared, clients.REGISTRY.parameters(
        spec.client)[shared].default)
    theirs = experiment.rule_arguments(name)[0][shared]
    if ours != theirs:
      raise v.ConfigError(
          f"{path}.client_args.{shared}", f"{path}.client_args.{shared}: "
          f"the {spec.client} client and rule must share {shared}, got "
          f"{ours!r} (client) and {theirs!r} (aggregator_args)")
  if train.personalized and spec.client not in PERSONAL_CLIENTS:
    key = _train_key(experiment, name, "personalized")
    raise v.ConfigError(key, f"{key}: personal models need a client side "
                        f"that keeps them ({list(PERSONAL_CLIENTS)}), got "
                        f"{path}.client={spec.client!r}")
  if ((train.personalized or train.finetune_steps)
      and not experiment.partition.holdout_fraction):
    raise v.ConfigError(
        "partition.holdout_fraction", "partition.holdout_fraction: "
        f"{name}'s personalized / finetune_steps evaluate on each client's "
        "held-out split; set a fraction in (0, 1)")


def _check_adapters(experiment: Experiment, name: str) -> None:
  """LoRA adapters go with the rules defined for them, and only there."""
  spec, path = experiment.algorithms[name], f"algorithms.{name}"
  adapters = experiment.adapters_of(name)
  where = ("model.adapters" if adapters is None or not spec.adapters
           else f"{path}.adapters")
  if adapters is None:
    if spec.aggregator in ADAPTER_ONLY_RULES or spec.client == "lora_ranks":
      key = ("aggregator" if spec.aggregator in ADAPTER_ONLY_RULES
             else "client")
      raise v.ConfigError(
          f"{path}.{key}", f"{path}.{key}: {getattr(spec, key)!r} works on "
          "LoRA adapters; set model.adapters or the algorithm's adapters "
          "(e.g. {\"rank\": 8}, --lora-rank 8)")
    return
  if spec.aggregator not in ADAPTER_RULES:
    raise v.ConfigError(
        f"{path}.aggregator", f"{path}.aggregator: {spec.aggregator!r} "
        "aggregates whole models (their coordinates, norms or angles), not "
        f"LoRA adapters ({where}); use a rule defined for adapters "
        f"{list(ADAPTER_RULES)}, or \"adapters\": null in the algorithm "
        "to train the whole model")
  if spec.client not in (None, "lora_ranks"):
    raise v.ConfigError(
        f"{path}.client", f"{path}.client: the {spec.client} client side "
        f"trains whole models, not LoRA adapters ({where}); only "
        "'lora_ranks' is defined for adapters")
  adapters.check_targets(
      f"{path}.adapters" if "targets" in (spec.adapters or {})
      else "model.adapters", experiment.model.name,
      {**experiment.model.args, **spec.model_args})
  if spec.client == "lora_ranks":
    adapters.check_client_ranks(f"{path}.client_args", spec.client_args,
                                experiment.partition.num_clients,
                                spec.objective)


def _check_rules(experiment: Experiment, name: str) -> None:
  """Builds the algorithm's objective and aggregator with their full
  arguments, binds the aggregator to what the run fixes
  (``Experiment.run_context``) and, under secure aggregation, traces its
  client statistics as the secure sum does: the factories' and the
  binding's own checks then name a bad one before anything is read or
  written, whichever entry point runs it."""
  spec = experiment.algorithms[name]
  aggregator_args, objective_args = experiment.rule_arguments(name)
  built = {}
  for registry, rule, arguments, key in (
      (objectives.REGISTRY, spec.objective, objective_args,
       "objective_args"),
      (aggregators.REGISTRY, spec.aggregator, aggregator_args,
       "aggregator_args")):
    needs = [arg for arg, p in registry.parameters(rule).items()
             if p.default is inspect.Parameter.empty
             and arg not in arguments and arg != "num_clients"]
    if needs:  # E.g. FedACS's model and evaluation data: built by a script.
      continue
    context = ({"num_clients": experiment.partition.num_clients}
               if "num_clients" in registry.context else {})
    built[key] = v.built(f"algorithms.{name}.{key}", registry.build, rule,
                         **arguments, **context)
  rule = built.get("aggregator_args")
  if not isinstance(rule, types.Aggregator):
    return
  if rule.from_run is not None and "objective_args" in built:
    rule = _bound(experiment, name, rule, built["objective_args"])
  _check_secure_sum(experiment, name, rule)


def _bound(experiment: Experiment, name: str, rule: types.Aggregator,
           objective) -> types.Aggregator:
  """``rule`` bound to the run's settings (``Aggregator.from_run``); a
  contradiction names the algorithm's argument that the run's value
  differs from, else its aggregator."""
  spec, path = experiment.algorithms[name], f"algorithms.{name}"
  try:
    return rule.from_run(experiment.run_context(name, objective))
  except (TypeError, ValueError) as error:
    key = next((f"{path}.aggregator_args.{arg}"
                for arg, value in spec.aggregator_args.items()
                if f"{arg}={value!r}" in str(error)), f"{path}.aggregator")
    raise (v.ConfigTypeError if isinstance(error, TypeError)
           else v.ConfigError)(key, f"{key}: {error}") from None


# A model of two leaves that the secure sum's statistics are traced on
# (their shapes only: ``jax.eval_shape``).
_PROBE_PARAMS = {"params": {"kernel": jax.ShapeDtypeStruct((2, 2),
                                                            jnp.float32),
                            "bias": jax.ShapeDtypeStruct((2,),
                                                         jnp.float32)}}


def _check_secure_sum(experiment: Experiment, name: str,
                      rule: types.Aggregator) -> None:
  """Under secure aggregation ("systems.secagg_bits"), ``rule`` wrapped
  as the run wraps it (``secagg.secure_aggregation`` sized for the
  round's rows): a rule that is no sum over clients is refused, and so is
  one whose client statistics trace on a small model with a client's
  round information but not inside the secure sum (its range probe
  fails): refused here rather than in the first round. A rule whose
  statistics need another model (LoRA adapters) is left to the run."""
  systems = experiment.systems
  if systems is None or systems.secagg_bits is None:
    return
  cohort = experiment.cohort_size(name)
  rows = (cohort if systems.concurrency is not None else
          systems_lib.num_selected(cohort, systems.over_selection,
                                   experiment.partition.num_clients))
  scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype)
  info = types.ClientInfo(
      client_ids=scalar(jnp.int32), num_examples=scalar(jnp.float32),
      mask=scalar(jnp.float32), loss_before=scalar(jnp.float32),
      loss_after=scalar(jnp.float32), round=scalar(jnp.int32),
      key=jax.ShapeDtypeStruct((2,), jnp.uint32),
      num_steps=scalar(jnp.int32))
  try:
    secure = secagg.secure_aggregation(
        rule, bits=systems.secagg_bits, clip=systems.secagg_clip,
        cohort_size=rows, max_examples=1.0)
    try:
      jax.eval_shape(rule.stream.client_stats, _PROBE_PARAMS, _PROBE_PARAMS,
                     info)
    except (TypeError, ValueError):
      return  # not a model this rule aggregates: the run checks it
    jax.eval_shape(secure.stream.client_stats, _PROBE_PARAMS,
                   _PROBE_PARAMS, info)
  except (TypeError, ValueError) as error:
    raise v.ConfigError(
        "systems.secagg_bits", f"systems.secagg_bits: algorithms.{name} "
        f"({experiment.algorithms[name].aggregator}): {error}") from None


def _check_privacy_target(experiment: Experiment) -> None:
  """A target epsilon that even one round of a private algorithm passes is
  refused here, before the data is read (the run would end at round 0)."""
  if experiment.privacy is None or experiment.privacy.target_epsilon is None:
    return
  target = experiment.privacy.target_epsilon
  num_clients = experiment.partition.num_clients
  for name, spec in experiment.algorithms.items():
    privacy = experiment.privacy_of(name)
    if privacy is None:
      continue
    cohort = experiment.cohort_size(name)
    if spec.aggregator == "dp_ftrl":
      # Tree aggregation: round 1 is one node, each client in it once,
      # whatever cohort is drawn (no amplification by sampling).
      first = privacy_lib.tree_epsilons(
          privacy.noise_multiplier, np.arange(cohort)[None],
          delta=privacy.delta,
          restart_every=experiment.rule_arguments(name)[0].get(
              "restart_every"))[0]
    else:
      first = privacy_lib.epsilon(
          privacy.noise_multiplier, 1, num_clients=num_clients,
          cohort_size=cohort, delta=privacy.delta,
          sampling=privacy.sampling, accountant=privacy.accountant)
    if first > target:
      raise v.ConfigError(
          "privacy.target_epsilon",
          f"privacy.target_epsilon: {target} cannot be met by "
          f"{name}: a single round already costs epsilon={first:.4g} "
          f"(noise_multiplier={privacy.noise_multiplier}); raise the "
          "target or the noise")


def _written_out(experiment: Experiment, config: dict) -> dict:
  """``config`` (``to_dict``'s) with every default written out.

  The dataset's options, the partition's and model's arguments, "train"
  and the optional sections take their defaults where the description is
  silent; each algorithm's aggregator and objective arguments take their
  factories' defaults (all but those the run fills in, see
  ``Experiment.run_arguments``, so that the result run again behaves the
  same under a changed learning rate). The result is a valid config.
  """
  resolved = dict(config)
  resolved["dataset"] = dataclasses.asdict(experiment.dataset)
  if experiment.dataset.name in data_lib.FEDERATIONS:
    resolved["dataset"]["args"] = {
        **v.defaults_of(data_lib.federation_parameters(
            experiment.dataset.name)), **experiment.dataset.args}
  partition = dataclasses.asdict(experiment.partition)
  partition["args"] = {**v.defaults_of(v.partition_parameters(
      partition["name"])), **partition["args"]}
  resolved["partition"] = partition
  model = dataclasses.asdict(experiment.model)
  model["args"] = {**v.defaults_of(v.model_parameters(model["name"])),
                   **model["args"]}
  resolved["model"] = model
  resolved["train"] = dataclasses.asdict(experiment.train)
  resolved["seeds"] = list(experiment.seeds)
  algorithms = {}
  for name, spec in experiment.algorithms.items():
    entry = dict(config["algorithms"][name])
    aggregator_args, objective_args = experiment.rule_arguments(name)
    filled = experiment.run_arguments(name)
    entry["aggregator_args"] = {
        arg: value for arg, value in aggregator_args.items()
        if arg not in filled or arg in spec.aggregator_args}
    entry["objective"] = spec.objective
    entry["objective_args"] = objective_args
    algorithms[name] = entry
  resolved["algorithms"] = algorithms
  for name in ("privacy", "systems", "early_stopping"):
    if getattr(experiment, name) is not None:
      resolved[name] = dataclasses.asdict(getattr(experiment, name))
  if experiment.attack is not None:
    attack = dataclasses.asdict(experiment.attack)
    attack["args"] = {**v.defaults_of(v.keyword_parameters(
        attacks.REGISTRY.factory(attack["name"]))), **attack["args"]}
    resolved["attack"] = attack
  return resolved


def flags() -> list[tuple[str, Flag]]:
  """Every command-line flag of the spec with the config key it sets, in
  the order flags apply (a section's name before its arguments; --seed
  before --seeds): ``[("train.learning_rate", Flag("--lr", ...)), ...]``;
  an algorithm's keys read ``algorithms.{algorithm}.<key>``. Callable
  choices are resolved to their names here."""
  out = []
  for prefix, cls in (("dataset", DataSpec), ("partition", PartitionSpec),
                      ("model", ModelSpec),
                      ("algorithms.{algorithm}", AlgorithmSpec),
                      ("train", TrainSpec), ("", Experiment),
                      ("attack", AttackSpec), ("privacy", PrivacySpec),
                      ("systems", SystemsSpec),
                      ("early_stopping", EarlyStoppingSpec)):
    for f in dataclasses.fields(cls):
      for flag in f.metadata.get("flags", ()):
        key = f"{prefix}.{f.name}" if prefix else f.name
        if flag.kind == "subkey":
          key = f"{key}.{flag.subkey}"
        if callable(flag.choices):
          flag = flag._replace(choices=flag.choices())
        out.append((key, flag))
  return out
