"""The runs the command line starts, and what each writes to ``--out``.

One run (``single_main``); a config's seeds one after the other
(``seeds_main``) or every seed x grid point as one vmapped sweep
(``sweep_main``); a config's algorithms compared (``compare_main``, which
is ``experiment.run_config``). Every one writes its folder through the
one writer, ``experiment.RunFolder``, in the one layout (a single run:
``history.csv|json``; several members: ``<member>/history.*`` and
``summary.csv``; always ``config.json``, ``summary.json``,
``curves.png`` and ``partition.png``). ``_Start`` writes the run's
config with its first row, once everything checked up front has
passed.
"""

import json
import os
from typing import Optional

from fedjax_agg import types
from fedjax_agg.cli._flags import _flag
from fedjax_agg.cli._flags import UsageError


class _Start(types.Callback):
  """A callback that writes the run's config with the run's first row (a
  member's initial evaluation), after everything the run checks up front.
  """

  def __init__(self, write, dataset=None) -> None:
    self.write = write
    self.started = False
    self.dataset = dataset  # what the run trains on, for titles and notes

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


def _checkpoint_dir(args) -> Optional[str]:
  """--checkpoint-dir, else <out>/checkpoint: every run keeps one, so that
  an interrupted run resumes (without --checkpoint-every it is written
  only when a signal stops the run); None for a --distributed run that
  did not ask for checkpoints."""
  if args.checkpoint_dir is None and (
      args.checkpoint_every or args.resume or not args.distributed):
    return os.path.join(args.out, "checkpoint")
  return args.checkpoint_dir


def check_replacing(args) -> None:
  """--resume, --overwrite and --keep together as they can go."""
  if args.resume and args.overwrite:
    raise UsageError("--overwrite: --resume continues the run in --out; "
                     "drop one of them")
  if args.keep and not args.overwrite:
    raise UsageError("--keep: names files an --overwrite leaves in place; "
                     "give it with --overwrite")


def _is_writer(args) -> bool:
  """Whether this process writes the results (process 0 of a job)."""
  if not args.distributed:
    return True
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def single_main(args, config, algorithm: str, prepared, start: _Start,
                folder) -> int:
  """One run, in the one layout (``experiment.RunFolder``)."""
  from fedjax_agg import checkpoint  # pylint: disable=g-import-not-at-top
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import history  # pylint: disable=g-import-not-at-top
  member = f"seed{config.seeds[0]}"
  callbacks = [start]
  if _is_writer(args):
    # The history files stay current as the run goes (a run that dies
    # keeps what it computed).
    callbacks.append(folder.history_writer(algorithm, member))
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
  written = folder.finish(config, {algorithm: {member: result.history}},
                          start.dataset)
  rows = result.history.rows
  print(json.dumps({"final_test_accuracy": rows[-1].get("test_accuracy"),
                    "initial_test_accuracy": rows[0].get("test_accuracy"),
                    "rounds": rows[-1].get("round"),
                    **written["paths"][algorithm][member],
                    "config": os.path.join(args.out, "config.json"),
                    "summary": os.path.join(args.out, "summary.json"),
                    "plot": os.path.join(args.out, "curves.png")}))
  return 0


def seeds_main(args, config, algorithm: str, prepared: list,
               start: _Start, folder) -> int:
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
          callbacks=[start, folder.history_writer(algorithm,
                                                  f"seed{seed}")],
          checkpoint_dir=None if checkpoint_dir is None else os.path.join(
              checkpoint_dir, f"seed{seed}"),
          checkpoint_every=args.checkpoint_every, resume=args.resume)
    except (ValueError, TypeError, OSError) as error:
      raise start.refused(error) from None
    members.append(runner.Member({}, seed, result.history, result.state))
  return _save_members(args, config, algorithm, members, start, folder)


def sweep_main(args, config, algorithm: str, prepared: list,
               grid: dict, start: _Start, folder) -> int:
  """``--seeds`` / ``--sweep``: every member in one vmapped computation;
  writes the run in the one layout (``history.save_run``:
  ``<out>/<member>/history.csv|json`` for several members),
  ``summary.csv`` and ``curves.png``."""
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
  return _save_members(args, config, algorithm, members, start, folder)


def compare_main(args, config, echo) -> int:
  """A config of several algorithms without ``--algorithm``: every
  algorithm x seed, as ``experiment.run_config`` runs them (its layout:
  ``<out>/<algorithm>/...``, ``summary.json`` and ``curves.png``).
  ``echo()`` shows the resolved config once the runs have passed their
  checks (a refusal is one line)."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import history  # pylint: disable=g-import-not-at-top
  for dest in ("sweep", "tensorboard", "checkpoint_dir", "distributed"):
    if getattr(args, dest):
      raise UsageError(
          f"{_flag(dest)}: not available when a config's algorithms are "
          "compared (give --algorithm NAME to run one of them)")
  check_replacing(args)
  # The output folder's refusals name --out (run_config checks it again).
  names = experiment.output_names(config)
  try:
    experiment.check_output_dir(args.out, names)
    if not args.resume:
      history.check_fresh(args.out, args.overwrite, names, keep=args.keep)
      experiment.refuse_held_checkpoints(os.path.join(args.out,
                                                      "checkpoints"))
  except (TypeError, ValueError) as error:
    raise UsageError(f"--out: {error}") from None
  try:
    summary = experiment.announced_run_config(
        echo, config, args.out, progress=not args.no_progress,
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


def _save_members(args, config, algorithm: str, members, start: _Start,
                  folder) -> int:
  """Writes several members' histories, summary and plot: one curve per
  grid point (mean +- std over its seeds), named by the point, or by the
  algorithm when only the seed varies (never by one seed)."""
  from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
  histories, curves = {}, {}
  for member in members:
    name = sweep.member_name(member.hparams, member.seed)
    histories[name] = member.history
    curves.setdefault(sweep.point_name(member.hparams) or algorithm,
                      []).append(f"{algorithm}/{name}")
  written = folder.finish(config, {algorithm: histories}, start.dataset,
                          curves)
  rows = [{"member": name, "hparams": member.hparams, "seed": member.seed,
           "final_test_accuracy": member.history.rows[-1].get(
               "test_accuracy"), **written["paths"][algorithm][name]}
          for name, member in zip(histories, members, strict=True)]
  print(json.dumps({"members": rows,
                    "rounds": members[0].history.rows[-1].get("round"),
                    "config": os.path.join(args.out, "config.json"),
                    "summary": os.path.join(args.out, "summary.csv"),
                    "plot": os.path.join(args.out, "curves.png")}))
  return 0
