"""What an experiment run writes down: its description with every default
written out and its provenance (``config.json``), the check of the output
folder, the names of the files written there, a setting's title.

Part of ``fedjax_agg.experiment`` (its docstring describes the config).
"""

import dataclasses
import datetime
import importlib.metadata
import os
import platform
import sys
from typing import Optional, Sequence

from fedjax_agg import data as data_lib
from fedjax_agg import jsonio
from fedjax_agg import spec as spec_lib
from fedjax_agg.experiment._data import partition_indices
from fedjax_agg.experiment._data import partition_source
from fedjax_agg.experiment._data import substitution
from fedjax_agg.history import check_output_dir  # noqa: F401  (re-exported)


def environment() -> dict:
  """Versions of the library and its numeric stack, Python, and the JAX
  devices this process sees."""
  import jax  # pylint: disable=g-import-not-at-top
  versions = {}
  for package in ("fedjax_agg", "jax", "jaxlib", "flax", "optax", "numpy"):
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      versions[package] = None
  devices = jax.devices()
  return {"versions": versions, "python": platform.python_version(),
          "system": platform.system(),
          "devices": {"platform": devices[0].platform,
                      "kind": devices[0].device_kind, "count": len(devices),
                      "local_count": jax.local_device_count(),
                      "processes": jax.process_count()}}


def describe_data(experiment: spec_lib.Experiment, dataset: data_lib.Dataset,
                  seeds: Sequence[int],
                  indices: Optional[dict[int, Sequence]] = None) -> dict:
  """The data a run used: the source ``data.load`` read, split sizes, and
  per seed the clients' sizes.

  Args:
    experiment: the ``spec.Experiment``.
    dataset: ``load_dataset(experiment)``.
    seeds: the run's seeds (a partition may depend on the seed).
    indices: seed -> that seed's ``partition_indices``, where already
      computed (default: computed here).
  """
  clients = {}
  for seed in seeds:
    parts = (indices or {}).get(seed)
    if parts is None:
      parts = partition_indices(experiment, seed, partition_source(dataset))
    sizes = [len(part) for part in parts]
    clients[str(seed)] = {"num_clients": len(sizes),
                          "examples_min": int(min(sizes)),
                          "examples_max": int(max(sizes)),
                          "examples_total": int(sum(sizes))}
  source = getattr(dataset, "source", None)
  described = {"name": dataset.name, "source": source,
               "subset": source in spec_lib.SUBSET_SOURCES,
               "train_examples": int(len(dataset.train_y)),
               "test_examples": int(len(dataset.test_y)),
               "num_classes": int(dataset.num_classes),
               "input_shape": list(dataset.input_shape),
               "clients_by_seed": clients}
  if isinstance(dataset, data_lib.NaturalFederation):
    # Where the federation came from and what its clients hold.
    described["source"] = dataset.provenance.get("source", dataset.name)
    described["federation"] = dataset.provenance
    described["summary"] = {
        key: value for key, value in data_lib.federation_summary(
            dataset).items() if key != "targets"}
  return described


def shown_path(path: str) -> str:
  """``path`` as a record shows it: relative to the repository holding
  this package when inside it (results committed with the code carry no
  machine's paths), else as given."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  full = os.path.abspath(path)
  if os.path.commonpath([root, full]) == root:
    return os.path.relpath(full, root)
  return path


def run_record(experiment: spec_lib.Experiment,
               dataset: Optional[data_lib.Dataset] = None,
               indices: Optional[dict[int, Sequence]] = None,
               algorithms: Optional[Sequence[str]] = None,
               execution: Optional[dict] = None,
               command: Optional[Sequence[str]] = None) -> dict:
  """What ``config.json`` holds: the description with every default
  written out (``spec.Experiment.to_dict``) plus a "provenance" entry
  (the data used, every algorithm's full aggregator and objective
  arguments, how it was executed, versions, devices and the command
  line).

  Args:
    experiment: the ``spec.Experiment`` (or a JSON config).
    dataset: ``load_dataset(experiment)`` (None: no data entry).
    indices: see ``describe_data``.
    algorithms: the algorithms run (default: all of them).
    execution: settings that are not config keys (checkpoints, devices,
      output folder, ...).
    command: the command line (default ``sys.argv``).
  """
  experiment = spec_lib.Experiment.from_dict(experiment)
  resolved = experiment.to_dict()
  rules = {}
  for name in algorithms or list(experiment.algorithms):
    aggregator_args, objective_args = experiment.rule_arguments(name)
    rules[name] = {"aggregator": experiment.algorithms[name].aggregator,
                   "aggregator_args": aggregator_args,
                   "objective": experiment.algorithms[name].objective,
                   "objective_args": objective_args,
                   "train": dataclasses.asdict(experiment.train_of(name))}
    privacy = experiment.privacy_of(name)
    if privacy is not None:
      rules[name]["privacy"] = dataclasses.asdict(privacy)
  resolved["provenance"] = {
      "data": (None if dataset is None else
               describe_data(experiment, dataset, experiment.seeds,
                             indices)),
      "algorithms": rules,
      "execution": dict(execution or {}),
      "environment": environment(),
      "command": list(sys.argv if command is None else command),
      "written": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }
  return resolved


def write_run_config(directory: str, experiment: spec_lib.Experiment,
                     **record_args) -> str:
  """Writes ``run_record(experiment, **record_args)`` to
  ``<directory>/config.json``. Returns its path."""
  return jsonio.dump_json(run_record(experiment, **record_args),
                          os.path.join(directory, "config.json"))


def setting_title(experiment: spec_lib.Experiment, dataset=None) -> str:
  """One line naming an experiment's setting (for plot titles:
  ``spec.Experiment.setting``); with ``dataset`` (the loaded data),
  "[subset: SOURCE]" where a subset stood in for it."""
  experiment = spec_lib.Experiment.from_dict(experiment)
  tag = (f" [subset: {dataset.source}]" if substitution(dataset) is not None
         else "")
  return experiment.setting() + tag
