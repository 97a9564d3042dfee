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
"""

import argparse
import contextlib
import json
import os
import sys
import warnings
from typing import Optional, Sequence

from fedjax_agg import aggregators
from fedjax_agg import objectives
from fedjax_agg import types
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
    echo()
    return compare_main(args, config)
  grid = parse_grid(args.sweep)
  # --seeds and --sweep run as one vmapped sweep; a config's several seeds
  # too where it says "vmap_seeds": true (else one after the other, as
  # run_config runs them).
  sweeping = bool(grid) or args.seeds is not None or (
      len(config.seeds) > 1 and config.vmap_seeds)
  plan = _check_execution(args, given, config, algorithm, grid, sweeping,
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
    if args.partition_plot:
      experiment.plot_partition(prepared[0],
                                os.path.join(args.out, "partition.png"))

  # Nothing is written until the run has passed every check (its rule,
  # client side, systems, privacy, checkpoint folder and lock): the files
  # appear with its first row; a refusal before it is one error line.
  start = _Start(write_config, dataset)
  if sweeping:
    return sweep_main(args, config, algorithm, prepared, grid, start)
  if len(config.seeds) > 1:
    return seeds_main(args, config, algorithm, prepared, start)
  return single_main(args, config, algorithm, prepared[0], start)


class _Start(types.Callback):
  """A callback that writes the run's config with the run's first row (a
  member's initial evaluation), after everything the run checks up front.
  """

  def __init__(self, write, dataset=None) -> None:
    self.write = write
    self.started = False
    self.dataset = dataset  # what the run trains on, for titles and notes

  def record(self, history) -> None:
    """Notes in ``history``'s config a subset that stood in for the data
    asked for (``experiment.note_substitution``)."""
    from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
    experiment.note_substitution(history, self.dataset)

  def __call__(self, row: dict, client) -> None:
    del row, client
    if not self.started:
      self.started = True
      self.write()

  def refused(self, error: Exception) -> "UsageError":
    """A refusal raised before the first row, as the command's error line
    (the message names the setting); after it, the error is the run's."""
    if self.started:
      raise error
    return UsageError(str(error))


def _check_execution(args, given: set[str], config, algorithm: str,
                     grid: dict, sweeping: bool, several: bool) -> None:
  """The flags of how to run, the devices and the output folder
  (``several``: several members, vmapped or one after the other)."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  names = ["config.json", "accuracy.png"] + (
      ["partition.png"] if args.partition_plot else [])
  if sweeping and args.distributed:
    raise UsageError("--distributed: --seeds/--sweep runs shard their "
                     "members over this process's devices (--devices)")
  if several:
    if args.tensorboard is not None:
      raise UsageError("--tensorboard: runs of several seeds or grid points "
                       "do not write TensorBoard events (one run does)")
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
  from fedjax_agg import history  # pylint: disable=g-import-not-at-top
  from fedjax_agg import manifest  # pylint: disable=g-import-not-at-top
  if args.resume and args.overwrite:
    raise UsageError("--overwrite: --resume continues the run in --out; "
                     "drop one of them")
  if args.keep and not args.overwrite:
    raise UsageError("--keep: names files an --overwrite leaves in place; "
                     "give it with --overwrite")
  plan = manifest.Plan()
  if not args.resume:
    try:
      plan = history.check_fresh(args.out, args.overwrite, names,
                                 keep=args.keep)
    except (TypeError, ValueError) as error:
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
  return plan


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


def _title(config, algorithm: str, dataset=None) -> str:
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  return f"{algorithm}: {experiment.setting_title(config, dataset)}"


def single_main(args, config, algorithm: str, prepared,
                start: _Start) -> int:
  """One run: writes ``history.csv|json`` and ``accuracy.png``."""
  from fedjax_agg import checkpoint  # pylint: disable=g-import-not-at-top
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import plotting  # pylint: disable=g-import-not-at-top
  from fedjax_agg import history  # pylint: disable=g-import-not-at-top
  from fedjax_agg import report  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  callbacks = [start]
  if _is_writer(args):
    # The history files stay current as the run goes (a run that dies
    # keeps what it computed).
    callbacks.append(history.HistoryWriter(args.out, {"partial": True}))
    if args.tensorboard:
      callbacks.append(history.TensorBoardWriter(args.tensorboard))
  try:
    result = experiment.run_algorithm(
        config, algorithm, config.seeds[0], prepared,
        progress=not args.no_progress, checkpoint_dir=_checkpoint_dir(args),
        checkpoint_every=args.checkpoint_every, resume=args.resume,
        callbacks=callbacks)
  except checkpoint.CheckpointError as error:
    raise UsageError(f"--resume/--checkpoint-dir: {error}") from None
  except (ValueError, TypeError, OSError) as error:
    raise start.refused(error) from None
  finally:
    for callback in callbacks:  # also when the run failed to start
      callback.close()
  if not _is_writer(args):
    return 0  # Every process holds the same history; process 0 writes it.
  start.record(result.history)
  paths = history.write_run(args.out, {"run": result.history})["run"]
  plot_path = os.path.join(args.out, "accuracy.png")
  label = algorithm + report.async_tag(result.history)
  plotting.plot_history({label: result.history}, plot_path,
                        title=_title(config, algorithm, start.dataset))
  if not np.isnan(result.history.column("sim_time_s")).all():
    report.plot_curves({label: [result.history]}, "test_accuracy",
                       "sim_time_s", os.path.join(args.out,
                                                  "accuracy_by_time.png"),
                       _title(config, algorithm, start.dataset))
  rows = result.history.rows
  print(json.dumps({"final_test_accuracy": rows[-1].get("test_accuracy"),
                    "initial_test_accuracy": rows[0].get("test_accuracy"),
                    "rounds": rows[-1].get("round"), **paths,
                    "config": os.path.join(args.out, "config.json"),
                    "plot": plot_path}))
  return 0


def seeds_main(args, config, algorithm: str, prepared: list,
               start: _Start) -> int:
  """A config's seeds one after the other ("vmap_seeds": false): the
  sweep's layout and summary, each member a run of its own."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import runner  # pylint: disable=g-import-not-at-top
  members = []
  checkpoint_dir = _checkpoint_dir(args)
  for seed, data in zip(config.seeds, prepared, strict=True):
    try:
      result = experiment.run_algorithm(
          config, algorithm, seed, data, progress=not args.no_progress,
          callbacks=[start],
          checkpoint_dir=None if checkpoint_dir is None else os.path.join(
              checkpoint_dir, f"seed{seed}"),
          checkpoint_every=args.checkpoint_every, resume=args.resume)
    except (ValueError, TypeError, OSError) as error:
      raise start.refused(error) from None
    members.append(runner.Member({}, seed, result.history, result.state))
  return _save_members(args, config, algorithm, members, start)


def sweep_main(args, config, algorithm: str, prepared: list,
               grid: dict, start: _Start) -> int:
  """``--seeds`` / ``--sweep``: every member in one vmapped computation;
  writes the run in the one layout (``history.save_run``:
  ``<out>/<member>/history.csv|json`` for several members),
  ``summary.csv`` and ``accuracy.png``."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import round_forms  # pylint: disable=g-import-not-at-top
  try:
    members = experiment.sweep_algorithm(
        config, algorithm, config.seeds, prepared, grid,
        progress=not args.no_progress, callbacks=[start],
        checkpoint_dir=_checkpoint_dir(args),
        checkpoint_every=args.checkpoint_every, resume=args.resume)
  except round_forms.UntraceableGridError as error:
    raise UsageError(f"--sweep: {error}") from None
  except (ValueError, TypeError, OSError) as error:
    raise start.refused(error) from None
  return _save_members(args, config, algorithm, members, start)


def compare_main(args, config) -> int:
  """A config of several algorithms without ``--algorithm``: every
  algorithm x seed, as ``experiment.run_config`` runs them (its layout:
  ``<out>/<algorithm>/...``, ``summary.json`` and ``curves.png``)."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  for dest in ("sweep", "tensorboard", "checkpoint_dir", "distributed",
               "partition_plot"):
    if getattr(args, dest):
      raise UsageError(
          f"{_flag(dest)}: not available when a config's algorithms are "
          "compared (give --algorithm NAME to run one of them)")
  try:
    summary = experiment.run_config(
        config, args.out, progress=not args.no_progress,
        checkpoint_every=args.checkpoint_every, resume=args.resume,
        overwrite=args.overwrite, keep=args.keep)
  except ValueError as error:
    raise UsageError(f"--config {args.config}: {error}") from None
  print(json.dumps({"algorithms": {
      name: {key: value for key, value in entry.items()
             if key.startswith("final_test_accuracy")}
      for name, entry in summary.items()},
      "summary": os.path.join(args.out, "summary.json"),
      "plot": os.path.join(args.out, "curves.png")}))
  return 0


def _save_members(args, config, algorithm: str, members,
                  start: _Start) -> int:
  """Writes several members' histories, summary and plot."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import history  # pylint: disable=g-import-not-at-top
  from fedjax_agg import plotting  # pylint: disable=g-import-not-at-top
  from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
  histories = {sweep.member_name(member.hparams, member.seed):
               member.history for member in members}
  for member in members:
    start.record(member.history)
  saved = history.write_run(args.out, histories)
  rows = [{"member": name, "hparams": member.hparams, "seed": member.seed,
           "final_test_accuracy": member.history.rows[-1].get(
               "test_accuracy"), **saved[name]}
          for (name, _), member in zip(histories.items(), members,
                                       strict=True)]
  # One band per grid point: mean +- std over its seeds, and a summary CSV.
  by_point = {}
  for member in members:
    # A band is named by what varies across bands (the grid point), or
    # by the algorithm when only the seed does: never by one seed.
    by_point.setdefault(sweep.point_name(member.hparams) or algorithm,
                        []).append(member.history)
  plot_path = os.path.join(args.out, "accuracy.png")
  plotting.plot_mean_curves(by_point, plot_path,
                            title=_title(config, algorithm, start.dataset))
  summary = experiment.summarize(by_point, config.target_accuracy)
  summary_path = os.path.join(args.out, "summary.csv")
  experiment.write_summary_csv(summary, summary_path)
  print(json.dumps({"members": rows,
                    "rounds": members[0].history.rows[-1].get("round"),
                    "config": os.path.join(args.out, "config.json"),
                    "summary": summary_path, "plot": plot_path}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
