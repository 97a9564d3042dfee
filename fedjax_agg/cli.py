"""Command line: run one configurable federated experiment.

  python -m fedjax_agg --dataset fashion_mnist --partition shards \
      --num-clients 100 --model cnn_mcmahan --aggregator fedavg \
      --rounds 20 --participation 0.1 --epochs 1 --batch-size 16 --lr 0.05

Writes ``history.csv``, ``history.json``, ``accuracy.png`` (test accuracy
per round) and ``config.json`` (the resolved config with the data source
and sizes, every argument of the rule, versions, devices and this command
line; ``fedjax_agg.experiment.run_record``) to ``--out``;
``--partition-plot`` also saves the partition's label heatmap. Algorithm
hyperparameters go through repeated ``--agg-arg name=value`` /
``--objective-arg`` / ``--partition-arg`` flags (values are Python
literals, e.g. ``alpha=5.0``); ``--list aggregators`` (objectives,
partitions, models, datasets) prints every name with its arguments and
their defaults. ``--checkpoint-every n`` saves the whole run every n
rounds (to ``<out>/checkpoint`` unless ``--checkpoint-dir`` says where);
the same command with ``--resume`` continues a killed run where its last
checkpoint left it.

``--config file.json`` starts from a config in the format of
``fedjax_agg.experiment`` (a ``config.json`` written by an earlier run
works too); the flags given on the command line override its keys, and
``--algorithm`` picks one of its algorithms when it has several. A flag
that changes the aggregator, objective, partition or model drops the
file's arguments of the old one. The resolved config is printed to stderr
before anything runs.

``--seeds 0,1,2`` and ``--sweep alpha=1,5,10`` (repeatable; ``lr`` is the
client learning rate) run every seed x grid point as ONE vmapped
computation (``fedjax_agg.sweep``) and write ``<out>/<member>/history.*``,
e.g. ``<out>/alpha5_seed1/history.csv``; so does a config with several
seeds.

Mistakes in what is asked for -- a bad flag or value, a bad config, an
unknown name, missing data, an output folder that cannot take the results,
a checkpoint that cannot be resumed -- are found before the first round
where possible and reported as one line ``error: <flag>: <what>`` on
stderr (exit status 2).
"""

import argparse
import ast
import copy
import json
import os
import sys
from typing import Any, Optional, Sequence

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import data as data_lib
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import spec as spec_lib

__all__ = ["CONFIG_KEYS", "LISTS", "RUN_FLAGS", "SPEC_FLAGS", "UsageError",
    "build_parser",
    "config_from_args", "describe", "main", "parse", "parse_grid", "parse_kv",
    "parse_seeds", "resolve", "single_main", "sweep_main"]

LISTS = ("aggregators", "objectives", "partitions", "models", "datasets",
         "attacks")


def _dest(flag: str) -> str:
  return flag[2:].replace("-", "_")


# The config flags, derived from the spec (``fedjax_agg.spec``): argparse
# dest -> the config key its flag sets ("{algorithm}": the algorithm run),
# in the order they apply (a name before its arguments, --seeds after
# --seed).
SPEC_FLAGS = spec_lib.flags()
CONFIG_KEYS = {_dest(flag.name): key for key, flag in SPEC_FLAGS}
_KINDS = {_dest(flag.name): flag.kind for key, flag in SPEC_FLAGS}
# Flags whose name=value pairs are merged into the config's mapping.
_PAIRS = tuple(dest for dest, kind in _KINDS.items() if kind == "pairs")
# The flags of how a run is executed and written (not experiment settings:
# config.json records them under provenance.execution).
RUN_FLAGS = ("--config", "--algorithm", "--list", "--partition-plot",
             "--cpu-devices", "--distributed", "--coordinator-address",
             "--num-processes", "--process-id", "--sweep", "--out",
             "--no-progress", "--tensorboard", "--checkpoint-dir",
             "--checkpoint-every", "--resume")


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
    raise UsageError(message)


def _flag(dest: str) -> str:
  return "--" + dest.replace("_", "-")


def _literal(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def parse_kv(pairs: Sequence[str], flag: str) -> dict:
  """["a=1", "b=x"] -> {"a": 1, "b": "x"}; names the flag on bad input."""
  out = {}
  for pair in pairs or ():
    if "=" not in pair:
      raise UsageError(f"{flag}: expects name=value, got {pair!r}")
    name, value = pair.split("=", 1)
    out[name.strip().replace("-", "_")] = _literal(value.strip())
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
    if "=" not in pair:
      raise UsageError(f"--sweep: expects name=v1,v2,..., got {pair!r}")
    name, values = pair.split("=", 1)
    name = name.strip().replace("-", "_")
    grid["learning_rate" if name == "lr" else name] = [
        _literal(v.strip()) for v in values.split(",") if v.strip()]
  return grid


def _one_of(names: Sequence[str]) -> str:
  return "one of: " + ", ".join(names)


def build_parser(defaults: bool = True) -> argparse.ArgumentParser:
  """The command line's parser: the spec's config flags
  (``SPEC_FLAGS``) and the flags of how the run is executed
  (``RUN_FLAGS``).

  Args:
    defaults: False leaves every flag that is not given out of the parsed
      namespace (how ``main`` tells given flags from defaults).
  """
  parser = _Parser(
      prog="python -m fedjax_agg", description=__doc__.splitlines()[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)

  def add(*flags, **kwargs):
    if not defaults:
      kwargs["default"] = argparse.SUPPRESS
    parser.add_argument(*flags, **kwargs)

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
  add("--partition-plot", action="store_true",
      help="save the partition's label heatmap")
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
      help="checkpoint folder (default <out>/checkpoint when "
      "--checkpoint-every or --resume is given)")
  add("--checkpoint-every", type=int, default=0,
      help="save the whole run every this many rounds (0: never)")
  add("--resume", action="store_true",
      help="continue from the latest checkpoint (starts at round 0 if there "
      "is none)")
  return parser


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
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  lines = []
  if what in ("aggregators", "objectives", "attacks"):
    registry = {"aggregators": aggregators, "objectives": objectives,
                "attacks": attacks}[what].REGISTRY
    for name in registry.names:
      defaults = {arg: value for arg, value in registry.describe(name).items()
                  if arg not in registry.context}
      lines.append(_call_line(name, defaults, experiment.takes_any_keyword(
          registry.factory(name))))
  elif what == "partitions":
    for name in partitions.NAMES:
      lines.append(_call_line(name, experiment.describe_parameters(
          experiment.partition_parameters(name))))
  elif what == "models":
    for name in models.NAMES:
      lines.append(_call_line(name, experiment.describe_parameters(
          experiment.model_parameters(name)),
                              experiment.model_takes_options(name)))
  elif what == "datasets":
    for name in data_lib.NAMES:
      spec = data_lib.REGISTRY.factory(name)
      shape = "x".join(str(d) for d in spec.input_shape)
      lines.append(f"{_call_line(name, experiment.DATASET_DEFAULTS)}: "
                   f"{spec.num_classes} classes, inputs {shape}")
  else:
    raise ValueError(f"what must be one of {LISTS}, got {what!r}")
  return lines


# ----------------------------------------------------------- the config


def _keys(dest: str, algorithm: str) -> list[str]:
  """The config keys of a flag; the algorithm's name may hold dots."""
  template = CONFIG_KEYS[dest]
  if template.startswith("algorithms.{algorithm}."):
    return ["algorithms", algorithm, template.rsplit(".", 1)[1]]
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


def _algorithm(args, base: Optional[dict], given: set[str]) -> str:
  """The name of the algorithm to run."""
  if base is None:
    return args.algorithm or args.aggregator
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
    return args.aggregator
  raise UsageError(f"--algorithm: --config {args.config} has several "
                   f"algorithms {names}; pick one")


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
    and that algorithm's name.
  """
  given = set(given or ())
  if base is None:
    config = {"name": "cli", "dataset": {}, "partition": {}, "model": {},
              "train": {}, "algorithms": {}, "seeds": [0]}
    given = {dest for dest in CONFIG_KEYS if getattr(args, dest) is not None}
    if not args.attack_arg:
      given.discard("attack_arg")
  else:
    config = copy.deepcopy(base)
    config.setdefault("seeds", spec_lib.defaults(
        spec_lib.Experiment)["seeds"])
  algorithm = _algorithm(args, base, given)
  if base is not None and not (base.get("algorithms") or {}):
    given.add("aggregator")
  specs = config.setdefault("algorithms", {})
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


# ------------------------------------------------------------------ main


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the command line ``argv`` (default ``sys.argv[1:]``).

  Returns 0; a mistake in what is asked for is printed as one line
  ``error: ...`` on stderr and raises ``SystemExit(2)``.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    return _main(argv)
  except UsageError as error:
    print(f"error: {error.message}", file=sys.stderr)
    raise SystemExit(2) from None


def _start_jax(args) -> None:
  """--cpu-devices and --distributed: before anything starts JAX."""
  from fedjax_agg import distributed  # pylint: disable=g-import-not-at-top
  try:
    if args.cpu_devices is None:
      distributed.use_all_cores()
    else:
      distributed.use_cpu_devices(args.cpu_devices)
  except (ValueError, RuntimeError) as error:
    raise UsageError(f"--cpu-devices: {error}") from None
  if args.distributed:
    import jax  # pylint: disable=g-import-not-at-top
    jax.distributed.initialize(coordinator_address=args.coordinator_address,
                               num_processes=args.num_processes,
                               process_id=args.process_id)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, set[str]]:
  """-> (the parsed flags, the dests of the flags given in ``argv``)."""
  args = build_parser().parse_args(argv)
  return args, set(vars(build_parser(defaults=False).parse_args(argv)))


def resolve(args, given: set[str]) -> tuple[dict, str]:
  """The checked config of the flags (and --config) and the algorithm to
  run; a bad one raises ``UsageError`` naming the flag (or the file)."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  base = None
  if args.config is not None:
    try:
      base = experiment.load_config(args.config)
    except (OSError, ValueError) as error:
      raise UsageError(f"--config {args.config}: {error}") from None
    if not isinstance(base, dict):
      raise UsageError(f"--config {args.config}: not a JSON object")
  config, algorithm = config_from_args(args, base, given)
  try:
    experiment.check_config(config)
  except experiment.ConfigError as error:
    if error.path == "algorithms" and (base is None or "algorithm" in given):
      flag = "--algorithm"  # The run's name, from --algorithm or the rule.
    else:
      flag = _flag_of(error.path, algorithm, given, args.config)
    raise UsageError(f"{flag}: {error}") from None
  return config, algorithm


def _check_grid(config: dict, algorithm: str, grid: dict) -> None:
  """Every --sweep value, checked as the algorithm's argument it sets."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
  try:
    sweep.grid_points(grid)
  except (TypeError, ValueError) as error:
    raise UsageError(f"--sweep: {error}") from None
  spec = config["algorithms"][algorithm]
  takers = {"aggregator_args": aggregators.REGISTRY.parameters(
                spec["aggregator"]),
            "objective_args": objectives.REGISTRY.parameters(
                experiment.objective_of(spec))}
  for name, values in grid.items():
    keys = [key for key, parameters in takers.items() if name in parameters]
    if name != "learning_rate" and not keys:
      raise UsageError(
          f"--sweep: {name!r} is an argument neither of aggregator "
          f"{spec['aggregator']!r} nor of objective "
          f"{experiment.objective_of(spec)!r} (nor lr)")
    if not values:
      raise UsageError(f"--sweep: {name} has no values")
    for value in values:
      trial = copy.deepcopy(config)
      if name == "learning_rate":
        trial.setdefault("train", {})["learning_rate"] = value
      for key in keys:
        trial["algorithms"][algorithm].setdefault(key, {})[name] = value
      try:
        experiment.check_config(trial)
      except experiment.ConfigError as error:
        raise UsageError(f"--sweep {name}={value!r}: {error}") from None


def _main(argv: list[str]) -> int:
  args, given = parse(argv)
  if args.list is not None:
    print("\n".join(describe(args.list)))
    return 0
  _start_jax(args)
  # Imported here so that --help does not wait for them.
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import jsonio  # pylint: disable=g-import-not-at-top

  config, algorithm = resolve(args, given)
  print("config: " + json.dumps(jsonio.jsonable(
      experiment.resolve_config(config))), file=sys.stderr, flush=True)
  grid = parse_grid(args.sweep)
  sweeping = bool(grid) or args.seeds is not None or len(config["seeds"]) > 1
  _check_execution(args, given, config, algorithm, grid, sweeping)
  dataset, indices = _load_data(args, given, config)
  prepared = [experiment.prepare_data(config, seed, dataset, indices[seed])
              for seed in config["seeds"]]
  if _is_writer(args):
    experiment.write_run_config(
        args.out, config, dataset=dataset, indices=indices,
        execution={"algorithm": algorithm, "out": args.out,
                   "sweep": grid or None,
                   "checkpoint_dir": args.checkpoint_dir,
                   "checkpoint_every": args.checkpoint_every,
                   "resume": args.resume, "cpu_devices": args.cpu_devices,
                   "distributed": args.distributed,
                   "progress": not args.no_progress},
        command=["python", "-m", "fedjax_agg", *argv])
    if args.partition_plot:
      experiment.plot_partition(prepared[0],
                                os.path.join(args.out, "partition.png"))
  if sweeping:
    return sweep_main(args, config, algorithm, prepared, grid)
  return single_main(args, config, algorithm, prepared[0])


def _check_execution(args, given: set[str], config: dict, algorithm: str,
                     grid: dict, sweeping: bool) -> None:
  """The flags of how to run, the devices and the output folder."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  names = ["config.json", "accuracy.png"] + (
      ["partition.png"] if args.partition_plot else [])
  if sweeping:
    if args.checkpoint_every or args.resume or args.checkpoint_dir:
      raise UsageError("--checkpoint-dir/--checkpoint-every/--resume: "
                       "--seeds/--sweep runs do not checkpoint")
    if args.tensorboard is not None:
      raise UsageError("--tensorboard: --seeds/--sweep runs do not write "
                       "TensorBoard events (one run at a time does)")
    if args.devices is not None or args.distributed:
      raise UsageError("--devices/--distributed: --seeds/--sweep runs use "
                       "one device")
    _check_grid(config, algorithm, grid)
  else:
    names += ["history.csv", "history.json"]
    if args.checkpoint_every < 0:
      raise UsageError(f"--checkpoint-every: must be an int >= 0, got "
                       f"{args.checkpoint_every}")
    if _checkpoint_dir(args) is not None:
      try:
        experiment.check_output_dir(_checkpoint_dir(args))
      except ValueError as error:
        raise UsageError(f"--checkpoint-dir: {error}") from None
  devices = config.get("train", {}).get("devices")
  if devices is not None:
    import jax  # pylint: disable=g-import-not-at-top
    if devices > jax.device_count():
      flag = _flag_of("train.devices", algorithm, given, args.config)
      raise UsageError(f"{flag}: {devices} devices asked for, the job has "
                       f"{jax.device_count()} ({jax.devices()[0].platform})")
  try:
    experiment.check_output_dir(args.out, names)
  except ValueError as error:
    raise UsageError(f"--out: {error}") from None
  if args.tensorboard is not None:
    try:
      import tensorboardX  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise UsageError("--tensorboard: needs tensorboardX: pip install "
                       "'fedjax_agg[tensorboard]'") from None
    try:
      experiment.check_output_dir(args.tensorboard)
    except ValueError as error:
      raise UsageError(f"--tensorboard: {error}") from None


def _load_data(args, given: set[str], config: dict):
  """-> (the dataset, seed -> partition indices); a failure names the flags
  behind it."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  try:
    dataset = experiment.load_dataset(config)
  except (OSError, ValueError) as error:
    flags = _given_flags(("dataset", "source", "data_dir"), given,
                         args.config)
    raise UsageError(f"{flags}: {error}") from None
  indices = {}
  for seed in config["seeds"]:
    try:
      indices[seed] = experiment.partition_indices(config, seed,
                                                   dataset.train_y)
    except (ValueError, TypeError) as error:
      flags = _given_flags(("partition", "partition_arg", "num_clients",
                            "max_train_examples"), given, args.config)
      raise UsageError(f"{flags}: {error}") from None
  return dataset, indices


def _checkpoint_dir(args) -> Optional[str]:
  """--checkpoint-dir, else <out>/checkpoint where checkpoints are asked
  for, else None."""
  if args.checkpoint_dir is None and (args.checkpoint_every or args.resume):
    return os.path.join(args.out, "checkpoint")
  return args.checkpoint_dir


def _is_writer(args) -> bool:
  """Whether this process writes the results (process 0 of a job)."""
  if not args.distributed:
    return True
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def _given_flags(dests: Sequence[str], given: set[str],
                 config_file: Optional[str]) -> str:
  """"--a/--b": those of the flags of ``dests`` that were given, else the
  config file, else the first flag."""
  flags = [_flag(dest) for dest in dests if dest in given]
  if flags:
    return "/".join(flags)
  return f"--config {config_file}" if config_file else _flag(dests[0])


def _title(config: dict, algorithm: str) -> str:
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  return f"{algorithm}: {experiment.setting_title(config)}"


def single_main(args, config: dict, algorithm: str, prepared) -> int:
  """One run: writes ``history.csv|json`` and ``accuracy.png``."""
  from fedjax_agg import checkpoint  # pylint: disable=g-import-not-at-top
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import plotting  # pylint: disable=g-import-not-at-top
  from fedjax_agg import history  # pylint: disable=g-import-not-at-top
  callbacks = []
  if _is_writer(args):
    # The history files stay current as the run goes (a run that dies
    # keeps what it computed).
    callbacks.append(history.HistoryWriter(args.out, {"partial": True}))
    if args.tensorboard:
      callbacks.append(history.TensorBoardWriter(args.tensorboard))
  try:
    result = experiment.run_algorithm(
        config, algorithm, config["seeds"][0], prepared,
        progress=not args.no_progress, checkpoint_dir=_checkpoint_dir(args),
        checkpoint_every=args.checkpoint_every, resume=args.resume,
        callbacks=callbacks)
  except checkpoint.CheckpointError as error:
    raise UsageError(f"--resume/--checkpoint-dir: {error}") from None
  finally:
    for callback in callbacks:
      if hasattr(callback, "close"):
        callback.close()
  if not _is_writer(args):
    return 0  # Every process holds the same history; process 0 writes it.
  paths = result.history.save(args.out)
  plot_path = os.path.join(args.out, "accuracy.png")
  plotting.plot_history({algorithm: result.history}, plot_path,
                        title=_title(config, algorithm))
  rows = result.history.rows
  print(json.dumps({"final_test_accuracy": rows[-1].get("test_accuracy"),
                    "initial_test_accuracy": rows[0].get("test_accuracy"),
                    "rounds": rows[-1].get("round"), **paths,
                    "config": os.path.join(args.out, "config.json"),
                    "plot": plot_path}))
  return 0


def sweep_main(args, config: dict, algorithm: str, prepared: list,
               grid: dict) -> int:
  """``--seeds`` / ``--sweep``: every member in one vmapped computation;
  writes ``<out>/<member>/history.csv|json`` and ``accuracy.png``."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import plotting  # pylint: disable=g-import-not-at-top
  from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
  try:
    members = experiment.sweep_algorithm(
        config, algorithm, config["seeds"], prepared, grid,
        progress=not args.no_progress)
  except sweep.UntraceableGridError as error:
    raise UsageError(f"--sweep: {error}") from None
  histories, rows = {}, []
  for member in members:
    name = sweep.member_name(member.hparams, member.seed)
    paths = member.history.save(os.path.join(args.out, name))
    histories[name] = member.history
    rows.append({"member": name, "hparams": member.hparams,
                 "seed": member.seed, "final_test_accuracy":
                 member.history.rows[-1].get("test_accuracy"), **paths})
  # One band per grid point: mean +- std over its seeds, and a summary CSV.
  by_point = {}
  for member in members:
    label = sweep.member_name(member.hparams, 0).rsplit("_seed", 1)[0]
    by_point.setdefault(label or algorithm, []).append(member.history)
  plot_path = os.path.join(args.out, "accuracy.png")
  plotting.plot_mean_curves(by_point, plot_path,
                            title=_title(config, algorithm))
  summary = experiment.summarize(by_point, config.get("target_accuracy"))
  summary_path = os.path.join(args.out, "summary.csv")
  experiment.write_summary_csv(summary, summary_path)
  print(json.dumps({"members": rows,
                    "rounds": members[0].history.rows[-1].get("round"),
                    "config": os.path.join(args.out, "config.json"),
                    "summary": summary_path, "plot": plot_path}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
