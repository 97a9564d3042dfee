"""The command line's flags and the experiment config they build.

The config flags are derived from the typed spec (``fedjax_agg.spec``):
each names the key it sets, its choices and its preset there; the flags of
how a run is executed (``RUN_FLAGS``) are the command line's own.
``config_from_args`` turns parsed flags (and a ``--config`` file) into an
experiment config; ``describe`` prints ``--list``.
"""

import argparse
import ast
import copy
import dataclasses
import difflib
import re
from typing import Any, Optional, Sequence

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import data as data_lib
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import registry
from fedjax_agg import spec as spec_lib

__all__ = ["CONFIG_KEYS", "LISTS", "RUN_FLAGS", "SPEC_FLAGS", "UsageError",
           "build_parser", "config_from_args", "describe", "parse_grid",
           "parse_kv", "parse_seeds"]

# The first line of ``python -m fedjax_agg --help``.
_DESCRIPTION = (
    "Command line: run one configurable federated experiment. To compare "
    "finished runs (tables and plots, mean and band over seeds): python -m "
    "fedjax_agg report RUN_DIR [RUN_DIR ...] --out DIR [--metric M] "
    "[--target T] (see python -m fedjax_agg report --help).")

LISTS = ("aggregators", "objectives", "clients", "partitions", "models",
         "datasets", "attacks", "codecs", "profiles", "availability",
         "staleness")
"""What ``--list WHAT`` can print: the families of registered names
(aggregators, objectives, partitions, models, datasets, attacks, codecs, client
profiles, availability models, staleness functions)."""


def _dest(flag: str) -> str:
  return flag[2:].replace("-", "_")


SPEC_FLAGS = spec_lib.flags()
"""The config flags, derived from the spec (``spec.flags``): ``(config key,
Flag)`` pairs, in the order they apply (a name before its arguments, --seed
before --seeds); "{algorithm}" in a key stands for the algorithm run."""
CONFIG_KEYS = {_dest(flag.name): key for key, flag in SPEC_FLAGS}
"""argparse dest -> the config key its flag sets (from ``SPEC_FLAGS``)."""
_KINDS = {_dest(flag.name): flag.kind for key, flag in SPEC_FLAGS}
# The config's sections that are absent unless set (default None).
_OPTIONAL_SECTIONS = tuple(
    f.name for f in dataclasses.fields(spec_lib.Experiment)
    if dataclasses.is_dataclass(spec_lib.SECTIONS.get(f.name))
    and f.default is None)
# Flags whose name=value pairs are merged into the config's mapping.
_PAIRS = tuple(dest for dest, kind in _KINDS.items() if kind == "pairs")
RUN_FLAGS = ("--config", "--algorithm", "--list", "--partition-plot",
             "--cpu-devices", "--distributed", "--coordinator-address",
             "--num-processes", "--process-id", "--sweep", "--out",
             "--no-progress", "--tensorboard", "--checkpoint-dir",
             "--checkpoint-every", "--resume", "--overwrite", "--keep",
             "--allow-import", "--version")
"""The flags of how a run is executed and written, the command line's own (not
experiment settings: ``config.json`` records them under
``provenance.execution``)."""


def _arguments_of(dest: str) -> Optional[str]:
  """A name flag -> the key, beside its own, of the arguments that belong
  to the name it sets (they are dropped when it changes the name)."""
  key = CONFIG_KEYS[dest].rsplit(".", 1)
  if _KINDS[dest] != "value" or len(key) != 2:
    return None
  section = key[0].split(".")[0]
  fields = spec_lib.keys(spec_lib.SECTIONS.get(section, object)) if (
      section in spec_lib.SECTIONS) else ()
  for candidate in (f"{key[1]}_args", "args" if key[1] == "name" else None):
    if candidate in fields:
      return candidate
  return None


class UsageError(SystemExit):
  """A mistake in what the command line asks for; ``main`` prints it as one
  line ``error: <message>`` and exits with status 2."""

  def __init__(self, message: str):
    super().__init__(message)
    self.message = " ".join(str(message).split())


class _Parser(argparse.ArgumentParser):

  def error(self, message):
    raise UsageError(message + near_miss(message, self))


_INVALID_CHOICE = re.compile(
    r"argument (?P<flag>--[\w-]+): invalid choice: '(?P<value>[^']*)'")


def near_miss(message: str, parser: argparse.ArgumentParser) -> str:
  """For argparse's "invalid choice" ``message``: where the name is
  another flag's registered entry (``--aggregator FedProx``: an
  objective) or close to one of this flag's choices, a hint; else "".
  The flags and their names are the parser's own (a flag names a
  registry's entries where its choices are a ``registry.Names``)."""
  match = _INVALID_CHOICE.search(message)
  if match is None:
    return ""
  flag, value = match["flag"], match["value"]
  choices = {action.option_strings[0]: action.choices
             for action in parser._actions  # pylint: disable=protected-access
             if action.choices and action.option_strings}
  hints = []
  for other, names in choices.items():
    found = [name for name in names
             if isinstance(name, str) and name.lower() == value.lower()]
    if found and other == flag:
      hints.append(f"did you mean {found[0]}?")
    elif found and isinstance(names, registry.Names):
      kind = other[2:].replace("-", " ")
      hints.append(f"{found[0]} is {'an' if kind[0] in 'aeiou' else 'a'} "
                   f"{kind}: {other} {found[0]}")
  if not hints and flag in choices:
    own = {str(name).lower(): str(name) for name in choices[flag]}
    close = difflib.get_close_matches(value.lower(), list(own), n=3,
                                      cutoff=0.6)
    if close:
      hints.append(f"did you mean {' or '.join(own[c] for c in close)}?")
  return f" ({'; '.join(hints)})" if hints else ""


def _flag(dest: str) -> str:
  return "--" + dest.replace("_", "-")


_BOOLEANS = {"true": True, "false": False}
_LONGEST_VALUE = 10_000  # characters: a value is a setting, not a file


def _literal(text: str, where: str):
  """A flag's VALUE: true/false in any case as booleans, then a Python
  literal (numbers, strings, lists, None), else the text itself."""
  if text.lower() in _BOOLEANS:
    return _BOOLEANS[text.lower()]
  if len(text) > _LONGEST_VALUE:
    raise UsageError(f"{where}: the value is {len(text)} characters long; "
                     f"at most {_LONGEST_VALUE}")
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError, TypeError):
    return text
  except (RecursionError, MemoryError):
    raise UsageError(f"{where}: the value is nested too deeply") from None


def _named(pair: str, flag: str, form: str) -> tuple[str, str]:
  """"name=value" -> (name, value), "-" in the name read as "_"; names
  ``flag`` where ``pair`` is not of that ``form``."""
  if "=" not in pair:
    raise UsageError(f"{flag}: expects {form}, got {pair!r}")
  name, value = pair.split("=", 1)
  name = name.strip().replace("-", "_")
  if not name.isidentifier():
    raise UsageError(f"{flag}: {name!r} is not an argument name "
                     f"(in {pair[:80]!r})")
  return name, value


def parse_kv(pairs: Sequence[str], flag: str) -> dict:
  """["a=1", "b=x", "c=false"] -> {"a": 1, "b": "x", "c": False}: VALUE
  is true/false (any case), a Python literal, or else a string; names the
  flag on bad input (no ``=``, no name, a name given twice)."""
  out = {}
  for pair in pairs or ():
    name, value = _named(pair, flag, "name=value")
    if name in out:
      raise UsageError(f"{flag}: {name} is given twice")
    out[name] = _literal(value.strip(), f"{flag} {name}")
  return out


def parse_seeds(text: str) -> list[int]:
  """"0,1,2" -> [0, 1, 2]; names --seeds on bad input."""
  try:
    return [int(s) for s in text.split(",") if s.strip()]
  except ValueError:
    raise UsageError(f"--seeds: expects comma-separated ints, got "
                     f"{text!r}") from None


def parse_grid(pairs: Sequence[str]) -> dict[str, list]:
  """["alpha=1,5", "lr=0.1,0.2"] -> {"alpha": [1, 5], "learning_rate":
  [0.1, 0.2]} ("lr" is the client learning rate)."""
  grid = {}
  for pair in pairs or ():
    name, values = _named(pair, "--sweep", "name=v1,v2,...")
    name = "learning_rate" if name == "lr" else name
    if name in grid:
      raise UsageError(f"--sweep: {name} is given twice")
    grid[name] = [_literal(v.strip(), f"--sweep {name}")
                  for v in values.split(",") if v.strip()]
  return grid


def _one_of(names: Sequence[str]) -> str:
  return "one of: " + ", ".join(names)


_SECTION_TITLES = {"dataset": "data", "partition": "partition",
                   "model": "model", "train": "training",
                   "algorithms": "algorithm", "attack": "attack",
                   "privacy": "privacy", "systems": "systems",
                   "early_stopping": "early stopping"}


class _OneDefault(argparse.HelpFormatter):
  """Shows a flag's default once: where its help does not state one and
  the default says something (not None, empty or False)."""

  def _get_help_string(self, action):
    text = action.help or ""
    default = action.default
    if ("default" in text or default in (None, False, [], {})
        or default is argparse.SUPPRESS or isinstance(
            action, argparse._VersionAction)):  # pylint: disable=protected-access
      return text
    return f"{text} (default: {default})"


def build_parser(defaults: bool = True) -> argparse.ArgumentParser:
  """The command line's parser: the spec's config flags
  (``SPEC_FLAGS``) and the flags of how the run is executed
  (``RUN_FLAGS``).

  Args:
    defaults: False leaves every flag that is not given out of the parsed
      namespace (how ``main`` tells given flags from defaults).
  """
  parser = _Parser(
      prog="python -m fedjax_agg", description=_DESCRIPTION,
      formatter_class=_OneDefault)
  groups = {}
  target = [parser]

  def add(*flags, **kwargs):
    if not defaults:
      kwargs["default"] = argparse.SUPPRESS
    target[0].add_argument(*flags, **kwargs)

  def group(title):
    if title not in groups:
      groups[title] = parser.add_argument_group(title)
    target[0] = groups[title]

  add("--config", default=None, metavar="FILE",
      help="start from this experiment config (JSON, the format of "
      "fedjax_agg.spec); flags given override its keys")
  add("--algorithm", default=None, metavar="NAME",
      help="with --config: which of its algorithms to run (needed where it "
      "has several); without: the run's name, else the aggregator's")
  add("--list", default=None, choices=LISTS, metavar="WHAT",
      help=f"print every name of WHAT ({_one_of(LISTS)}) with its "
      "arguments and their defaults, and exit")
  for key, flag in SPEC_FLAGS:
    group(_SECTION_TITLES.get(key.split(".")[0], "run"))
    help_text = f"{flag.help} (sets {key})"
    if flag.kind in ("switch", "negate"):
      add(flag.name, action="store_true", help=help_text)
    elif flag.kind == "pairs":
      add(flag.name, action="append", default=[], metavar="NAME=VALUE",
          help=help_text)
    else:
      if flag.choices is not None:
        help_text = f"{flag.help}, {_one_of(flag.choices)} (sets {key})"
      add(flag.name, default=flag.preset, type=flag.type,
          choices=flag.choices,
          metavar="NAME" if flag.choices is not None else None,
          help=help_text)
  group("execution and output")
  add("--partition-plot", action="store_true",
      help="kept for older scripts: every run now saves the partition's "
      "label heatmap (partition.png)")
  add("--cpu-devices", type=int, default=None,
      help="split the CPU into this many XLA devices before JAX starts; "
      "rounds then shard the clients over them (default: one per available "
      "core, 2x faster than one device on a 2-core CPU; 1 opts out; an "
      "XLA_FLAGS host device count in the environment wins)")
  add("--distributed", action="store_true",
      help="multi-host: call jax.distributed.initialize() first (one "
      "process per host; coordinator, process count and id from the flags "
      "below, else detected: SLURM, Open MPI, Kubernetes, Cloud TPU, "
      "JAX_COORDINATOR_ADDRESS)")
  add("--coordinator-address", default=None,
      help="with --distributed: host:port of process 0")
  add("--num-processes", type=int, default=None,
      help="with --distributed: number of processes (hosts)")
  add("--process-id", type=int, default=None,
      help="with --distributed: this process' index")
  add("--sweep", action="append", default=[], metavar="NAME=V1,V2,...",
      help="sweep an aggregator/objective argument or lr in the same "
      "vmapped call (repeatable; the members are the product with the "
      "seeds)")
  add("--out", default="results/run", help="output folder")
  add("--no-progress", action="store_true", help="no progress bar")
  add("--tensorboard", default=None, metavar="DIR",
      help="also write every history scalar as TensorBoard events to DIR "
      "(needs tensorboardX: pip install 'fedjax_agg[tensorboard]')")
  add("--checkpoint-dir", default=None,
      help="checkpoint folder (default <out>/checkpoint)")
  add("--checkpoint-every", type=int, default=0,
      help="save the whole run every this many rounds (0: only when Ctrl-C "
      "or SIGTERM stops it, so that --resume goes on)")
  add("--resume", action="store_true",
      help="continue from the latest checkpoint (starts at round 0 if there "
      "is none)")
  add("--overwrite", action="store_true",
      help="replace the run already in --out (without it such a folder is "
      "refused): removes only the files that run wrote and recorded, "
      "unchanged; its checkpoints are kept")
  add("--keep", action="append", default=[], metavar="PATH",
      help="with --overwrite: a file in --out that no run wrote and that "
      "stays where it is (repeatable; without it such a file stops the "
      "overwrite)")
  add("--allow-import", action="append", default=[], metavar="MODULE",
      help="let module:factory names of MODULE (and its sub-modules) be "
      "imported; the factory must be declared with "
      "fedjax_agg.registry.declare (repeatable; a config never imports "
      "code by itself)")
  if defaults:
    parser.add_argument("--version", action="version",
                        version=f"fedjax_agg {_version()}")
  return parser


def _version() -> str:
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    return metadata.version("fedjax_agg")
  except metadata.PackageNotFoundError:
    return "unknown (not installed)"


# ------------------------------------------------------------------ --list


def _call_line(name: str, defaults: dict[str, Any], more: bool = False
               ) -> str:
  arguments = [f"{arg}={value!r}" if value != "<required>" else arg
               for arg, value in defaults.items()]
  return f"{name}({', '.join(arguments + (['...'] if more else []))})"


def describe(what: str) -> list[str]:
  """One line per name of ``what`` (one of ``LISTS``): the name with its
  arguments and their defaults (an argument without one is bare; "..."
  where the factory passes other keyword arguments on)."""
  lines = []
  from fedjax_agg import compression  # pylint: disable=g-import-not-at-top
  from fedjax_agg import systems  # pylint: disable=g-import-not-at-top
  from fedjax_agg import clients  # pylint: disable=g-import-not-at-top
  registries = {"aggregators": aggregators.REGISTRY,
                "objectives": objectives.REGISTRY,
                "clients": clients.REGISTRY,
                "attacks": attacks.REGISTRY, "codecs": compression.CODECS,
                "profiles": systems.PROFILES,
                "availability": systems.AVAILABILITY,
                "staleness": systems.STALENESS}
  if what in registries:
    registry = registries[what]
    for name in registry.names:
      defaults = {arg: value for arg, value in registry.describe(name).items()
                  if arg not in registry.context}
      lines.append(_call_line(name, defaults, spec_lib.takes_any_keyword(
          registry.factory(name))))
  elif what == "partitions":
    for name in partitions.NAMES:
      lines.append(_call_line(name, spec_lib.describe_parameters(
          spec_lib.partition_parameters(name))))
  elif what == "models":
    for name in models.NAMES:
      lines.append(_call_line(name, spec_lib.describe_parameters(
          spec_lib.model_parameters(name)),
                              spec_lib.model_takes_options(name)))
    checkpoint = spec_lib.describe_parameters(
        spec_lib.model_parameters(models.PRETRAINED))
    lines.append(f"{_call_line(models.PRETRAINED, checkpoint)}: the network "
                 "of the Hugging Face checkpoint folder --base (GPT-2, "
                 "Llama, Mistral, Qwen2)")
  elif what == "datasets":
    for name in data_lib.NAMES:
      spec = data_lib.REGISTRY.factory(name)
      shape = "x".join(str(d) for d in spec.input_shape)
      defaults = spec_lib.defaults(spec_lib.DataSpec)
      lines.append(f"{_call_line(name, defaults)}: {spec.num_classes} "
                   f"classes, inputs {shape}")
    for name in data_lib.FEDERATIONS:
      arguments = spec_lib.describe_parameters(
          data_lib.federation_parameters(name))
      lines.append(f"{_call_line(name, arguments)}: natural federation "
                   f"(--partition {partitions.NATURAL}; arguments with "
                   "--dataset-arg)")
  else:
    raise ValueError(f"what must be one of {LISTS}, got {what!r}")
  return lines


# ----------------------------------------------------------- the config


def _keys(dest: str, algorithm: str) -> list[str]:
  """The config keys of a flag; the algorithm's name may hold dots."""
  template = CONFIG_KEYS[dest]
  if template.startswith("algorithms.{algorithm}."):
    return ["algorithms", algorithm or "*", *template.split(".")[2:]]
  return template.split(".")


def _config_value(dest: str, value):
  kind = _KINDS[dest]
  if kind == "pairs":
    return parse_kv(value, _flag(dest))
  if kind == "negate":
    # Absent: the library's schedule ("auto"), never a forced True.
    return False if value else "auto"
  if kind == "seed":
    return [value]
  if kind == "seeds":
    return parse_seeds(value)
  return value


def _rule_name(aggregator: str) -> str:
  """A run's default name from its rule: "factory" for "module:factory"."""
  return aggregator.rsplit(":", 1)[-1]


def _algorithm(args, base: Optional[dict], given: set[str]) -> str:
  """The name of the algorithm to run."""
  if base is None:
    return args.algorithm or _rule_name(args.aggregator)
  names = list(base.get("algorithms") or {})
  if "algorithm" in given:
    if args.algorithm not in names and "aggregator" not in given:
      raise UsageError(f"--algorithm: {args.algorithm!r} is not an algorithm "
                       f"of --config {args.config} ({names}); give "
                       "--aggregator to add it")
    return args.algorithm
  if len(names) == 1:
    return names[0]
  if not names:
    return _rule_name(args.aggregator)
  # Several algorithms and none picked: the command compares them all.
  for dest in sorted(given):
    if dest in CONFIG_KEYS and CONFIG_KEYS[dest].startswith(
        "algorithms.{algorithm}."):
      raise UsageError(
          f"{_flag(dest)}: --config {args.config} has several algorithms "
          f"{names}; a flag of one algorithm needs --algorithm NAME (without "
          "both, every algorithm runs)")
  return None


def task_model(dataset: dict) -> Optional[str]:
  """The network a text federation implies (a config's "dataset" block):
  the char-LSTM for next-character prediction on Shakespeare, the word
  LSTM for Sent140; None where the task does not choose one."""
  from fedjax_agg import data as data_lib  # pylint: disable=g-import-not-at-top
  name, args = dataset.get("name"), dataset.get("args") or {}
  if name not in data_lib.FEDERATIONS or not isinstance(args, dict):
    return None
  if data_lib.federation_task(name, args) == "sequence":
    return "char_lstm"
  if name == "leaf" and args.get("dataset") == "sent140":
    return "word_lstm"
  return None


def _task_defaults(config: dict, explicit: set[str]) -> None:
  """What the task chooses where no flag did: a natural federation's
  partition is "natural" (its only one) and a text task's model, unless
  --model names one, is its language model (--model-arg then sets that
  model's options: they are checked against the model the run builds)."""
  from fedjax_agg import data as data_lib  # pylint: disable=g-import-not-at-top
  if config["dataset"].get("name") not in data_lib.FEDERATIONS:
    return
  if "partition" not in explicit and "partition_arg" not in explicit:
    config["partition"]["name"] = "natural"
  model = task_model(config["dataset"])
  if model is not None and "model" not in explicit:
    config["model"]["name"] = model


def config_from_args(args, base: Optional[dict] = None,
                     given: Optional[set[str]] = None) -> tuple[dict, str]:
  """The experiment config (see ``fedjax_agg.experiment``) of the flags.

  Args:
    args: the parsed flags.
    base: a config file's config; None: every flag sets its key (given or
      default).
    given: with ``base``, the dests of the flags given (their keys
      override the base's).

  Returns:
    ``(config, algorithm)``: the config, holding the one algorithm to run,
    and that algorithm's name; for a config file of several algorithms
    without ``--algorithm``, all of them and None (the run compares them).
  """
  given = set(given or ())
  explicit = set(given)
  if base is None:
    config = {"name": "cli", "dataset": {}, "partition": {}, "model": {},
              "train": {}, "algorithms": {}, "seeds": [0]}
    given = {dest for dest in CONFIG_KEYS if getattr(args, dest) is not None}
    for dest in CONFIG_KEYS:
      # In an optional section ("attack", "systems", ...) or the optional
      # client side, an empty NAME=VALUE list or an absent switch states
      # nothing: the section is not created for it.
      # So does an absent switch whose key defaults to None (not asked).
      if ((CONFIG_KEYS[dest].split(".")[0] in _OPTIONAL_SECTIONS
           or dest == "client_arg" or dest == "allow_subset")
          and _KINDS[dest] in ("pairs", "switch")
          and not getattr(args, dest)):
        given.discard(dest)
  else:
    config = copy.deepcopy(base)
    config.setdefault("seeds", spec_lib.defaults(
        spec_lib.Experiment)["seeds"])
  algorithm = _algorithm(args, base, given)
  if base is not None and not (base.get("algorithms") or {}):
    given.add("aggregator")
  specs = config.setdefault("algorithms", {})
  if algorithm is not None:
    config["algorithms"] = {algorithm: specs.get(algorithm, {})}
  for dest in CONFIG_KEYS:
    if dest not in given:
      continue
    keys = _keys(dest, algorithm)
    value = _config_value(dest, getattr(args, dest))
    parent = config
    for key in keys[:-1]:
      parent = parent.setdefault(key, {})
    arguments = _arguments_of(dest)
    if arguments is not None and parent.get(keys[-1]) != value:
      parent.pop(arguments, None)  # They were the old one's.
    if dest in _PAIRS:
      value = {**parent.get(keys[-1], {}), **value}
    parent[keys[-1]] = value
  if base is None:
    _task_defaults(config, explicit)
  attack = config.get("attack")
  if isinstance(attack, dict) and "name" not in attack:
    flags = [_flag(dest) for dest in ("attack_arg", "attack_fraction",
                                      "adversaries") if dest in given]
    raise UsageError(f"{', '.join(flags) or '--attack'}: needs --attack "
                     "NAME (the attack to simulate)")
  return config, algorithm


def _flag_of(path: str, algorithm: str, given: set[str],
             config_file: Optional[str]) -> str:
  """The flag that set config key ``path`` (else the config file)."""
  best = None
  for dest in CONFIG_KEYS:
    key = ".".join(_keys(dest, algorithm))
    if path == key or path.startswith((key + ".", key + "[")):
      if (best is None or len(key) > len(best[1])
          or (len(key) == len(best[1]) and dest in given)):
        best = (dest, key)
  if best is not None and (best[0] in given or config_file is None):
    return _flag(best[0])
  return f"--config {config_file}" if config_file else "config"
