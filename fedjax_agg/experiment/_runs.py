"""Running an experiment config: one algorithm with one seed, an
algorithm's seeds and grid points as one vmapped sweep, every algorithm ×
seed of a config (``run_config``) and the summaries of their histories.

Part of ``fedjax_agg.experiment`` (its docstring describes the config).
"""

import dataclasses
import math
import os
import warnings
from typing import Callable, Optional, Sequence

import jax

from fedjax_agg import aggregators
from fedjax_agg import clock
from fedjax_agg import history as history_lib
from fedjax_agg import objectives
from fedjax_agg import loop
from fedjax_agg import manifest
from fedjax_agg import registry
from fedjax_agg import simulation
from fedjax_agg import spec as spec_lib
from fedjax_agg import sweep
from fedjax_agg.config import Checkpointing
from fedjax_agg.experiment._build import _parameters
from fedjax_agg.experiment._build import build
from fedjax_agg.experiment._build import build_rule
from fedjax_agg.experiment._data import load_dataset
from fedjax_agg.experiment._data import prepare_data
from fedjax_agg.experiment._folder import refuse_held_checkpoints
from fedjax_agg.experiment._folder import RunFolder
from fedjax_agg.experiment._record import check_output_dir
from fedjax_agg.experiment._record import shown_path
from fedjax_agg.experiment._record import write_run_config


def _checkpointing(directory: Optional[str], every: int,
                   resume: bool) -> Optional[Checkpointing]:
  """``config.Checkpointing`` of a run's checkpoint arguments (None: no
  checkpoints)."""
  if directory is not None:
    return Checkpointing(directory, every, resume)
  if every or resume:
    raise ValueError("checkpoint_every / resume need checkpoint_dir (where "
                     "the checkpoints are)")
  return None


def run_algorithm(experiment: spec_lib.Experiment, algorithm: str, seed: int,
                  prepared=None, progress: bool = False,
                  aggregator=None, checkpoint_dir: Optional[str] = None,
                  checkpoint_every: int = 0, resume: bool = False,
                  callbacks=()):
  """Runs one algorithm of ``experiment`` with one seed. -> RunResult.

  ``experiment``: a ``spec.Experiment`` or a JSON config (read, and so
  checked, by ``Experiment.from_dict``, as ``run_config`` reads it: a
  setting this algorithm would not use, e.g. a "privacy" block beside
  rules that add no noise, is refused, not ignored). ``aggregator``, when
  given, replaces the one the algorithm names (e.g. a rule built from a
  pre-trained state); everything else still comes from ``experiment``
  (``build``). ``checkpoint_dir``, ``checkpoint_every`` and ``resume``:
  ``config.Checkpointing``; ``callbacks``: see ``simulation.run``.
  """
  experiment = spec_lib.Experiment.from_dict(experiment)
  built = build(experiment, algorithm,
                prepared or prepare_data(experiment, seed),
                aggregator=aggregator, progress=progress)
  checkpointing = _checkpointing(checkpoint_dir, checkpoint_every, resume)
  warn_short_feddrl(experiment, algorithm)
  return simulation.run(
      *built[:4], built.options.replace(checkpointing=checkpointing),
      seed=seed, callbacks=list(callbacks) + stopping_callbacks(experiment))


def stopping_callbacks(experiment: spec_lib.Experiment) -> list:
  """A run's callbacks that may end it: the experiment's
  ``early_stopping`` (``loop.EarlyStopping``), fresh for each run or
  sweep member."""
  if experiment.early_stopping is None:
    return []
  return [loop.EarlyStopping(**dataclasses.asdict(
      experiment.early_stopping))]


FEDDRL_MIN_AGENT_STEPS = 200
"""Fewer DDPG steps than this over a run leave FedDRL's agent near its initial
policy (the paper's agent trains continuously; it reports FedDRL behind FedAvg
for the first 200-300 rounds), and the run is warned about."""


def warn_short_feddrl(experiment: spec_lib.Experiment,
                      algorithm: str) -> Optional[str]:
  """Warns (and returns the message) when a FedDRL algorithm's run gives
  its agent fewer than ``FEDDRL_MIN_AGENT_STEPS`` learning steps."""
  experiment = spec_lib.Experiment.from_dict(experiment)
  spec = experiment.algorithms[algorithm]
  if spec.aggregator != "feddrl":
    return None
  args = spec.aggregator_args
  defaults = aggregators.AgentConfig()
  per_round = args.get("updates_per_round", defaults.updates_per_round)
  start = args.get("min_buffer_size", defaults.min_buffer_size)
  rounds = experiment.train_of(algorithm).rounds
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


def sweep_algorithm(experiment: spec_lib.Experiment, algorithm: str,
                    seeds: list[int],
                    prepared: list, grid: Optional[dict] = None,
                    progress: bool = False, callbacks=(),
                    checkpoint_dir: Optional[str] = None,
                    checkpoint_every: int = 0,
                    resume: bool = False) -> list:
  """Runs one algorithm of ``experiment`` for every seed and grid point as
  ONE vmapped sweep (``sweep.run_sweep``). -> list of ``sweep.SweepMember``.

  Args:
    experiment, algorithm: as ``run_algorithm``.
    seeds: the members' seeds.
    prepared: ``prepare_data(experiment, seed)`` for each seed (the partition
      may depend on the seed).
    grid: name -> list of values of aggregator/objective arguments or
      "learning_rate" (see ``build_rule``); None: seeds only.
    progress: show a progress bar.
    callbacks: callables every member's rows are handed to (besides the
      config's early stopping, fresh per member), as ``run_algorithm``'s.
    checkpoint_dir, checkpoint_every, resume: as ``run_algorithm``'s; one
      checkpoint holds every member (a resume refuses other seeds, grid,
      data or settings).
  """
  experiment = spec_lib.Experiment.from_dict(experiment)
  if len(prepared) != len(seeds):
    raise ValueError(f"prepared must hold one prepare_data result per seed "
                     f"({len(seeds)}), got {len(prepared)}")
  # Members are sharded over devices: "train.devices" when set (it must
  # divide the member count), else the most devices that divide it.
  members = len(seeds) * len(sweep.grid_points(grid))
  devices = experiment.train_of(algorithm).devices
  if devices is None:
    devices = math.gcd(members, len(jax.devices()))
  if experiment.attack is not None:
    # One attacked local update for every member: its objective is the
    # algorithm's own, so a grid may not change the objective.
    objective_name = experiment.algorithms[algorithm].objective
    swept = set(grid or {}) & set(_parameters(
        objectives.REGISTRY[objective_name]))
    if swept:
      raise spec_lib.ConfigError("attack", f"attack: a sweep over objective "
                        f"arguments {sorted(swept)} cannot share one "
                        "attacked local update; run them one at a time")
  # The members' shared local update is built on one device.
  built = build(experiment, algorithm, prepared[0], progress=progress,
                devices=1)
  options = built.options.replace(execution=dataclasses.replace(
      built.options.execution, devices=devices))
  if options.privacy is not None:  # each member's from its rule
    options = options.replace(privacy=dataclasses.replace(
        options.privacy, noise_multiplier=None))
  options = options.replace(checkpointing=_checkpointing(
      checkpoint_dir, checkpoint_every, resume))
  num_clients = built.data.num_clients
  return sweep.run_sweep(
      lambda hparams: build_rule(experiment, algorithm, num_clients,
                                 hparams),
      grid, seeds=seeds, model=built.model, data=[p[0] for p in prepared],
      test_data=built.test_data, options=options,
      callbacks=callbacks,
      member_callbacks=lambda member: stopping_callbacks(experiment))


def run_config(config, out_dir: str, progress: bool = True,
               algorithms: Optional[list[str]] = None,
               checkpoint_every: int = 0, resume: bool = False,
               vmap_seeds: Optional[bool] = None,
               overwrite: bool = False,
               allow_imports: Sequence[str] = (),
               keep: Sequence[str] = ()) -> dict:
  """Runs every algorithm × seed of ``config`` (a JSON config or a
  ``spec.Experiment``); writes results to ``out_dir``; returns the summary
  dict.

  The config and the output folder are checked before the data is read;
  ``config.json`` (``write_run_config``) is written before the first round.
  Each algorithm is a run of one member per seed, written by the one
  writer of run folders (``RunFolder``) in the layout the command line
  writes too: ``<out_dir>/<algorithm>/history.csv|json`` for one seed,
  else ``<out_dir>/<algorithm>/seed<k>/history.csv|json`` and
  ``<out_dir>/<algorithm>/summary.csv``; a config of one algorithm writes
  its files in ``out_dir`` itself (``<out_dir>/history.csv`` or
  ``<out_dir>/seed<k>/...``), as the command line does.

  ``checkpoint_every`` > 0 checkpoints each run every this many rounds in
  ``<out_dir>/checkpoints/<algorithm>/seed<k>`` (with ``vmap_seeds``: one
  checkpoint of all seeds in ``<out_dir>/checkpoints/<algorithm>``); with
  0, a run is checkpointed there only when SIGINT or SIGTERM stops it
  (``loop.Interrupted``). ``resume`` continues the runs found there (a
  finished run is read back, not re-run).

  ``vmap_seeds`` (default: the config's ``"vmap_seeds"`` entry, else
  False) runs all seeds of an algorithm as one vmapped sweep
  (``sweep_algorithm``) instead of one run after the other: the same
  results to float tolerance, written to the same files. The sweep's
  members are sharded over "train.devices" when set (it must divide the
  number of members), else over the most devices that divide it.

  An ``out_dir`` that already holds a run is refused unless ``overwrite``
  or ``resume`` (``history.check_fresh``). An overwrite removes only the
  files the earlier run wrote and recorded in its manifest, unchanged,
  before the first new one is written; it refuses a folder holding other
  files unless they are named in ``keep`` (``fedjax_agg.manifest``).

  ``allow_imports`` names the modules whose ``module:factory`` names the
  config may use (``fedjax_agg.registry``): a config never imports code by
  itself.
  """
  return announced_run_config(None, config, out_dir, progress=progress,
                              algorithms=algorithms,
                              checkpoint_every=checkpoint_every,
                              resume=resume, vmap_seeds=vmap_seeds,
                              overwrite=overwrite,
                              allow_imports=allow_imports, keep=keep)


def announced_run_config(on_start: Optional[Callable[[], None]], config,
                         out_dir: str, **options) -> dict:
  """``run_config(config, out_dir, **options)`` that calls ``on_start()``
  once everything checked up front has passed and ``config.json`` is
  written, before the first round (the command line shows the resolved
  config then, so that a refusal is one line)."""
  allow_imports = options.pop("allow_imports", ())
  keep = options.pop("keep", ())
  arguments = dict(progress=True, algorithms=None, checkpoint_every=0,
                   resume=False, vmap_seeds=None, overwrite=False)
  unknown = sorted(set(options) - set(arguments))
  if unknown:
    raise TypeError(f"run_config takes no argument {unknown}")
  arguments.update(options)
  with registry.allowing_imports(allow_imports):
    return _run_config(config, out_dir, arguments["progress"],
                       arguments["algorithms"],
                       arguments["checkpoint_every"], arguments["resume"],
                       arguments["vmap_seeds"], arguments["overwrite"], keep,
                       on_start)


def _run_config(config, out_dir, progress, algorithms, checkpoint_every,
                resume, vmap_seeds, overwrite, keep, on_start) -> dict:
  """``run_config`` inside its ``allow_imports``."""
  experiment = spec_lib.Experiment.from_dict(config)
  if vmap_seeds is None:
    vmap_seeds = experiment.vmap_seeds
  spec_lib.check_vmapped_systems(experiment, vmap_seeds)
  names = algorithms or list(experiment.algorithms)
  unknown = [name for name in names if name not in experiment.algorithms]
  if unknown:
    raise ValueError(f"algorithms {unknown} are not in the config's "
                     f"{sorted(experiment.algorithms)}")
  # Together they contradict: a resume keeps the folder's run and extends it, an
  # overwrite removes it.
  if not isinstance(resume, bool) or (resume and overwrite):
    raise ValueError(f"resume must be a bool, and not given with overwrite "
                     f"(resume continues the run in out_dir), got "
                     f"resume={resume!r}, overwrite={overwrite!r}")
  folder = RunFolder(out_dir, {name: [f"seed{seed}" for seed in
                                       experiment.seeds] for name in names})
  check_output_dir(out_dir, folder.names())
  plan = manifest.Plan()
  if not resume:
    plan = history_lib.check_fresh(out_dir, overwrite, folder.names(), keep)
    refuse_held_checkpoints(os.path.join(out_dir, "checkpoints"))
  # Every refusal that needs no data comes first (reading a dataset may take
  # minutes), and the planned removal happens only inside the claim below, after
  # the data has loaded.
  dataset = load_dataset(experiment)
  with manifest.recording(out_dir, plan, resume=resume):
    return _written(experiment, folder, dataset, progress,
                    (checkpoint_every, resume), vmap_seeds, on_start)


def _written(experiment, folder, dataset, progress, checkpoints,
             vmap_seeds, on_start) -> dict:
  """``run_config``'s runs and files, in its claimed folder."""
  checkpoint_every, resume = checkpoints
  names = list(folder.members)
  # Every algorithm is built (model, rule, training) on the first seed's
  # data before the first file: a refusal there leaves the folder as it
  # was, as on the command line.
  first = prepare_data(experiment, experiment.seeds[0], dataset)
  for name in names:
    options = build(experiment, name, first).options
    # What the run refuses of its systems, before the first file too.
    clock.check(options.systems, privacy=options.privacy,
                vmapped=vmap_seeds and len(experiment.seeds) > 1,
                local_update=options.local_update,
                stream=options.execution.stream)
  write_run_config(folder.out_dir, experiment, dataset=dataset,
                   algorithms=names,
                   execution={"out_dir": shown_path(folder.out_dir),
                              "vmap_seeds": vmap_seeds,
                              "checkpoint_every": checkpoint_every,
                              "resume": resume,
                              "allowed_imports": list(
                                  registry.allowed_imports())})
  folder.plot_partition(first)
  if on_start is not None:
    on_start()
  histories = (_vmapped_seeds if vmap_seeds else _seeds_in_turn)(
      experiment, folder, dataset, progress, (checkpoint_every, resume),
      first)
  return folder.finish(experiment, histories, dataset)["summary"]


def _checkpoint_folder(folder, name: str, seed=None) -> Optional[str]:
  """Where ``run_config`` keeps algorithm ``name``'s checkpoints (of one
  seed, or of all its seeds vmapped): always, so that an interrupted run
  resumes (without ``checkpoint_every`` the folder is written only when
  a signal stops the run)."""
  parts = [folder.out_dir, "checkpoints", name]
  return os.path.join(*parts, *([] if seed is None else [f"seed{seed}"]))


def _said(experiment, name, seed, history, progress, how=""):
  if progress:
    prefix = f"{experiment.name} " if experiment.name else ""
    print(f"{prefix}{name} seed {seed}{how}: final acc "
          f"{history.rows[-1].get('test_accuracy')}", flush=True)
  return history


def _seeds_in_turn(experiment, folder, dataset, progress, checkpoints,
                   first) -> dict:
  """Every seed, then every algorithm, one run at a time (``first``: the
  first seed's ``prepare_data``). -> algorithm -> member -> History."""
  checkpoint_every, resume = checkpoints
  histories = {name: {} for name in folder.members}
  seeds = experiment.seeds
  for seed in seeds:
    prepared = (first if seed == seeds[0]
                else prepare_data(experiment, seed, dataset))
    for name in folder.members:
      # The history files are kept current as the run goes (an
      # interrupted or failed run keeps its rounds); rewritten when done.
      result = run_algorithm(
          experiment, name, seed, prepared, progress,
          checkpoint_dir=_checkpoint_folder(folder, name, seed),
          checkpoint_every=checkpoint_every, resume=resume,
          callbacks=[folder.history_writer(name, f"seed{seed}")])
      histories[name][f"seed{seed}"] = _said(
          experiment, name, seed, result.history, progress)
  return histories


def _vmapped_seeds(experiment, folder, dataset, progress, checkpoints,
                   first) -> dict:
  """Every algorithm's seeds as one vmapped sweep (``first``: the first
  seed's ``prepare_data``). -> algorithm -> member -> History."""
  checkpoint_every, resume = checkpoints
  prepared = [first] + [prepare_data(experiment, seed, dataset)
                        for seed in experiment.seeds[1:]]
  histories = {}
  for name in folder.members:
    members = sweep_algorithm(
        experiment, name, experiment.seeds, prepared, progress=progress,
        checkpoint_dir=_checkpoint_folder(folder, name),
        checkpoint_every=checkpoint_every, resume=resume)
    histories[name] = {f"seed{member.seed}": _said(
        experiment, name, member.seed, member.history, progress,
        " (vmapped)") for member in members}
  return histories
