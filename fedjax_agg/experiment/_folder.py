"""The one writer of a run's folder, for every entry point.

A run is described once (``spec.Experiment``) and written once, by
``RunFolder``, whether the command line or ``run_config`` ran it, in the
layout ``history``'s docstring describes:

* ``<out>/config.json`` (the resolved description and its provenance),
  ``summary.json`` (per curve: final and best metric, rounds to target),
  ``curves.png`` (accuracy and loss against the round, one colour per
  curve in the description's order), ``partition.png`` (the clients'
  data) and, for runs on the systems clock, ``accuracy_by_time.png``;
* one folder per algorithm where several run (``<out>/<algorithm>``),
  else the run's folder itself;
* in it, one folder per member where an algorithm has several (seeds x
  grid points, ``<algorithm>/<member>``, and a ``summary.csv``), else the
  algorithm's folder itself, holding ``history.csv`` and ``history.json``.

A level of folders appears only where there are several of its kind, so
a single run reads ``<out>/history.csv`` from both entry points.
"""

import os
from typing import Mapping, Optional, Sequence

import numpy as np

from fedjax_agg import checkpoint
from fedjax_agg import history as history_lib
from fedjax_agg import jsonio
from fedjax_agg import plotting
from fedjax_agg import report
from fedjax_agg import spec as spec_lib
from fedjax_agg.experiment._data import note_substitution
from fedjax_agg.experiment._data import plot_partition
from fedjax_agg.experiment._record import setting_title
from fedjax_agg.experiment._summary import summarize
from fedjax_agg.experiment._summary import write_summary_csv


class RunFolder:
  """Where each file of a run goes, and the writing of them.

  Args:
    out_dir: the run's folder.
    members: algorithm -> the names of its members (``sweep.member_name``:
      ``seed0``, ``alpha5_seed0``), in the description's order.
  """

  def __init__(self, out_dir: str, members: Mapping[str, Sequence[str]]):
    if not members or any(not names for names in members.values()):
      raise ValueError("members: a run has at least one algorithm, each "
                       "with at least one member")
    self.out_dir = out_dir
    self.members = {name: list(names) for name, names in members.items()}

  def algorithm_dir(self, algorithm: str) -> str:
    """The folder of ``algorithm``'s files."""
    if len(self.members) == 1:
      return self.out_dir
    return os.path.join(self.out_dir, algorithm)

  def member_dir(self, algorithm: str, member: str) -> str:
    """The folder of one member's ``history.csv|json``."""
    return history_lib.member_folder(self.algorithm_dir(algorithm), member,
                                     len(self.members[algorithm]))

  def names(self) -> list[str]:
    """Every file the run writes, relative to its folder (for the checks
    before it starts: ``history.check_output_dir``, ``check_fresh``)."""
    # Every file the run might write, even one it turns out not to (the time
    # plot of a run without a clock): each is checked before the run starts,
    # so none can later replace a user's file of that name.
    names = ["config.json", "summary.json", "curves.png", "partition.png",
             "accuracy_by_time.png"]
    for algorithm, members in self.members.items():
      if len(members) > 1:
        names.append(os.path.relpath(os.path.join(
            self.algorithm_dir(algorithm), "summary.csv"), self.out_dir))
      for member in members:
        folder = os.path.relpath(self.member_dir(algorithm, member),
                                 self.out_dir)
        names += [os.path.normpath(os.path.join(folder, f"history.{kind}"))
                  for kind in ("csv", "json")]
    return names

  def history_writer(self, algorithm: str,
                     member: str) -> history_lib.HistoryWriter:
    """A round callback keeping one member's history files current as
    the run goes (a run that stops keeps its rounds)."""
    # The rolling files say "partial"; ``finish`` rewrites them with the
    # finished history, so a file still saying so is an interrupted run's.
    return history_lib.HistoryWriter(self.member_dir(algorithm, member),
                                     {"partial": True})

  def plot_partition(self, prepared) -> str:
    """``partition.png`` of a ``prepare_data`` result."""
    return plot_partition(prepared, os.path.join(self.out_dir,
                                                 "partition.png"))

  def finish(self, experiment: spec_lib.Experiment,
             histories: Mapping[str, Mapping[str, history_lib.History]],
             dataset=None, curves: Optional[Mapping[str, Sequence[str]]]
             = None) -> dict:
    """Writes the finished histories and what sums them up.

    Args:
      experiment: the run's description (the title, the target).
      histories: algorithm -> member -> its History.
      dataset: the data the run read (a subset that stood in for it is
        noted in each history and in the title).
      curves: curve label -> the "algorithm/member" entries it averages
        (a sweep's grid points); default: one curve per algorithm.

    Returns:
      ``{"summary": curve -> summarize's entry, "paths": algorithm ->
      member -> {"csv", "json"}}``.
    """
    paths = {}
    for algorithm, members in histories.items():
      paths[algorithm] = {}
      for member, history in members.items():
        note_substitution(history, dataset)
        paths[algorithm][member] = history.save(
            self.member_dir(algorithm, member))
    if curves is None:
      curves = {algorithm: [f"{algorithm}/{member}" for member in members]
                for algorithm, members in histories.items()}
    bands, owners = {}, {}
    for label, entries in curves.items():
      pairs = [entry.split("/", 1) for entry in entries]
      bands[label] = [histories[algorithm][member]
                      for algorithm, member in pairs]
      owners[label] = {algorithm for algorithm, _ in pairs}
    # The summary is keyed by the curves' names; only the plots' legends
    # say which runs were asynchronous.
    shown = {label + report.async_tag(runs[0]): runs
             for label, runs in bands.items()}
    summary = summarize(bands, experiment.target_accuracy)
    jsonio.dump_json({"name": experiment.name, "algorithms": summary},
                     os.path.join(self.out_dir, "summary.json"))
    for algorithm, members in self.members.items():
      if len(members) > 1:  # the algorithm's own curves
        write_summary_csv(
            {label: entry for label, entry in summary.items()
             if owners[label] == {algorithm}},
            os.path.join(self.algorithm_dir(algorithm), "summary.csv"))
    title = setting_title(experiment, dataset)
    # Named by the one algorithm, else by the experiment.
    name = next(iter(histories)) if len(histories) == 1 else experiment.name
    if name:
      title = f"{name}: {title}"
    plotting.plot_mean_curves(shown, os.path.join(self.out_dir,
                                                  "curves.png"), title=title)
    # Only runs on the simulated clock have times; without one the plot would be
    # empty.
    timed = any(not np.isnan(run.column("sim_time_s")).all()
                for runs in bands.values() for run in runs)
    if timed:
      report.plot_curves(shown, "test_accuracy", "sim_time_s",
                         os.path.join(self.out_dir, "accuracy_by_time.png"),
                         title)
    return {"summary": summary, "paths": paths}


def output_names(experiment: spec_lib.Experiment,
                 algorithms: Optional[Sequence[str]] = None) -> list[str]:
  """The files ``run_config`` writes into its output folder
  (``RunFolder.names``)."""
  experiment = spec_lib.Experiment.from_dict(experiment)
  return RunFolder("", {name: [f"seed{seed}" for seed in experiment.seeds]
                        for name in algorithms or experiment.algorithms}
                   ).names()


def saved_algorithm_dir(out_dir: str, algorithm: str,
                        algorithms: Sequence[str]) -> str:
  """Where a finished run in ``out_dir`` keeps ``algorithm``'s files
  (``algorithms``: the run's algorithms, from its ``config.json``):
  ``<out_dir>/<algorithm>`` where that folder exists (several
  algorithms, or a run of one written before a single algorithm's files
  went to the top), else ``out_dir`` for a run of that one algorithm."""
  nested = os.path.join(out_dir, algorithm)
  if os.path.isdir(nested) or list(algorithms) != [algorithm]:
    return nested
  return out_dir


def refuse_held_checkpoints(root: str) -> None:
  """Refuses, before anything runs, a fresh run whose checkpoint folder
  ``root`` holds an earlier run's checkpoints (an interrupted run's):
  they are resumed or deleted by the user, never by a run (``--overwrite``
  included: the library deletes only the files it recorded)."""
  held = checkpoint.held_rounds(root)
  if held:
    # The first folder in sorted order: the same message on every run.
    folder, rounds = sorted(held.items())[0]
    raise ValueError(
        f"{folder} holds the checkpoints of an earlier run (rounds "
        f"{rounds[:5]}{' ...' if len(rounds) > 5 else ''}): resume it "
        "(--resume, resume=True), or delete that folder to start afresh "
        "(a run never deletes checkpoints, --overwrite included)")
