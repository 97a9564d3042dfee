"""``Experiment``: a whole run's description, the checks that need two of
its sections (those of its rules in ``_rule_checks``), what a run derives
from it (each algorithm's training and the rules' full arguments) and its
JSON form.
"""

import dataclasses
from typing import Any, Mapping, Optional

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import config as config_lib
from fedjax_agg import data as data_lib
from fedjax_agg import loop
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import rounds
from fedjax_agg import types
from fedjax_agg.spec import _values as v
from fedjax_agg.spec._adapters import AdaptersSpec
from fedjax_agg.declared import spec_field as _field
from fedjax_agg.spec._rule_checks import _check_algorithm
from fedjax_agg.spec._rule_checks import _check_attack
from fedjax_agg.spec._rule_checks import _check_privacy_target
from fedjax_agg.spec._rule_checks import _check_rules
from fedjax_agg.spec._sections import AlgorithmSpec
from fedjax_agg.spec._sections import AttackSpec
from fedjax_agg.spec._values import check_algorithm_name
from fedjax_agg.spec._sections import DataSpec
from fedjax_agg.spec._sections import EarlyStoppingSpec
from fedjax_agg.declared import Flag
from fedjax_agg.spec._sections import keys
from fedjax_agg.spec._sections import ModelSpec
from fedjax_agg.spec._sections import PartitionSpec
from fedjax_agg.spec._sections import PrivacySpec
from fedjax_agg.spec._sections import SCRIPT_ALGORITHM_KEYS
from fedjax_agg.spec._sections import SCRIPT_KEYS
from fedjax_agg.spec._sections import SystemsSpec
from fedjax_agg.spec._train import TrainSpec

PRIVATE_AGGREGATORS = aggregators.REGISTRY.having(private=True)
"""Rules whose runs account their privacy (the "privacy" section)."""


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
        # The dataclass is frozen; normalizing a section in place is only
        # possible through object.__setattr__, and only here, before anyone
        # holds it.
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
    # First: a hostile nesting depth is refused by name before any walk below
    # could recurse into it.
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
    """``algorithm``'s training: "train" with its overrides (a refusal of
    an overridden key named at the override)."""
    overrides = self.algorithms[algorithm].train
    try:
      return dataclasses.replace(self.train, **overrides)
    except v.ConfigError as error:
      # The bad value was written in the override, so the error names that path;
      # a refusal of a key not overridden is the "train" section's own.
      key = error.path.removeprefix("train.")
      if key not in overrides:
        raise
      path = f"algorithms.{algorithm}.train.{key}"
      raise type(error)(path, str(error).replace(error.path, path, 1)
                        ) from None

  def setting(self) -> str:
    """One line naming the setting (plot titles, reports): dataset,
    partition, model and the training constants."""
    train, partition = self.train, self.partition
    arguments = "".join(f", {key}={value}" for key, value in
                        partition.args.items())
    return (f"{self.dataset.name}, {partition.name}(N="
            f"{partition.num_clients}{arguments}), {self.model.name}; "
            f"C={train.participation} E={train.local_epochs} "
            f"B={train.batch_size} lr={train.learning_rate}")

  def cohort_size(self, algorithm: str) -> int:
    """m: the clients drawn per round (computed once per algorithm: every
    check and build reads it from here)."""
    # A cache in ``__dict__``: the frozen dataclass refuses ``setattr``, and the
    # cache is not a field (not compared, not written out).
    cohorts = self.__dict__.setdefault("_cohorts", {})
    if algorithm not in cohorts:
      cohorts[algorithm] = rounds.num_sampled(
          self.partition.num_clients, self.train_of(algorithm).participation)
    return cohorts[algorithm]

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
    optimizer = train.make(config_lib.ClientOptimizer).factory()
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
    # ``run_context`` builds the local objective and optimizer: only done for a
    # rule that derives an argument from them.
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
    # Precedence: factory defaults, then what the run fills in, then the
    # algorithm's own arguments, which always win.
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
    if not aggregators.REGISTRY.capabilities(
        self.algorithms[algorithm].aggregator).private:
      return None
    block = {} if self.privacy is None else dataclasses.asdict(self.privacy)
    noise = self.rule_arguments(algorithm)[0]["noise_multiplier"]
    stated = block.pop("noise_multiplier", None)
    # The rule's argument is the one source of the noise: an accounting for
    # another multiplier would report an epsilon the run does not have.
    if stated is not None and stated != noise:
      raise v.ConfigError(
          "privacy.noise_multiplier", f"privacy.noise_multiplier: "
          f"{stated!r} is not the noise multiplier algorithms.{algorithm}'s "
          f"rule adds ({noise!r}); the noise is the rule's argument "
          "(aggregator_args.noise_multiplier, --dp-noise-multiplier): set "
          "it there, or leave privacy.noise_multiplier out")
    return config_lib.Privacy(noise, **block)


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
  # Script keys are accepted (a script's config carries them) but never reach
  # the spec object.
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


def check_vmapped_systems(experiment: Experiment, vmap_seeds: bool) -> None:
  """Seeds vmapped as one sweep step with one shared cohort mask, which a
  simulated clock or codec per member cannot use: refused by name."""
  if vmap_seeds and experiment.systems is not None and len(
      experiment.seeds) > 1:
    raise v.ConfigError(
        "vmap_seeds", "vmap_seeds: the seeds of one vmapped sweep step with "
        "one shared cohort mask, which the \"systems\" clock or codec of "
        "each seed cannot use; set vmap_seeds to false (the seeds run one "
        "after the other) or drop \"systems\"")


def _check(experiment: Experiment) -> None:
  """The checks that need more than one section."""
  if not isinstance(experiment.name, (str, type(None))):
    raise v.ConfigTypeError("name", f"name must be a string, got "
                            f"{experiment.name!r}")
  _check_seeds(experiment.seeds)
  if experiment.target_accuracy is not None:
    v.number("target_accuracy", experiment.target_accuracy, 0, 1)
  v.boolean("vmap_seeds", experiment.vmap_seeds)
  check_vmapped_systems(experiment, experiment.vmap_seeds)
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
      aggregators.REGISTRY.capabilities(spec.aggregator).private
      for spec in experiment.algorithms.values()):
    given = _section_dict(experiment.privacy)
    path = f"privacy.{next(iter(given))}" if given else "privacy"
    raise v.ConfigError(path, f"{path}: every algorithm's aggregator adds "
                        "no calibrated Gaussian noise, so the runs have no "
                        "privacy guarantee to account; use a private rule "
                        f"{aggregators.REGISTRY.having(private=True)}, or "
                        "drop privacy")
  for name in experiment.algorithms:
    _check_algorithm(experiment, name)
  for name in experiment.algorithms:
    _check_rules(experiment, name)
    experiment.privacy_of(name)  # a stated noise multiplier: the rule's
  _check_privacy_target(experiment)


def _check_seeds(seeds) -> None:
  if not isinstance(seeds, list) or not seeds:
    raise v.ConfigTypeError("seeds", f"seeds must be a non-empty list of "
                            f"ints >= 0, got {seeds!r}")
  for i, seed in enumerate(seeds):
    v.integer(f"seeds[{i}]", seed, 0, loop.MAX_SEED)
  # A repeated seed is a repeated member: the same run twice, writing one
  # ``seed<n>`` folder.
  if len(set(seeds)) != len(seeds):
    raise v.ConfigError("seeds", f"seeds must be distinct, got {seeds}")


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
