"""Command line: run one configurable federated experiment.

  python -m fedjax_agg --dataset fashion_mnist --partition shards \
      --num-clients 100 --model cnn_mcmahan --aggregator fedavg \
      --rounds 20 --participation 0.1 --epochs 1 --batch-size 16 --lr 0.05

Writes ``history.csv``, ``history.json``, ``curves.png`` (test accuracy
and loss per round), ``summary.json``, ``partition.png`` (the clients'
labels) and ``config.json`` (the resolved config with the data source
and sizes, every argument of the rule, versions, devices and this command
line; ``fedjax_agg.experiment.run_record``) to ``--out``, in the layout
``experiment.run_config`` writes (``experiment.RunFolder``). Algorithm
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

``python -m fedjax_agg report RUN_DIR ... --out DIR`` overlays and
tabulates finished runs (``fedjax_agg.report``).

``--seeds 0,1,2`` and ``--sweep alpha=1,5,10`` (repeatable; ``lr`` is the
client learning rate) run every seed x grid point as ONE vmapped
computation (``fedjax_agg.sweep``) and write ``<out>/<member>/history.*``,
e.g. ``<out>/alpha5_seed1/history.csv``, and ``<out>/summary.csv``; so
does a config with several seeds (vmapped where it says "vmap_seeds":
true, else one after the other, as ``experiment.run_config`` runs it).
This is the one output layout of every
entry point (``fedjax_agg.history``): one folder per run, a member
subfolder each when the run has several.

Mistakes in what is asked for -- a bad flag or value, a bad config, an
unknown name, missing data, an output folder that cannot take the results,
a checkpoint that cannot be resumed -- are found before the first round
where possible and reported as one line ``error: <flag>: <what>`` on
stderr (exit status 2).

Modules: ``_flags`` (the flags and the experiment config they build),
``_runs`` (the runs the command starts and what each writes); this module
parses, resolves and checks what is asked for, and loads the data.
"""

import argparse
import contextlib
import json
import sys
import warnings
from typing import Optional, Sequence

from fedjax_agg import aggregators
from fedjax_agg import objectives
from fedjax_agg.cli._flags import _flag
from fedjax_agg.cli._flags import _flag_of
from fedjax_agg.cli._flags import build_parser
from fedjax_agg.cli._flags import CONFIG_KEYS
from fedjax_agg.cli._flags import config_from_args
from fedjax_agg.cli._flags import describe
from fedjax_agg.cli._flags import LISTS
from fedjax_agg.cli._flags import parse_grid
from fedjax_agg.cli._flags import parse_kv
from fedjax_agg.cli._flags import parse_seeds
from fedjax_agg.cli._flags import RUN_FLAGS
from fedjax_agg.cli._flags import task_model
from fedjax_agg.cli._flags import SPEC_FLAGS
from fedjax_agg.cli._flags import UsageError
from fedjax_agg.cli._runs import _checkpoint_dir
from fedjax_agg.cli._runs import _is_writer
from fedjax_agg.cli._runs import _Start
from fedjax_agg.cli._runs import check_replacing
from fedjax_agg.cli._runs import compare_main
from fedjax_agg.cli._runs import seeds_main
from fedjax_agg.cli._runs import single_main
from fedjax_agg.cli._runs import sweep_main

__all__ = ["CONFIG_KEYS", "LISTS", "RUN_FLAGS", "SPEC_FLAGS", "UsageError",
           "build_parser", "config_from_args", "describe", "main", "parse",
           "parse_grid", "parse_kv", "parse_seeds", "resolve", "single_main",
           "sweep_main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the command line ``argv`` (default ``sys.argv[1:]``).

  Returns 0; a mistake in what is asked for is printed as one line
  ``error: ...`` on stderr and raises ``SystemExit(2)``.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["report"]:
    from fedjax_agg import report  # pylint: disable=g-import-not-at-top
    return report.main(argv[1:])
  # Warnings as one line each, without the library's source line.
  formatwarning = warnings.formatwarning
  warnings.formatwarning = (
      lambda message, category, *_, **__: f"warning: {message}\n")
  from fedjax_agg import loop  # pylint: disable=g-import-not-at-top
  try:
    return _main(argv)
  except UsageError as error:
    print(f"error: {error.message}", file=sys.stderr)
    raise SystemExit(2) from None
  except loop.Interrupted as stopped:
    # What the run wrote stays (history files, a checkpoint); the status
    # is the shell's for the signal (128 + its number).
    print(f"fedjax_agg: {stopped}", file=sys.stderr)
    raise SystemExit(130 if stopped.signal == "SIGINT" else 143) from None
  finally:
    warnings.formatwarning = formatwarning


def _model_name(args, given: set[str]) -> Optional[str]:
  """The run's network as the flags or the config file name it (read
  before JAX starts; None where the file cannot say)."""
  if "model" in given:
    return args.model
  if not args.config:
    return task_model({"name": args.dataset,
                       "args": parse_kv(args.dataset_arg,
                                        "--dataset-arg")}) or args.model
  from fedjax_agg import jsonio  # pylint: disable=g-import-not-at-top
  try:
    return jsonio.load_json(args.config)["model"]["name"]
  except (OSError, ValueError, KeyError, TypeError, RecursionError):
    return None  # the config's own checks name the fault later


def _start_jax(args, given: set[str]) -> None:
  """--cpu-devices and --distributed: before anything starts JAX.

  Without --cpu-devices the CPU is split into one device per core, except
  for the language models: their recurrent or attention steps use every
  core of one device better than one core each of several (measured on
  the char-LSTM, experiments/bench/README.md)."""
  from fedjax_agg import distributed  # pylint: disable=g-import-not-at-top
  from fedjax_agg import models  # pylint: disable=g-import-not-at-top
  try:
    if args.cpu_devices is None and (_model_name(args, given)
                                     in models.SEQUENCE_MODELS):
      distributed.prefer_cpu_devices(1, "--cpu-devices")
    elif args.cpu_devices is None:
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


def resolve(args, given: set[str]):
  """The ``spec.Experiment`` of the flags (and --config) and the algorithm
  to run; a bad one raises ``UsageError`` naming the flag (or the
  file)."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import spec  # pylint: disable=g-import-not-at-top
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
    checked = spec.Experiment.from_dict(config)
  except spec.ConfigError as error:
    if error.path == "algorithms" and (base is None or "algorithm" in given):
      flag = "--algorithm"  # The run's name, from --algorithm or the rule.
    else:
      flag = _flag_of(error.path, algorithm, given, args.config)
    raise UsageError(f"{flag}: {error}") from None
  # Configs may (experiments/records.py re-evaluates), not a command.
  if checked.train.rounds == 0:
    flag = _flag_of("train.rounds", algorithm, given, args.config)
    raise UsageError(f"{flag}: a run needs at least 1 round (0 would only "
                     "evaluate the initial model)")
  return checked, algorithm


def _check_grid(run, algorithm: str, grid: dict) -> None:
  """Every --sweep value, checked as the algorithm's argument it sets."""
  from fedjax_agg import spec as spec_lib  # pylint: disable=g-import-not-at-top
  from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
  try:
    sweep.grid_points(grid)
  except (TypeError, ValueError) as error:
    raise UsageError(f"--sweep: {error}") from None
  spec = run.algorithms[algorithm]
  takers = {"aggregator_args": aggregators.REGISTRY.parameters(
                spec.aggregator),
            "objective_args": objectives.REGISTRY.parameters(spec.objective)}
  for name, values in grid.items():
    keys = [key for key, parameters in takers.items() if name in parameters]
    if name != "learning_rate" and not keys:
      raise UsageError(
          f"--sweep: {name!r} is an argument neither of aggregator "
          f"{spec.aggregator!r} nor of objective {spec.objective!r} (nor "
          "lr)")
    if not values:
      raise UsageError(f"--sweep: {name} has no values")
    for value in values:
      trial = run.to_dict(written_out=False)
      if name == "learning_rate":
        trial.setdefault("train", {})["learning_rate"] = value
      for key in keys:
        trial["algorithms"][algorithm].setdefault(key, {})[name] = value
      try:
        spec_lib.Experiment.from_dict(trial)
      except spec_lib.ConfigError as error:
        raise UsageError(f"--sweep {name}={value!r}: {error}") from None


def _main(argv: list[str]) -> int:
  args, given = parse(argv)
  if args.list is not None:
    print("\n".join(describe(args.list)))
    return 0
  from fedjax_agg import registry  # pylint: disable=g-import-not-at-top
  try:
    allowed = registry.allowing_imports(args.allow_import)
  except (TypeError, ValueError) as error:
    raise UsageError(f"--allow-import: {error}") from None
  # The output folder is claimed (its manifest kept) from the first file
  # the run writes to the end of the command.
  with allowed, contextlib.ExitStack() as claim:
    return _run(args, given, argv, claim)


def _run(args, given: set[str], argv: list[str],
         claim: contextlib.ExitStack) -> int:
  """``_main`` once the flags are parsed and their imports allowed."""
  _start_jax(args, given)
  # Imported here so that --help does not wait for them.
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import jsonio  # pylint: disable=g-import-not-at-top

  config, algorithm = resolve(args, given)

  def echo():  # the resolved config, once the run has passed its checks
    print("config: " + json.dumps(jsonio.jsonable(config.to_dict())),
          file=sys.stderr, flush=True)
  if algorithm is None:
    return compare_main(args, config, echo)
  grid = parse_grid(args.sweep)
  # --seeds and --sweep run as one vmapped sweep; a config's several seeds
  # too where it says "vmap_seeds": true (else one after the other, as
  # run_config runs them).
  sweeping = bool(grid) or args.seeds is not None or (
      len(config.seeds) > 1 and config.vmap_seeds)
  plan, folder = _check_execution(args, given, config, algorithm, grid,
                                  sweeping,
                                  several=sweeping or len(config.seeds) > 1)
  dataset, indices = _load_data(args, given, config)
  prepared = [experiment.prepare_data(config, seed, dataset, indices[seed])
              for seed in config.seeds]

  def write_config():
    echo()
    if not _is_writer(args):
      return
    from fedjax_agg import manifest  # pylint: disable=g-import-not-at-top
    # Checked fresh, or --overwrite: the old run's recorded files go.
    claim.enter_context(manifest.recording(args.out, plan,
                                           resume=args.resume))
    experiment.write_run_config(
        args.out, config, dataset=dataset, indices=indices,
        execution={"algorithm": algorithm, "out": args.out,
                   "sweep": grid or None,
                   "vmap_seeds": sweeping,
                   "checkpoint_dir": args.checkpoint_dir,
                   "checkpoint_every": args.checkpoint_every,
                   "resume": args.resume, "overwrite": args.overwrite,
                   "keep": args.keep, "allow_import": args.allow_import,
                   "cpu_devices": args.cpu_devices,
                   "distributed": args.distributed,
                   "progress": not args.no_progress},
        command=["python", "-m", "fedjax_agg", *argv])
    folder.plot_partition(prepared[0])

  # Nothing is written until the run has passed every check (its rule,
  # client side, systems, privacy, checkpoint folder and lock): the files
  # appear with its first row; a refusal before it is one error line.
  start = _Start(write_config, dataset)
  if sweeping:
    return sweep_main(args, config, algorithm, prepared, grid, start, folder)
  if len(config.seeds) > 1:
    return seeds_main(args, config, algorithm, prepared, start, folder)
  return single_main(args, config, algorithm, prepared[0], start, folder)


def _check_execution(args, given: set[str], config, algorithm: str,
                     grid: dict, sweeping: bool, several: bool):
  """The flags of how to run, the devices and the output folder
  (``several``: several members, vmapped or one after the other).
  -> (the folder's ``manifest.Plan``, its ``experiment.RunFolder``)."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
  if sweeping and args.distributed:
    raise UsageError("--distributed: --seeds/--sweep runs shard their "
                     "members over this process's devices (--devices)")
  if several:
    if args.tensorboard is not None:
      raise UsageError("--tensorboard: runs of several seeds or grid points "
                       "do not write TensorBoard events (one run does)")
    _check_grid(config, algorithm, grid)
  points = sweep.grid_points(grid) if sweeping else [{}]
  folder = experiment.RunFolder(args.out, {algorithm: [
      sweep.member_name(point, seed) for point in points
      for seed in config.seeds]})
  names = folder.names()
  if args.checkpoint_every < 0:
    raise UsageError(f"--checkpoint-every: must be an int >= 0, got "
                     f"{args.checkpoint_every}")
  devices = config.train_of(algorithm).devices
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
  if _checkpoint_dir(args) is not None:
    # The default folder is in --out, and a refusal names --out.
    flag = "--checkpoint-dir" if args.checkpoint_dir else "--out"
    try:
      experiment.check_output_dir(_checkpoint_dir(args))
    except ValueError as error:
      raise UsageError(f"{flag}: {error}") from None
  from fedjax_agg import history  # pylint: disable=g-import-not-at-top
  from fedjax_agg import manifest  # pylint: disable=g-import-not-at-top
  check_replacing(args)
  plan = manifest.Plan()
  if not args.resume:
    try:
      plan = history.check_fresh(args.out, args.overwrite, names,
                                 keep=args.keep)
    except (TypeError, ValueError) as error:
      raise UsageError(f"--out: {error}") from None
    if _checkpoint_dir(args) is not None:
      try:
        experiment.refuse_held_checkpoints(_checkpoint_dir(args))
      except ValueError as error:
        flag = ("--checkpoint-dir" if args.checkpoint_dir else
                "--overwrite" if args.overwrite else "--out")
        raise UsageError(f"{flag}: {error}") from None
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
  return plan, folder


def _load_data(args, given: set[str], config):
  """-> (the dataset, seed -> partition indices); a failure names the flags
  behind it."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import spec  # pylint: disable=g-import-not-at-top
  try:
    dataset = experiment.load_dataset(config)
  except spec.ConfigError as error:  # the setting the data refuses
    flag = _flag_of(error.path, None, given, args.config)
    raise UsageError(f"{flag}: {error}") from None
  except (OSError, ValueError, TypeError, ImportError) as error:
    flags = _given_flags(("dataset", "source", "data_dir", "dataset_arg"),
                         given, args.config)
    raise UsageError(f"{flags}: {error}") from None
  indices = {}
  for seed in config.seeds:
    try:
      indices[seed] = experiment.partition_indices(
          config, seed, experiment.partition_source(dataset))
    except (ValueError, TypeError) as error:
      flags = _given_flags(("partition", "partition_arg", "num_clients",
                            "max_train_examples"), given, args.config)
      raise UsageError(f"{flags}: {error}") from None
  return dataset, indices


def _given_flags(dests: Sequence[str], given: set[str],
                 config_file: Optional[str]) -> str:
  """"--a/--b": those of the flags of ``dests`` that were given, else the
  config file, else the first flag."""
  flags = [_flag(dest) for dest in dests if dest in given]
  if flags:
    return "/".join(flags)
  return f"--config {config_file}" if config_file else _flag(dests[0])


if __name__ == "__main__":
  sys.exit(main())
