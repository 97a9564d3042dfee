"""The typed description of an experiment: the schema of a JSON config.

One frozen dataclass per section of a config (``DataSpec`` for "dataset",
``PartitionSpec``, ``ModelSpec``, ``TrainSpec`` for "train",
``AlgorithmSpec`` for each entry of "algorithms", ``AttackSpec``,
``PrivacySpec``, ``SystemsSpec``, ``EarlyStoppingSpec``) and
``Experiment`` for the whole. Each field is one concept with ONE name and
ONE default, and this module is the only place that states them:

* a JSON config is an ``Experiment`` serialised (``Experiment.from_dict``
  checks and builds one, ``to_dict`` writes it back with every default
  written out); ``fedjax_agg.experiment`` reads its keys and defaults from
  here (``keys``, ``defaults``);
* the command line's config flags are derived from the fields' ``Flag``
  metadata (``flags``): the flag, its help, its choices and the config key
  it sets come from the field, so a flag and a JSON key cannot disagree;
* Python users build the same objects.

The command line starts from a preset where a config must name something
(dataset, partition, model, rule) and, for a quick first run, with 10 % of
the clients per round at learning rate 0.05 (``Flag.preset``); a config
file states what it runs.
"""

import dataclasses
from typing import Any, Mapping, NamedTuple, Optional, Union

__all__ = ["ADVERSARY_MODES", "AlgorithmSpec", "AttackSpec", "DataSpec",
           "EarlyStoppingSpec", "Experiment", "Flag", "ModelSpec",
           "PartitionSpec", "PrivacySpec", "SCRIPT_ALGORITHM_KEYS",
           "SCRIPT_KEYS", "SECTIONS", "SystemsSpec", "TrainSpec", "defaults",
           "flags", "keys"]

ADVERSARY_MODES = ("per_round", "fixed")
"""Who is malicious in an attacked run (``fedjax_agg.attacks``): a new draw from
each round's cohort ("per_round") or a set fixed once ("fixed")."""
SCRIPT_KEYS = ("report_rounds", "early_rounds", "reference")
"""Top-level keys that scripts of experiments/ read and the runner passes over:
the FedLap script's "report_rounds" and "early_rounds", the FedDRL script's
"reference"."""
SCRIPT_ALGORITHM_KEYS = ("two_stage",)
"""Per-algorithm keys that scripts of experiments/ read and the runner passes
over: the FedDRL script's "two_stage"."""


class Flag(NamedTuple):
  """How the command line sets a field.

  Attributes:
    name: the flag, e.g. "--lr".
    help: its help text.
    kind: "value" (the flag's value is the field's), "pairs" (repeatable
      NAME=VALUE, merged into the field's mapping), "switch" (given: True),
      "negate" (given: False, else "auto"), "seed" (one int: the list
      [seed]), "seeds" (comma-separated ints), "subkey" (sets the entry
      ``subkey`` of the field's mapping).
    type: the argparse type of the value (None: a string).
    choices: the names the value must be one of (None: any).
    preset: the command line's value when the flag is not given (None:
      the key is left out, so the spec's default holds).
    subkey: for kind "subkey".
  """
  name: str
  help: str
  kind: str = "value"
  type: Any = None
  choices: Any = None
  preset: Any = None
  subkey: Optional[str] = None


def _field(default: Any = dataclasses.MISSING, *flag_list: Flag):
  """A spec field with its default and its command-line flags."""
  metadata = {"flags": tuple(flag_list)}
  if isinstance(default, (dict, list)):
    value = default
    return dataclasses.field(default_factory=lambda: type(value)(value),
                             metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def _names(module: str, attribute: str):
  """A registry's names, imported when the flags are built."""
  def get():
    import importlib  # pylint: disable=g-import-not-at-top
    return tuple(getattr(importlib.import_module(module), attribute))
  return get


_DATASETS = _names("fedjax_agg.data", "ALL_NAMES")
_SOURCES = _names("fedjax_agg.data", "SOURCES")
_PARTITIONS = _names("fedjax_agg.partitions", "ALL_NAMES")
_MODELS = _names("fedjax_agg.models", "NAMES")
_OPTIMIZERS = _names("fedjax_agg.config", "OPTIMIZERS")
_STRAGGLER_UNITS = _names("fedjax_agg.stragglers", "UNITS")
_MATMUL_PRECISIONS = _names("fedjax_agg.config", "MATMUL_PRECISIONS")
_SAMPLINGS = _names("fedjax_agg.privacy", "SAMPLINGS")
_ACCOUNTANTS = _names("fedjax_agg.privacy", "ACCOUNTANTS")
_STOPPING_MODES = _names("fedjax_agg.loop", "STOPPING_MODES")


def _registry(module: str):
  def get():
    import importlib  # pylint: disable=g-import-not-at-top
    # Registry.names: also holds "module:factory" names (user components).
    return importlib.import_module(module).REGISTRY.names
  return get


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """"dataset": which data and how it is read (``fedjax_agg.data``)."""
  name: str = _field(dataclasses.MISSING, Flag(
      "--dataset", "dataset", choices=_DATASETS, preset="fashion_mnist"))
  source: str = _field("auto", Flag(
      "--source", "where the data comes from", choices=_SOURCES,
      preset="auto"))
  data_dir: Optional[str] = _field(None, Flag(
      "--data-dir", "folder holding the dataset files"))
  standardize: bool = _field(False, Flag(
      "--standardize", "per-channel standardisation of the images",
      kind="switch"))
  max_train_examples: Optional[int] = _field(None, Flag(
      "--max-train-examples", "keep only the first M training examples",
      type=int))
  max_test_examples: Optional[int] = _field(None)
  allow_subset: bool = _field(True)
  # A natural federation's own arguments (data.load_federation).
  args: dict = _field({}, Flag(
      "--dataset-arg", "argument of a natural federation (repeatable; e.g. "
      "min_samples=64)", kind="pairs"))


@dataclasses.dataclass(frozen=True)
class PartitionSpec:
  """"partition": how the training examples are split over N clients."""
  name: str = _field(dataclasses.MISSING, Flag(
      "--partition", "partition recipe", choices=_PARTITIONS, preset="iid"))
  num_clients: int = _field(dataclasses.MISSING, Flag(
      "--num-clients", "N: clients", type=int, preset=100))
  args: dict = _field({}, Flag(
      "--partition-arg", "argument of the partition recipe (repeatable; "
      "see --list partitions)", kind="pairs"))
  seed_offset: int = _field(0)
  # Each client's validation split, drawn with the partition's seed.
  holdout_fraction: float = _field(0.0, Flag(
      "--holdout-fraction", "held-out share of each client's examples",
      type=float))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """"model": the network (``fedjax_agg.models``)."""
  name: str = _field(dataclasses.MISSING, Flag(
      "--model", "network", choices=_MODELS, preset="cnn_mcmahan"))
  args: dict = _field({}, Flag(
      "--conv-impl", "conv lowering (default: the models' default)",
      kind="subkey", subkey="conv_impl"))


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """"train": what every round does (an algorithm may override any)."""
  rounds: int = _field(10, Flag("--rounds", "R: rounds", type=int,
                                preset=10))
  participation: float = _field(1.0, Flag(
      "--participation", "C: fraction of clients per round", type=float,
      preset=0.1))
  local_epochs: int = _field(1, Flag("--epochs", "E: local epochs",
                                     type=int, preset=1))
  batch_size: int = _field(16, Flag("--batch-size", "B: local batch size",
                                    type=int, preset=16))
  learning_rate: float = _field(0.01, Flag(
      "--lr", "client learning rate", type=float, preset=0.05))
  momentum: float = _field(0.0, Flag("--momentum", "client SGD momentum",
                                     type=float, preset=0.0))
  stragglers: float = _field(0.0, Flag(
      "--stragglers", "fraction of each cohort that straggles", type=float,
      preset=0.0))
  straggler_unit: str = _field("epochs", Flag(
      "--straggler-unit", "what a straggler's share of its work is drawn "
      "in: whole epochs x ~ U{1..E} (FedProx's setting) or steps",
      choices=_STRAGGLER_UNITS))
  eval_every: int = _field(1, Flag(
      "--eval-every", "evaluate the global model every this many rounds",
      type=int, preset=1))
  eval_clients: Union[bool, int, str] = _field("auto", Flag(
      "--no-client-eval", "skip the global model's loss on every client's "
      "data (by default computed before the first and after the last "
      "round: train.eval_clients \"auto\"; true or an int n in a --config "
      "file for every or every n-th evaluation)", kind="negate"))
  clients_per_step: Optional[int] = _field(None, Flag(
      "--clients-per-step", "clients trained side by side (vmap width)",
      type=int))
  compute_losses: Union[bool, str] = _field("auto")
  matmul_precision: str = _field("highest", Flag(
      "--matmul-precision", "precision of local training's matrix products: "
      "highest (full float32 on every backend) or default (the backend's: "
      "TF32 on an NVIDIA GPU, bfloat16 on a TPU)",
      choices=_MATMUL_PRECISIONS))
  devices: Optional[int] = _field(None, Flag(
      "--devices", "shard each round's clients over this many devices "
      "(default: all devices of the job; 1: unsharded)", type=int))
  optimizer: str = _field("sgd", Flag(
      "--optimizer", "client optimizer", choices=_OPTIMIZERS, preset="sgd"))
  weight_decay: float = _field(0.0, Flag(
      "--weight-decay", "client L2 weight decay (parameters only, not "
      "BatchNorm statistics)", type=float, preset=0.0))
  personalized: bool = _field(False, Flag(
      "--personalized", "at the client evaluations, also the accuracy of "
      "each client's personal model on its held-out split (needs --client "
      "fedbn or ditto and --holdout-fraction)", kind="switch"))
  finetune_steps: int = _field(0, Flag(
      "--finetune-steps", "at the client evaluations, also the accuracy of "
      "the global model fine-tuned for this many local steps on each "
      "client (needs --holdout-fraction)", type=int))


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One entry of "algorithms": a server rule, a local objective, the
  client side (``client``: SCAFFOLD, FedBN, Ditto; None: plain local
  training), the algorithm's own model arguments (``model_args``, merged
  over the model's, e.g. FedBN's batch_norm) and train overrides."""
  aggregator: str = _field(dataclasses.MISSING, Flag(
      "--aggregator", "server rule",
      choices=_registry("fedjax_agg.aggregators"), preset="fedavg"))
  aggregator_args: dict = _field({}, Flag(
      "--agg-arg", "argument of the aggregator (repeatable; see --list "
      "aggregators)", kind="pairs"), Flag(
          "--dp-noise-multiplier", "with dp_fedavg/dp_ftrl: the noise "
          "multiplier z", type=float, kind="subkey",
          subkey="noise_multiplier"), Flag(
              "--dp-clip-norm", "with dp_fedavg/dp_ftrl: the clip norm C",
              type=float, kind="subkey", subkey="clip_norm"))
  objective: str = _field("cross_entropy", Flag(
      "--objective", "local objective",
      choices=_registry("fedjax_agg.objectives"), preset="cross_entropy"))
  objective_args: dict = _field({}, Flag(
      "--objective-arg", "argument of the local objective (repeatable; see "
      "--list objectives)", kind="pairs"))
  client: Optional[str] = _field(None, Flag(
      "--client", "stateful client side (default: plain local training)",
      choices=_registry("fedjax_agg.clients")))
  client_args: dict = _field({}, Flag(
      "--client-arg", "argument of the client side (repeatable; see --list "
      "clients)", kind="pairs"))
  model_args: dict = _field({})
  train: dict = _field({})


@dataclasses.dataclass(frozen=True)
class AttackSpec:
  """"attack": simulated malicious clients in every algorithm's runs."""
  name: str = _field(dataclasses.MISSING, Flag(
      "--attack", "simulate malicious clients with this attack (see --list "
      "attacks)", choices=_registry("fedjax_agg.attacks")))
  args: dict = _field({}, Flag(
      "--attack-arg", "argument of the attack (repeatable), e.g. scale=10",
      kind="pairs"))
  fraction: float = _field(0.1, Flag(
      "--attack-fraction", "fraction of malicious clients (default 0.1 "
      "with --attack)", type=float))
  adversaries: str = _field("per_round", Flag(
      "--adversaries", "per_round: floor(fraction m) of each round's m "
      "participants; fixed: a set of clients drawn once (default "
      "per_round)", choices=lambda: ADVERSARY_MODES))
  seed: int = _field(0)


@dataclasses.dataclass(frozen=True)
class PrivacySpec:
  """"privacy": the accounting of the private rules' runs (the noise
  multiplier is the rule's own, ``config.Privacy``)."""
  delta: float = _field(1e-5, Flag(
      "--dp-delta", "with --aggregator dp_fedavg: delta of the epsilon "
      "recorded after every round (default 1e-5)", type=float))
  accountant: str = _field("rdp", Flag(
      "--dp-accountant", "with dp_fedavg: privacy accountant (default rdp)",
      choices=_ACCOUNTANTS))
  sampling: str = _field("without_replacement", Flag(
      "--dp-sampling", "with dp_fedavg: fixed-size cohorts (default) or "
      "Poisson cohorts, accounted as drawn", choices=_SAMPLINGS))
  target_epsilon: Optional[float] = _field(None, Flag(
      "--target-epsilon", "with dp_fedavg: end the run before epsilon "
      "passes this", type=float))


def _systems_default(name: str):
  """``config.Systems``' default for ``name`` (stated there once)."""
  from fedjax_agg import config  # pylint: disable=g-import-not-at-top
  field = {f.name: f for f in dataclasses.fields(config.Systems)}[name]
  return (field.default_factory() if field.default_factory
          is not dataclasses.MISSING else field.default)


def _systems_choices(attribute: str, extra: tuple = ()):
  def get():
    from fedjax_agg import systems  # pylint: disable=g-import-not-at-top
    return getattr(systems, attribute).names + extra
  return get


def _codecs():
  from fedjax_agg import compression  # pylint: disable=g-import-not-at-top
  return compression.CODECS.names


@dataclasses.dataclass(frozen=True)
class SystemsSpec:
  """"systems": the clients' simulated clock and uplink codec in every
  algorithm's runs (``config.Systems``, whose defaults these are)."""
  profiles: str = _field(_systems_default("profiles"), Flag(
      "--profiles", "client speeds and bandwidths: constant, lognormal or "
      "trace (with --profile-arg path=FILE.csv); records sim_time_s",
      choices=_systems_choices("PROFILES", ("trace",))))
  profile_args: dict = _field(_systems_default("profile_args"), Flag(
      "--profile-arg", "argument of the profiles (repeatable), e.g. "
      "speed_sigma=1.5", kind="pairs"))
  availability: str = _field(_systems_default("availability"), Flag(
      "--availability", "when clients are online (default always)",
      choices=_systems_choices("AVAILABILITY")))
  availability_args: dict = _field(_systems_default("availability_args"),
                                   Flag("--availability-arg", "argument of "
                                        "the availability (repeatable), e.g. "
                                        "mean_online_s=3600", kind="pairs"))
  over_selection: float = _field(_systems_default("over_selection"), Flag(
      "--over-selection", "select m(1 + x) clients, aggregate the first m "
      "to finish", type=float))
  deadline_s: Optional[float] = _field(_systems_default("deadline_s"), Flag(
      "--deadline", "drop clients that finish later than this many "
      "simulated seconds after the round starts", type=float))
  codec: Optional[str] = _field(_systems_default("codec"), Flag(
      "--codec", "compress the clients' updates (see --list codecs); "
      "records uplink_bytes", choices=_codecs))
  codec_args: dict = _field(_systems_default("codec_args"), Flag(
      "--codec-arg", "argument of the codec (repeatable), e.g. bits=2",
      kind="pairs"))
  error_feedback: bool = _field(_systems_default("error_feedback"), Flag(
      "--error-feedback", "keep each client's compression residual for its "
      "next update", kind="switch"))
  seed: int = _field(_systems_default("seed"))
  concurrency: Optional[int] = _field(_systems_default("concurrency"), Flag(
      "--concurrency", "C: asynchronous buffered aggregation (FedBuff) with "
      "C clients training at once, a server step per buffer of m updates",
      type=int))
  staleness: str = _field(_systems_default("staleness"), Flag(
      "--staleness", "with --concurrency: weight of an update s versions "
      "old (default polynomial: (1 + s)^-0.5)",
      choices=_systems_choices("STALENESS")))
  staleness_args: dict = _field(_systems_default("staleness_args"), Flag(
      "--staleness-arg", "argument of the staleness weight (repeatable), "
      "e.g. a=1.0", kind="pairs"))
  max_staleness: Optional[int] = _field(_systems_default("max_staleness"),
                                        Flag("--max-staleness", "with "
                                             "--concurrency: discard updates "
                                             "older than this many versions "
                                             "(default 10 ceil(C / m))",
                                             type=int))
  secagg_bits: Optional[int] = _field(_systems_default("secagg_bits"), Flag(
      "--secagg-bits", "simulated secure aggregation: fixed-point sums "
      "modulo 2^b (1..32) of the clients' clipped updates", type=int))
  secagg_clip: float = _field(_systems_default("secagg_clip"), Flag(
      "--secagg-clip", "with --secagg-bits: clipping range of an update "
      "coordinate (default 1.0)", type=float))


@dataclasses.dataclass(frozen=True)
class EarlyStoppingSpec:
  """"early_stopping": each run ends when a history column stops
  improving (``loop.EarlyStopping``; a sweep when all its members do)."""
  metric: str = _field("test_accuracy", Flag(
      "--early-stopping", "end each run when this history column stops "
      "improving (e.g. test_accuracy, test_loss with "
      "--early-stopping-mode min)"))
  mode: str = _field("max", Flag(
      "--early-stopping-mode", "max: higher is better; min: lower is",
      choices=_STOPPING_MODES))
  patience: int = _field(5, Flag(
      "--patience", "evaluations without improvement before a run ends "
      "(with --early-stopping; default 5)", type=int))
  min_delta: float = _field(0.0, Flag(
      "--min-delta", "the least change that counts as an improvement "
      "(with --early-stopping; default 0)", type=float))


@dataclasses.dataclass(frozen=True)
class Experiment:
  """A whole experiment: several algorithms x seeds on one setting.

  Build it in Python (each section a spec object, or a mapping of its
  keys), or from a JSON config with ``from_dict``; either way every key
  and value is checked (``experiment.check_config``: a ``ConfigError``
  naming the key path) when it is built.
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
    # Mappings become spec objects; then the whole is checked at once.
    sections = {"dataset": DataSpec, "partition": PartitionSpec,
                "model": ModelSpec, "train": TrainSpec,
                "attack": AttackSpec, "privacy": PrivacySpec,
                "systems": SystemsSpec, "early_stopping": EarlyStoppingSpec}
    for name, cls in sections.items():
      value = getattr(self, name, None)
      if isinstance(value, Mapping):
        object.__setattr__(self, name, _build(cls, name, value))
    if not isinstance(self.algorithms, Mapping):
      from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
      raise experiment.ConfigTypeError(
          "algorithms", "algorithms must be a mapping name -> "
          f"AlgorithmSpec (or its keys), got {type(self.algorithms).__name__}")
    object.__setattr__(self, "algorithms", {
        name: (_build(AlgorithmSpec, f"algorithms.{name}", spec)
               if isinstance(spec, Mapping) else spec)
        for name, spec in self.algorithms.items()})
    object.__setattr__(self, "seeds", list(self.seeds))
    from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
    experiment.check_config(self.to_dict(written_out=False))

  @classmethod
  def from_dict(cls, config: Mapping) -> "Experiment":
    """A JSON config -> the checked ``Experiment``.

    Script keys (``SCRIPT_KEYS``) are the scripts' own and are dropped.

    Raises:
      experiment.ConfigError: naming the key path of the first bad entry.
    """
    from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
    if not isinstance(config, Mapping):
      raise experiment.ConfigTypeError(
          "config", f"config must be a mapping (a JSON object), got "
          f"{type(config).__name__}")
    experiment.check_config(dict(config))
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{key: value for key, value in config.items()
                  if key in fields})

  def to_dict(self, written_out: bool = True) -> dict:
    """The JSON config of this experiment; ``written_out``: with every
    default written out (``experiment.resolve_config``), else only what
    differs from the defaults."""
    config = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if dataclasses.is_dataclass(value):
        value = _section_dict(value)
      elif f.name == "algorithms":
        value = {name: (_section_dict(spec)
                        if dataclasses.is_dataclass(spec) else dict(spec))
                 for name, spec in value.items()}
      if (value is None and f.name in ("name", "target_accuracy", "attack",
                                       "privacy", "systems",
                                       "early_stopping", "provenance")) or (
                                           f.name == "vmap_seeds"
                                           and value is False):
        continue  # Left out unless set, as a config file does.
      config[f.name] = value
    if not written_out:
      return config
    from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
    return experiment.resolve_config(config)


SECTIONS = {"dataset": DataSpec, "partition": PartitionSpec,
            "model": ModelSpec, "train": TrainSpec,
            "algorithms": AlgorithmSpec, "attack": AttackSpec,
            "privacy": PrivacySpec, "systems": SystemsSpec,
            "early_stopping": EarlyStoppingSpec}
"""A config's sections by key: key -> the spec class of that block."""


def _build(cls, path: str, mapping: Mapping):
  """``cls(**mapping)``, an unknown or missing key named as a config
  error (the values are checked with the whole experiment)."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  allowed = keys(cls)
  extra = SCRIPT_ALGORITHM_KEYS if cls is AlgorithmSpec else ()
  for key in mapping:
    if key not in allowed and key not in extra:
      raise experiment.ConfigError(
          f"{path}.{key}", f"{path}.{key}: unknown key; allowed: "
          f"{sorted(allowed)}")
  required = [f.name for f in dataclasses.fields(cls)
              if f.default is dataclasses.MISSING
              and f.default_factory is dataclasses.MISSING]
  for key in required:
    if key not in mapping:
      raise experiment.ConfigError(f"{path}.{key}", f"{path} must have a "
                                   f"{key!r} entry")
  return cls(**{k: v for k, v in mapping.items() if k in allowed})


def _section_dict(spec) -> dict:
  """A section's keys that differ from their defaults (and the required
  ones)."""
  out = {}
  for f in dataclasses.fields(spec):
    value = getattr(spec, f.name)
    default = (f.default_factory() if f.default_factory
               is not dataclasses.MISSING else f.default)
    if default is dataclasses.MISSING or value != default:
      out[f.name] = dict(value) if isinstance(value, Mapping) else value
  return out


def keys(cls) -> tuple[str, ...]:
  """The JSON keys of a section (its fields, in order)."""
  return tuple(f.name for f in dataclasses.fields(cls))


def defaults(cls) -> dict[str, Any]:
  """A section's defaults (fields without one are left out)."""
  out = {}
  for f in dataclasses.fields(cls):
    if f.default_factory is not dataclasses.MISSING:
      out[f.name] = f.default_factory()
    elif f.default is not dataclasses.MISSING:
      out[f.name] = f.default
  return out


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
