"""Config-driven experiments: several algorithms × seeds on one setting.

A config is a JSON-able dict::

  {
    "name": "5iid_5noniid",
    "dataset": {"name": "fashion_mnist", "source": "auto",
                "standardize": false, "max_test_examples": null},
    "partition": {"name": "mixed_iid", "num_clients": 10,
                  "args": {"num_iid": 5, "num_noniid": 5}},
    "model": {"name": "cnn_fedlayerwise", "args": {}},
    "train": {"rounds": 30, "participation": 1.0, "local_epochs": 1,
              "batch_size": 16, "learning_rate": 0.005, "momentum": 0.0,
              "stragglers": 0.0, "eval_every": 1, "eval_clients": true},
    "algorithms": {
      "FedAvg": {"aggregator": "fedavg"},
      "FedLayerWise": {"aggregator": "fedlayerwise",
                        "aggregator_args": {"alpha": 5.0}},
      "FedProx": {"aggregator": "fedavg", "objective": "fedprox",
                  "objective_args": {"mu": 0.01}}
    },
    "seeds": [0, 1, 2],
    "target_accuracy": 0.8
  }

Any "train" key can be overridden per algorithm (e.g. a different learning
rate). ``run_config`` writes ``<out>/<algorithm>/seed<k>.csv|json``,
``<out>/summary.json`` (per algorithm: final and best accuracy, rounds to
target, mean ± std over seeds) and ``<out>/curves.png``.

"train.devices" picks the devices a run shards its clients over
(``simulation.run``'s ``devices``): null = every device of the job, an int
= that many; vmapped sweeps (``sweep_algorithm``) run on one device.
"""

import argparse
import ast
import copy
import functools
import json
import os
from typing import Any, Optional

import numpy as np
import optax

from fedjax_agg import aggregators
from fedjax_agg import data as data_lib
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import plotting
from fedjax_agg import simulation
from fedjax_agg import sweep

TRAIN_DEFAULTS = {"rounds": 10, "participation": 1.0, "local_epochs": 1,
                  "batch_size": 16, "learning_rate": 0.01, "momentum": 0.0,
                  "stragglers": 0.0, "eval_every": 1, "eval_clients": True,
                  "clients_per_step": None, "compute_losses": True,
                  "devices": None}


def load_config(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def override(config: dict, dotted: dict[str, Any]) -> dict:
  """Returns a copy of ``config`` with ``{"train.rounds": 3, ...}`` set."""
  config = copy.deepcopy(config)
  for key, value in dotted.items():
    node = config
    *parents, leaf = key.split(".")
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = value
  return config


def prepare_data(config: dict, seed: int):
  """-> (FederatedData, (test_x, test_y), num_classes, input_shape, indices,
  train_y)."""
  dcfg = config["dataset"]
  ds = data_lib.load(dcfg["name"], source=dcfg.get("source", "auto"),
                     data_dir=dcfg.get("data_dir"),
                     standardize=dcfg.get("standardize", False))
  train_x, train_y = ds.train_x, ds.train_y
  if dcfg.get("max_train_examples"):
    train_x = train_x[:dcfg["max_train_examples"]]
    train_y = train_y[:dcfg["max_train_examples"]]
  test_x, test_y = ds.test_x, ds.test_y
  if dcfg.get("max_test_examples"):
    test_x = test_x[:dcfg["max_test_examples"]]
    test_y = test_y[:dcfg["max_test_examples"]]
  pcfg = config["partition"]
  partition_fn = getattr(partitions, pcfg["name"])
  seed_offset = pcfg.get("seed_offset", 0)
  indices = partition_fn(train_y, num_clients=pcfg["num_clients"],
                         seed=seed + seed_offset, **pcfg.get("args", {}))
  data = federated.from_partition(train_x, train_y, indices)
  return data, (test_x, test_y), ds.num_classes, ds.input_shape, indices, \
      train_y


def plot_partition(prepared, path: str) -> str:
  """Saves the label heatmap of a ``prepare_data`` result."""
  _, _, _, _, indices, train_y = prepared
  return partitions.plot_heatmap(indices, train_y, path)


def check_config(config: dict) -> None:
  """Raises ValueError naming the first unknown component of ``config``."""
  for key in ("dataset", "partition", "model", "algorithms"):
    if key not in config:
      raise ValueError(f"config must have a {key!r} entry")
  if config["dataset"]["name"] not in data_lib.NAMES:
    raise ValueError(f"dataset.name must be one of {data_lib.NAMES}, got "
                     f"{config['dataset']['name']!r}")
  partition = config["partition"]["name"]
  if partition not in partitions.NAMES:
    raise ValueError(f"partition.name must be one of {partitions.NAMES}, "
                     f"got {partition!r}")
  if config["model"]["name"] not in models.NAMES:
    raise ValueError(f"model.name must be one of {models.NAMES}, got "
                     f"{config['model']['name']!r}")
  unknown = set(config.get("train", {})) - set(TRAIN_DEFAULTS)
  if unknown:
    raise ValueError(f"train has unknown keys {sorted(unknown)}; expected "
                     f"some of {sorted(TRAIN_DEFAULTS)}")
  for name, spec in config["algorithms"].items():
    if spec.get("aggregator") not in aggregators.REGISTRY:
      raise ValueError(
          f"algorithms.{name}.aggregator must be one of "
          f"{sorted(aggregators.REGISTRY)}, got {spec.get('aggregator')!r}")
    if spec.get("objective", "cross_entropy") not in objectives.REGISTRY:
      raise ValueError(
          f"algorithms.{name}.objective must be one of "
          f"{sorted(objectives.REGISTRY)}, got {spec.get('objective')!r}")


def run_algorithm(config: dict, algorithm: str, seed: int,
                  prepared=None, progress: bool = False,
                  aggregator=None, checkpoint_dir: Optional[str] = None,
                  checkpoint_every: int = 0, resume: bool = False):
  """Runs one algorithm of ``config`` with one seed. -> RunResult.

  ``aggregator``, when given, replaces the one the algorithm's spec names
  (e.g. a rule built from a pre-trained state); everything else still
  comes from ``config``. ``checkpoint_dir``, ``checkpoint_every`` and
  ``resume``: see ``simulation.run``.
  """
  arguments = run_arguments(config, algorithm,
                            prepared or prepare_data(config, seed))
  built, objective = build_rule(config, algorithm,
                                arguments["data"].num_clients,
                                aggregator=aggregator)
  return simulation.run(
      aggregator=built, objective=objective, seed=seed, progress=progress,
      checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
      resume=resume, devices=_train_config(config, algorithm)["devices"],
      **arguments)


def _train_config(config: dict, algorithm: str) -> dict:
  spec = config["algorithms"][algorithm]
  return {**TRAIN_DEFAULTS, **config.get("train", {}),
          **spec.get("train", {})}


def build_rule(config: dict, algorithm: str, num_clients: int,
               hparams: Optional[dict] = None, aggregator=None):
  """The aggregator and local objective of one algorithm of ``config``.

  Args:
    config: the experiment config.
    algorithm: a key of ``config["algorithms"]``.
    num_clients: N, the federation size.
    hparams: name -> value replacing the aggregator's or the objective's
      argument of that name (a sweep's grid point; values may be traced).
      "learning_rate" is the client learning rate: it also reaches an
      aggregator that takes one (as the train config's rate does).
    aggregator: a ready aggregator to use instead of the spec's.

  Returns:
    ``(aggregator, objective)``.
  """
  spec = config["algorithms"][algorithm]
  train = _train_config(config, algorithm)
  hparams = dict(hparams or {})
  cohort = simulation.num_sampled(num_clients, train["participation"])
  agg_args = dict(spec.get("aggregator_args", {}))
  factory = aggregators.REGISTRY[spec["aggregator"]]
  for name, value in (("learning_rate", hparams.pop(
      "learning_rate", train["learning_rate"])), ("num_participants",
                                                  cohort)):
    if name in _parameters(factory) and name not in agg_args:
      agg_args[name] = value
  objective_name = spec.get("objective", "cross_entropy")
  objective_args = dict(spec.get("objective_args", {}))
  objective_factory = objectives.REGISTRY[objective_name]
  for name, value in hparams.items():
    takers = [args for args, fn in ((agg_args, factory),
                                    (objective_args, objective_factory))
              if name in _parameters(fn)]
    if not takers:
      raise ValueError(
          f"hyperparameter {name!r} is an argument neither of aggregator "
          f"{spec['aggregator']!r} nor of objective {objective_name!r}")
    for args in takers:
      args[name] = value
  if aggregator is None:
    aggregator = aggregators.get(spec["aggregator"], num_clients=num_clients,
                                 **agg_args)
  return aggregator, objectives.get(objective_name, **objective_args)


def run_arguments(config: dict, algorithm: str, prepared) -> dict:
  """``simulation.run``'s arguments for one algorithm of ``config`` on
  ``prepare_data``'s result, all but the aggregator, objective, seed,
  progress and checkpoints (also ``sweep.run_sweep``'s)."""
  train = _train_config(config, algorithm)
  data, test, num_classes, input_shape, _, _ = prepared
  mcfg = config["model"]
  model = models.get(mcfg["name"], num_classes=num_classes,
                     input_shape=input_shape, **mcfg.get("args", {}))
  local_steps_fn = None
  if train["stragglers"]:
    from fedjax_agg import stragglers  # pylint: disable=g-import-not-at-top
    local_steps_fn = stragglers.stragglers(train["stragglers"],
                                           train["local_epochs"])
  optimizer = functools.partial(optax.sgd,
                                momentum=train["momentum"] or None)
  extra = {}
  if train["clients_per_step"]:
    extra["clients_per_step"] = train["clients_per_step"]
  if not train["compute_losses"]:
    extra["compute_losses"] = False
  return dict(
      model=model, data=data, test_data=test, num_rounds=train["rounds"],
      num_classes=num_classes, participation=train["participation"],
      local_epochs=train["local_epochs"], batch_size=train["batch_size"],
      learning_rate=train["learning_rate"], client_optimizer=optimizer,
      local_steps_fn=local_steps_fn, eval_every=train["eval_every"],
      eval_clients=train["eval_clients"],
      config={"experiment": config.get("name"), "algorithm": algorithm,
              **{f"train.{k}": v for k, v in train.items()}}, **extra)


def sweep_algorithm(config: dict, algorithm: str, seeds: list[int],
                    prepared: list, grid: Optional[dict] = None,
                    progress: bool = False) -> list:
  """Runs one algorithm of ``config`` for every seed and grid point as ONE
  vmapped sweep (``sweep.run_sweep``). -> list of ``sweep.SweepMember``.

  Args:
    config, algorithm: as ``run_algorithm``.
    seeds: the members' seeds.
    prepared: ``prepare_data(config, seed)`` for each seed (the partition
      may depend on the seed).
    grid: name -> list of values of aggregator/objective arguments or
      "learning_rate" (see ``build_rule``); None: seeds only.
    progress: show a progress bar.
  """
  if len(prepared) != len(seeds):
    raise ValueError(f"prepared must hold one prepare_data result per seed "
                     f"({len(seeds)}), got {len(prepared)}")
  arguments = run_arguments(config, algorithm, prepared[0])
  num_clients = arguments["data"].num_clients
  arguments["data"] = [p[0] for p in prepared]
  return sweep.run_sweep(
      lambda hparams: build_rule(config, algorithm, num_clients, hparams),
      grid, seeds=seeds, progress=progress, **arguments)


def _parameters(factory) -> set[str]:
  import inspect  # pylint: disable=g-import-not-at-top
  return set(inspect.signature(factory).parameters)


def summarize(histories: dict[str, list], target: Optional[float],
              metric: str = "test_accuracy") -> dict:
  """Per algorithm: final/best metric and rounds to target over seeds."""
  out = {}
  for algorithm, runs in histories.items():
    finals = [h.column(metric)[-1] for h in runs]
    bests = [np.nanmax(h.column(metric)) for h in runs]
    entry = {"seeds": len(runs),
             f"final_{metric}_mean": float(np.mean(finals)),
             f"final_{metric}_std": float(np.std(finals)),
             f"best_{metric}_mean": float(np.mean(bests)),
             f"best_{metric}_std": float(np.std(bests)),
             f"final_{metric}": [float(v) for v in finals]}
    if "client_loss_mean" in runs[0].rows[-1]:
      entry["final_client_loss_mean"] = float(np.mean(
          [h.column("client_loss_mean")[-1] for h in runs]))
      entry["final_client_loss_var"] = float(np.mean(
          [h.column("client_loss_var")[-1] for h in runs]))
    if target is not None:
      reached = [simulation.rounds_to_target(h, target, metric)
                 for h in runs]
      entry["target"] = target
      entry["rounds_to_target"] = reached
      hits = [r for r in reached if r is not None]
      entry["rounds_to_target_mean"] = (float(np.mean(hits)) if hits
                                        else None)
      entry["reached_target"] = f"{len(hits)}/{len(reached)}"
    out[algorithm] = entry
  return out


def run_config(config: dict, out_dir: str, progress: bool = True,
               algorithms: Optional[list[str]] = None,
               checkpoint_every: int = 0, resume: bool = False,
               vmap_seeds: Optional[bool] = None) -> dict:
  """Runs every algorithm × seed of ``config``; writes results to
  ``out_dir``; returns the summary dict.

  ``checkpoint_every`` > 0 checkpoints each run every this many rounds in
  ``<out_dir>/checkpoints/<algorithm>/seed<k>``; ``resume`` continues the
  runs found there (a finished run is read back, not re-run).

  ``vmap_seeds`` (default: the config's ``"vmap_seeds"`` entry, else
  False) runs all seeds of an algorithm as one vmapped sweep
  (``sweep_algorithm``) instead of one run after the other: the same
  results to float tolerance, written to the same files. The sweep runs on
  one device ("train.devices" is not used).
  """
  if vmap_seeds is None:
    vmap_seeds = bool(config.get("vmap_seeds", False))
  if vmap_seeds and (checkpoint_every or resume):
    raise ValueError("vmap_seeds runs do not checkpoint: drop "
                     "checkpoint_every/resume or vmap_seeds")
  check_config(config)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
  names = algorithms or list(config["algorithms"])
  histories = {name: [] for name in names}
  for seed in [] if vmap_seeds else config.get("seeds", [0]):
    prepared = prepare_data(config, seed)
    if seed == config.get("seeds", [0])[0]:
      plot_partition(prepared, os.path.join(out_dir, "partition.png"))
    for name in names:
      checkpoint_dir = None
      if checkpoint_every or resume:
        checkpoint_dir = os.path.join(out_dir, "checkpoints", name,
                                      f"seed{seed}")
      result = run_algorithm(config, name, seed, prepared, progress,
                             checkpoint_dir=checkpoint_dir,
                             checkpoint_every=checkpoint_every,
                             resume=resume)
      result.history.save(os.path.join(out_dir, name), f"seed{seed}")
      histories[name].append(result.history)
      if progress:
        print(f"{config.get('name')} {name} seed {seed}: final acc "
              f"{result.history.rows[-1].get('test_accuracy')}", flush=True)
  if vmap_seeds:
    seeds = list(config.get("seeds", [0]))
    prepared = [prepare_data(config, seed) for seed in seeds]
    plot_partition(prepared[0], os.path.join(out_dir, "partition.png"))
    for name in names:
      for member in sweep_algorithm(config, name, seeds, prepared,
                                    progress=progress):
        member.history.save(os.path.join(out_dir, name),
                            f"seed{member.seed}")
        histories[name].append(member.history)
        if progress:
          print(f"{config.get('name')} {name} seed {member.seed} (vmapped): "
                f"final acc {member.history.rows[-1].get('test_accuracy')}",
                flush=True)
  summary = summarize(histories, config.get("target_accuracy"))
  with open(os.path.join(out_dir, "summary.json"), "w") as f:
    json.dump({"name": config.get("name"), "algorithms": summary}, f,
              indent=2)
  plotting.plot_mean_curves(histories, os.path.join(out_dir, "curves.png"),
                            title=config.get("name", ""))
  return summary


# ------------------------------------------ command line of the paper scripts


def script_parser(description: str) -> argparse.ArgumentParser:
  """The flags every ``experiments/<paper>/run.py`` shares.

  ``--config`` (a config file, cwd- or script-relative), ``--out`` (default
  ``results/<config name>`` beside the script), repeated ``--set key=value``
  overrides (values are Python literals, keys dotted as in ``override``),
  ``--full`` (run ``<name>_full.json``, the paper's scale) and
  ``--algorithms`` (a comma-separated subset), ``--vmap-seeds`` (each
  algorithm's seeds as one vmapped sweep). A script may add its own
  flags before parsing; ``script_config`` turns the parsed flags into
  what to run.
  """
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--config", required=True,
                      help="configs/<name>.json (relative to the script)")
  parser.add_argument("--out", default=None,
                      help="output folder (default results/<config name>)")
  parser.add_argument("--set", action="append", default=[],
                      help="key=value override, e.g. train.rounds=3")
  parser.add_argument("--full", action="store_true",
                      help="run the paper-scale <name>_full.json")
  parser.add_argument("--algorithms", default=None,
                      help="comma-separated subset of the algorithms")
  parser.add_argument("--vmap-seeds", action="store_true",
                      help="run each algorithm's seeds as one vmapped sweep")
  return parser


def config_path(path: str, full: bool, script_dir: str) -> str:
  """Resolves ``path`` (as given, else under ``script_dir``); with ``full``
  the ``<name>_full.json`` beside it. Raises ValueError naming --config."""
  if full and not path.endswith("_full.json"):
    path = path[:-len(".json")] + "_full.json"
  for candidate in (path, os.path.join(script_dir, path)):
    if os.path.exists(candidate):
      return candidate
  raise ValueError(f"--config: no file {path!r} (also looked in "
                   f"{script_dir})")


def parse_sets(pairs) -> dict[str, Any]:
  """["train.rounds=3", "seeds=[0]"] -> {"train.rounds": 3, "seeds": [0]}.

  Values are Python literals; anything else is kept as a string.
  """
  out = {}
  for pair in pairs or ():
    if "=" not in pair:
      raise ValueError(f"--set expects key=value, got {pair!r}")
    key, value = (part.strip() for part in pair.split("=", 1))
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def script_config(args: argparse.Namespace, script_dir: str
                  ) -> tuple[dict, str, Optional[list[str]]]:
  """-> (config with the overrides applied, output folder, algorithms or
  None for all) of flags parsed by ``script_parser``."""
  path = config_path(args.config, args.full, script_dir)
  config = override(load_config(path), parse_sets(args.set))
  if getattr(args, "vmap_seeds", False):
    config["vmap_seeds"] = True
  out_dir = args.out or os.path.join(
      script_dir, "results", os.path.splitext(os.path.basename(path))[0])
  names = args.algorithms.split(",") if args.algorithms else None
  if names:
    unknown = sorted(set(names) - set(config["algorithms"]))
    if unknown:
      raise ValueError(f"--algorithms: {unknown} not in the config's "
                       f"algorithms {sorted(config['algorithms'])}")
  return config, out_dir, names
