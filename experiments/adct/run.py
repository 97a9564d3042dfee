"""Re-runs ADCT's tables: the (gamma, s) ablation and the F1 comparison.

Putra, Utama, Utami, Putra, "Enhancing Federated Learning Performance through
Adaptive Client Optimization with Hyperparameter Tuning", JADS 5(2), 2024,
Tables 2, 3 and 5.

  python experiments/adct/run.py --config configs/table5_mnist.json
  python experiments/adct/run.py --config configs/grid_mnist.json --resume
  python experiments/adct/run.py --config configs/table5_fmnist.json --full

A config is ``experiment``'s format (see ``fedjax_agg/experiment/``) with
three differences, since ADCT and FedACS are not plain registry rules:

* an algorithm may hold ``"adct": {accuracy_threshold, search_step, ...}``
  (ADCT's client side, ``clients.adct``, driven by
  ``drivers.run_adct``; its ``aggregator`` is the server rule),
  or name ``"aggregator": "fedacs"`` (``aggregators.fedacs``, whose
  server evaluation set is the union of the clients' held-out parts);
* ``train.client_optimizer`` is "adam" or "sgd" (the paper's learning rates,
  1e-5 to 1e-3, are Adam's scale);
* ``train.measure_on`` "server" measures ADCT's accuracies on a
  class-balanced set of ``server_per_class`` examples per class drawn from
  the clients' held-out parts and held by the server, instead of each
  client's own held-out part ("validation");
* every client keeps ``train.validation_fraction`` of its examples apart
  (``validation.holdout_split``, seed ``split_seed``) and EVERY algorithm
  trains on the remaining part only, so all see the same training examples;
  ADCT measures its accuracies, and FedACS its selection, on the held-out
  parts.

Every run is built by ``experiment.build`` from ``spec_config(config)``,
the config in experiment's format (ADCT's own keys kept by this script);
``config.json`` in the output folder is the config as run, with that
experiment config (every default written out, and its provenance) under
"experiment_config".

Writes each algorithm's histories in the one layout of
``fedjax_agg.history``: ``<out>/<algorithm>/seed<k>/history.csv|json`` and
``<out>/<algorithm>/summary.csv`` (that algorithm's ``summary.json`` entry),
or ``<out>/<algorithm>/history.csv|json`` for one seed; ``summary.json``
(final/best test accuracy and macro-F1, rounds to target, mean ± std over
seeds), ``curves.png``, ``partition.png`` and, for every
ADCT algorithm, ``adct_choices.json`` (per client: how often each
(learning rate, epochs) was kept, how often it searched). ``--resume``
reuses an algorithm × seed whose saved run has the same settings.
"""

import argparse
import collections
import dataclasses
import json
import os
import re
import sys

import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

# pylint: disable=wrong-import-position
from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import config as config_lib
from fedjax_agg import experiment
from fedjax_agg import jsonio
from fedjax_agg import plotting
from fedjax_agg import simulation
from fedjax_agg import spec as spec_lib
from fedjax_agg import validation
from fedjax_agg import history as history_lib
from fedjax_agg import drivers
# pylint: enable=wrong-import-position

TRAIN_DEFAULTS = {"rounds": 50, "participation": 1.0, "local_epochs": 1,
                  "batch_size": 32, "learning_rate": 1e-3,
                  "client_optimizer": "adam", "validation_fraction": 0.2,
                  "split_seed": 0, "clients_per_step": 20, "eval_every": 1,
                  "measure_on": "validation", "server_per_class": 20}
MEASURE_ON = ("validation", "server")
OPTIMIZERS = config_lib.OPTIMIZERS
# The train keys of ADCT's own (the experiment format has no such concept);
# client_optimizer is the format's "optimizer".
SCRIPT_TRAIN_KEYS = ("validation_fraction", "split_seed", "measure_on",
                     "server_per_class")
METRICS = ("test_accuracy", "test_macro_f1")
TAIL = 5  # rounds averaged for the last-rounds metrics


def check(config: dict) -> None:
  """Raises ValueError naming the first bad entry of ``config``."""
  unknown = set(config.get("train", {})) - set(TRAIN_DEFAULTS)
  if unknown:
    raise ValueError(f"train has unknown keys {sorted(unknown)}; expected "
                     f"some of {sorted(TRAIN_DEFAULTS)}")
  for name, spec in config["algorithms"].items():
    agg = spec.get("aggregator", "fedavg")
    if agg != "fedacs" and agg not in aggregators.REGISTRY:
      raise ValueError(f"algorithms.{name}.aggregator must be 'fedacs' or one"
                       f" of {sorted(aggregators.REGISTRY)}, got {agg!r}")
    train = {**TRAIN_DEFAULTS, **config.get("train", {}),
             **spec.get("train", {})}
    opt = train["client_optimizer"]
    if train["measure_on"] not in MEASURE_ON:
      raise ValueError(f"algorithms.{name}: measure_on must be one of "
                       f"{MEASURE_ON}, got {train['measure_on']!r}")
    if opt not in OPTIMIZERS:
      raise ValueError(f"client_optimizer must be one of {sorted(OPTIMIZERS)}"
                       f", got {opt!r}")


def _spec_train(train: dict) -> dict:
  """ADCT's train keys as the experiment format's."""
  return {("optimizer" if key == "client_optimizer" else key): value
          for key, value in train.items() if key not in SCRIPT_TRAIN_KEYS}


def spec_config(config: dict) -> dict:
  """``config`` (ADCT's format) as an experiment config, which every run
  is built from (``experiment.build``): ADCT's own keys left out (the
  ``adct`` blocks and ``SCRIPT_TRAIN_KEYS``; also what else a record
  holds, e.g. "environment"), ``client_optimizer`` as "optimizer",
  ADCT's train defaults written out. The global model's loss on every
  client's data is computed for the ADCT runs only, before the first and
  after the last round (as the committed runs were)."""
  spec = {key: value for key, value in config.items()
          if key in spec_lib.keys(spec_lib.Experiment)
          and key not in ("train", "algorithms", "provenance")}
  spec["train"] = {**_spec_train({**TRAIN_DEFAULTS,
                                  **config.get("train", {})}),
                   "eval_clients": False}
  spec["algorithms"] = {}
  for name, entry in config["algorithms"].items():
    algorithm = {key: value for key, value in entry.items()
                 if key not in ("adct", "train")}
    algorithm.setdefault("aggregator", "fedavg")
    train = _spec_train(entry.get("train", {}))
    if "adct" in entry:
      train["eval_clients"] = "auto"
    if train:
      algorithm["train"] = train
    spec["algorithms"][name] = algorithm
  return spec


def _held_out(val_data) -> np.ndarray:
  """The pooled data's indices of every client's held-out examples."""
  return np.concatenate([
      np.asarray(val_data.client_indices[i, :n])
      for i, n in enumerate(np.asarray(val_data.num_examples))])


def run_one(config: dict, name: str, seed: int, prepared):
  """One algorithm × seed. -> ``RunResult`` (``ADCTRunResult`` for ADCT)."""
  spec = config["algorithms"][name]
  train = {**TRAIN_DEFAULTS, **config.get("train", {}),
           **spec.get("train", {})}
  data = prepared[0]
  train_data, val_data = validation.holdout_split(
      data, train["validation_fraction"], train["split_seed"])
  record = {"experiment": config.get("name"), "algorithm": name,
            "spec": spec, **{f"train.{k}": v for k, v in train.items()}}
  agg_name = spec.get("aggregator", "fedavg")
  adct = "adct" in spec
  # Every algorithm trains on the clients' training parts only; ADCT
  # measuring on "validation" splits them itself (drivers.ADCTMeasure,
  # the same fraction and seed).
  run_data = data if adct and train["measure_on"] == "validation" else (
      train_data)
  # FedACS's rule needs the run's network: it is built once build has it.
  built = experiment.build(
      spec_config(config), name, (run_data,) + tuple(prepared[1:]),
      aggregator=aggregators.fedavg() if agg_name == "fedacs" else None)
  if agg_name == "fedacs":
    pooled = _held_out(val_data)
    built = built._replace(aggregator=aggregators.fedacs(
        built.model, np.asarray(data.x)[pooled], np.asarray(data.y)[pooled],
        **spec.get("aggregator_args", {})))
  training = built.options.training
  if train["client_optimizer"] == "adam":
    # optax.adam itself, as the committed runs: the engine injects every
    # numeric argument of the factory (optax.inject_hyperparams), so
    # optax.adam carries b1, b2 and eps as float32 state where the
    # format's client_optimizer("adam") keeps them Python constants, which
    # rounds differently (about 1e-6 relative after one round). (SGD's
    # factories inject the learning rate alone: bit for bit the same.)
    training = dataclasses.replace(training, optimizer=optax.adam)
  # The history records ADCT's own settings too (``--resume`` compares
  # them).
  options = built.options.replace(training=training, config={
      **built.options.config, **record})
  if not adct:
    return simulation.run(*built[:4], options, seed=seed)
  # ADCT's client side trains with the run's batch size, optimizer and
  # objective (its grid sets learning rate and epochs).
  tuner = clients.adct(
      built.model, batch_size=training.batch_size,
      client_optimizer=training.optimizer, objective=training.objective,
      clients_per_step=options.execution.clients_per_step, **spec["adct"])
  measure = drivers.ADCTMeasure(
      validation_fraction=train["validation_fraction"],
      split_seed=train["split_seed"])
  if train["measure_on"] == "server":
    # A class-balanced set drawn from the clients' held-out parts (which
    # nobody trains on), held by the server; ADCT trains on the same
    # training parts as the other algorithms.
    held = _held_out(val_data)
    y_all = np.asarray(data.y)
    picked = held[validation.balanced_indices(
        y_all[held], train["server_per_class"], seed=train["split_seed"])]
    measure = drivers.ADCTMeasure("server", server_validation=(
        np.asarray(data.x)[picked], y_all[picked]))
  return drivers.run_adct(*built[:4], tuner, options, measure=measure,
                          seed=seed)


def load_saved(path: str, config: dict, name: str, seed: int):
  """The saved History at ``path`` if it was run with these settings."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    saved = json.load(f)
  spec = config["algorithms"][name]
  train = {**TRAIN_DEFAULTS, **config.get("train", {}),
           **spec.get("train", {})}
  want = json.loads(json.dumps(
      {"spec": spec, **{f"train.{k}": v for k, v in train.items()}}))
  same = all(saved["config"].get(k) == v for k, v in want.items())
  same = same and saved["config"].get("seed") == seed
  if not same:
    return None
  return history_lib.History(saved["rows"], saved["clients"], saved["config"])


def adct_choices(history) -> dict:
  """Per client: kept (learning rate, epochs) counts, searches, last pick."""
  kept = collections.defaultdict(collections.Counter)
  searched = collections.Counter()
  last = {}
  for row in history.client_rows:
    for cid, lr, ep, s in zip(*(np.asarray(row[k]).tolist() for k in (
        "client_ids", "adct_learning_rate", "adct_local_epochs",
        "adct_searched")), strict=True):
      pick = f"lr={lr:.0e},epochs={int(ep)}"
      kept[int(cid)][pick] += 1
      searched[int(cid)] += int(bool(s))
      last[int(cid)] = pick
  return {str(c): {"kept": dict(sorted(kept[c].items())),
                   "rounds_searched": searched[c], "last": last[c]}
          for c in sorted(kept)}


def summarize(histories: dict, target, tail: int = TAIL) -> dict:
  """experiment.summarize for accuracy (with rounds to target) and F1, plus
  each metric's mean over the last ``tail`` rounds (mean ± std over seeds):
  with one class per client the global model swings from round to round."""
  acc = experiment.summarize(histories, target, "test_accuracy")
  f1 = experiment.summarize(histories, None, "test_macro_f1")
  out = {}
  for name, runs in histories.items():
    out[name] = {**acc[name], **{k: v for k, v in f1[name].items()
                                 if k != "seeds"}}
    for metric in METRICS:
      means = [np.nanmean(h.column(metric)[-tail:]) for h in runs]
      out[name][f"last{tail}_{metric}_mean"] = float(np.mean(means))
      out[name][f"last{tail}_{metric}_std"] = float(np.std(means))
  return out


def run_config(config: dict, out_dir: str, resume: bool = False,
               names=None) -> dict:
  """Runs every algorithm × seed; writes results; returns the summary."""
  check(config)
  names = names or list(config["algorithms"])
  unknown = [n for n in names if n not in config["algorithms"]]
  if unknown:
    raise ValueError(f"algorithms {unknown} are not in the config's "
                     f"{sorted(config['algorithms'])}")
  # The config as run: only the algorithms asked for.
  config = {**config, "algorithms": {n: config["algorithms"][n]
                                     for n in names}}
  setting = experiment.check_config(spec_config(config))
  os.makedirs(out_dir, exist_ok=True)
  dataset = experiment.load_dataset(setting)
  # The config as run (ADCT's format, runnable again), with the
  # experiment config every run is built from, every default written out,
  # and its provenance (data, rule arguments, versions, command).
  jsonio.dump_json({**config, "experiment_config": experiment.run_record(
      setting, dataset=dataset,
      execution={"out": experiment.shown_path(out_dir)},
      command=[experiment.shown_path(sys.argv[0])] + sys.argv[1:])},
                   os.path.join(out_dir, "config.json"))
  histories = {name: [] for name in names}
  seeds = config.get("seeds", [0])
  for seed in seeds:
    prepared = experiment.prepare_data(setting, seed, dataset)
    if seed == seeds[0]:
      experiment.plot_partition(prepared,
                                os.path.join(out_dir, "partition.png"))
    for name in names:
      folder = history_lib.member_folder(os.path.join(out_dir, name),
                                         f"seed{seed}", len(seeds))
      path = os.path.join(folder, "history.json")
      history = load_saved(path, config, name, seed) if resume else None
      if history is None:
        history = run_one(config, name, seed, prepared).history
        history.save(folder)
      histories[name].append(history)
      print(f"{config.get('name')} {name} seed {seed}: final acc "
            f"{history.rows[-1]['test_accuracy']:.4f} F1 "
            f"{history.rows[-1]['test_macro_f1']:.4f}", flush=True)
  summary = summarize(histories, config.get("target_accuracy"))
  jsonio.dump_json({"name": config.get("name"), "algorithms": summary},
                   os.path.join(out_dir, "summary.json"))
  if len(seeds) > 1:
    for name in names:
      experiment.write_summary_csv({name: summary[name]},
                                   os.path.join(out_dir, name, "summary.csv"))
  choices = {name: adct_choices(runs[0]) for name, runs in histories.items()
             if "adct" in config["algorithms"][name]}
  if choices:
    jsonio.dump_json({"seed": seeds[0], "algorithms": choices},
                     os.path.join(out_dir, "adct_choices.json"))
  plotting.plot_mean_curves(histories, os.path.join(out_dir, "curves.png"),
                            metrics=METRICS, title=config.get("name", ""))
  return summary


def main(argv=None) -> None:
  parser = experiment.script_parser(__doc__.splitlines()[0])
  parser.add_argument("--resume", action="store_true",
                      help="reuse saved runs with the same settings")
  args = parser.parse_args(argv)
  # Names hold commas ("ADCT(50,5)"): split only outside parentheses.
  names = (re.split(r",(?![^(]*\))", args.algorithms) if args.algorithms
           else None)
  config, out_dir, _ = experiment.script_config(
      argparse.Namespace(**{**vars(args), "algorithms": None}), HERE)
  summary = run_config(config, out_dir, args.resume, names)
  for name, entry in summary.items():
    line = (f"{name:>14}: acc {entry['final_test_accuracy_mean']:.4f} ± "
            f"{entry['final_test_accuracy_std']:.4f}, F1 "
            f"{entry['final_test_macro_f1_mean']:.4f} ± "
            f"{entry['final_test_macro_f1_std']:.4f}")
    if "rounds_to_target" in entry:
      line += (f", rounds to {entry['target']:.0%}: "
               f"{entry['rounds_to_target']}")
    print(line, flush=True)


if __name__ == "__main__":
  main()
