"""Robust aggregation under attack, and DP-FedAvg's accuracy against epsilon.

  python experiments/robustness/run.py                    # the committed run
  python experiments/robustness/run.py --rounds 3 --out /tmp/r --quick

Fashion-MNIST (the full 60k/10k), 100 clients (IID), 10 of them per
round, mlp2, one local epoch of SGD (batch 32, lr 0.05). Every attack of
``ATTACKS`` at 10 / 20 / 30 % malicious clients of each round's cohort
(1 / 2 / 3 of 10, ``attacks.per_round``), plus the clean run, against
every rule of ``RULES``; the seeds of one (rule, attack, fraction) run side
by side as one vmapped sweep, one seed per CPU core. Then DP-FedAvg
(clip 1) at the noise multipliers of ``--noise``, with epsilon at delta =
1e-5 for the cohorts drawn.

Writes ``<out>/attacks.csv`` (one row per rule, attack, fraction, seed:
final test accuracy), ``<out>/attacks_table.md`` (mean ± sd over seeds),
``<out>/round_cost.csv`` (median seconds per round of each rule, clean,
both seeds together), ``<out>/dp.csv``, ``<out>/config_attacks.json`` and
``<out>/config_dp.json`` (every setting, the data source and the command
of the part that wrote them) and ``<out>/attacks.png``, ``<out>/dp.png``.
"""

import argparse
import json
import os
import sys

import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fedjax_agg import distributed  # pylint: disable=wrong-import-position
distributed.use_all_cores()  # before JAX starts: one device per core

import matplotlib  # pylint: disable=wrong-import-position
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from fedjax_agg import aggregators  # pylint: disable=wrong-import-position
from fedjax_agg import attacks  # pylint: disable=wrong-import-position
from fedjax_agg import data as data_lib  # pylint: disable=wrong-import-position
from fedjax_agg import experiment  # pylint: disable=wrong-import-position
from fedjax_agg import federated  # pylint: disable=wrong-import-position
from fedjax_agg import jsonio  # pylint: disable=wrong-import-position
from fedjax_agg import loop  # pylint: disable=wrong-import-position
from fedjax_agg import models  # pylint: disable=wrong-import-position
from fedjax_agg import partitions  # pylint: disable=wrong-import-position
from fedjax_agg import privacy as privacy_lib  # pylint: disable=wrong-import-position
from fedjax_agg import simulation  # pylint: disable=wrong-import-position
from fedjax_agg import sweep  # pylint: disable=wrong-import-position
from fedjax_agg.config import (Evaluation, Execution,  # pylint: disable=wrong-import-position
                               LocalTraining, Privacy)

NUM_CLIENTS = 100
# name -> (factory name, arguments); f = 3 = 30 % of a cohort of 10.
RULES = {
    "fedavg": ("fedavg", {}),
    "median": ("fedmedian", {}),
    "trimmed_mean": ("trimmed_mean", {"beta": 0.3}),
    "multi_krum": ("krum", {"num_byzantine": 3, "num_selected": 5}),
    "geometric_median": ("geometric_median", {}),
    "centered_clipping": ("centered_clipping", {"radius": 1.0,
                                                "num_iterations": 3}),
    "norm_bounding": ("norm_bounding", {"max_norm": 1.0}),
    "fedadp": ("fedadp", {}),
    "fedlayerwise": ("fedlayerwise", {}),
    # K = 10 >= 4 f + 3 allows f = 1 only.
    "bulyan": ("bulyan", {"num_byzantine": 1}),
}
# The defences measured against the backdoor, and its conditions: clean,
# the backdoor as trained, and with model replacement (gamma = 10 = the
# cohort size, Bagdasaryan et al.'s n / eta with eta = 1).
BACKDOOR_RULES = {
    "fedavg": ("fedavg", {}),
    "median": ("fedmedian", {}),
    "multi_krum": ("krum", {"num_byzantine": 3, "num_selected": 5}),
    "bulyan": ("bulyan", {"num_byzantine": 1}),
    "norm_bounding": ("norm_bounding", {"max_norm": 1.0}),
    "dp_fedavg": ("dp_fedavg", {"clip_norm": 1.0, "noise_multiplier": 0.1}),
}
BACKDOOR = {"target": 0, "poison_fraction": 0.5, "trigger_size": 3}
BOOSTS = (1.0, 10.0)
PARTITIONS = {"iid": {}, "dirichlet_0.3": {"alpha": 0.3}}
ATTACKS = {
    "label_flip": {},
    "sign_flip": {"scale": 4.0},
    "gaussian": {"stddev": 0.3},
    "little_is_enough": {},
    "inner_product": {"epsilon": 0.5},
}
DEFAULT_ATTACKS = ("label_flip", "sign_flip", "little_is_enough",
                   "inner_product")
FRACTIONS = (0.1, 0.2, 0.3)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
  parser.add_argument("--rules", nargs="+", default=list(RULES),
                      choices=list(RULES))
  parser.add_argument("--attacks", nargs="+", default=list(DEFAULT_ATTACKS),
                      choices=list(ATTACKS))
  parser.add_argument("--fractions", type=float, nargs="+",
                      default=list(FRACTIONS))
  parser.add_argument("--noise", type=float, nargs="+",
                      default=[0.0, 0.1, 0.3, 1.0])
  parser.add_argument("--skip-dp", action="store_true")
  parser.add_argument("--backdoor", action="store_true",
                      help="run the backdoor study (only)")
  parser.add_argument("--dp-ftrl", action="store_true",
                      help="run DP-FTRL at the epsilons of DP-FedAvg's "
                      "--noise runs (only)")
  parser.add_argument("--skip-attacks", action="store_true")
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  args = parser.parse_args(argv)
  # Recorded relative to the repository when inside it (no machine paths).
  shown_out = experiment.shown_path(args.out)
  os.makedirs(args.out, exist_ok=True)

  dataset = data_lib.load("fashion_mnist")
  parts = partitions.REGISTRY.build("iid", labels=dataset.train_y,
                                    num_clients=NUM_CLIENTS, seed=0)
  data = federated.from_partition(dataset.train_x, dataset.train_y, parts)
  test = (dataset.test_x, dataset.test_y)
  model = models.get("mlp2")
  training = LocalTraining(epochs=1, batch_size=32, learning_rate=0.05,
                           optimizer=optax.sgd, compute_losses=False)
  participation = 0.1
  execution = Execution(progress=False)
  evaluation = Evaluation(every=args.rounds, clients=False)
  record = {
      "dataset": "fashion_mnist", "data_source": dataset.source,
      "train_examples": int(dataset.train_x.shape[0]),
      "test_examples": int(dataset.test_x.shape[0]),
      "partition": "iid", "num_clients": NUM_CLIENTS,
      "participation": participation, "model": "mlp2",
      "training": {"epochs": 1, "batch_size": 32, "learning_rate": 0.05,
                   "optimizer": "sgd"},
      "rules": {name: RULES[name] for name in args.rules},
      "attacks": {name: ATTACKS[name] for name in args.attacks},
      "adversaries": "per_round",
      "command": [experiment.shown_path(sys.argv[0])] + sys.argv[1:],
      "args": {**vars(args), "out": shown_out}}
  if args.dp_ftrl:
    jsonio.dump_json(record, os.path.join(args.out, "config_dp_ftrl.json"))
    run_dp_ftrl(args, model, data, test, training, participation,
                execution, evaluation)
    return
  if args.backdoor:
    jsonio.dump_json({**record, "backdoor": BACKDOOR, "boosts": BOOSTS,
                      "backdoor_rules": BACKDOOR_RULES,
                      "partitions": PARTITIONS, "partition_seed": 0},
                     os.path.join(args.out, "config_backdoor.json"))
    run_backdoor(args, dataset, model, training, participation, execution)
    return
  if not args.skip_attacks:
    jsonio.dump_json(_merged_record(record, os.path.join(
        args.out, "config_attacks.json")), os.path.join(
            args.out, "config_attacks.json"))
    run_attacks(args, model, data, test, training, participation,
                execution, evaluation)
  if not args.skip_dp:
    jsonio.dump_json(record, os.path.join(args.out, "config_dp.json"))
    run_dp(args, model, data, test, training, participation, execution,
           evaluation)


def run_attacks(args, model, data, test, training, participation,
                execution, evaluation):
  conditions = [("none", 0.0)] + [(a, f) for a in args.attacks
                                   for f in args.fractions]
  # Rows of rules not run now stay (a run with --rules adds its rows).
  lines = _kept_rows(os.path.join(args.out, "attacks.csv"), args.rules,
                     "rule,attack,fraction,seed,test_accuracy")
  costs = _kept_rows(os.path.join(args.out, "round_cost.csv"), args.rules,
                     "rule,median_round_s")
  for rule_name in args.rules:
    factory, kwargs = RULES[rule_name]
    rule = aggregators.get(factory, num_clients=NUM_CLIENTS, **kwargs)
    for attack_name, fraction in conditions:
      update = None
      if attack_name != "none":
        update = attacks.local_update(
            model, training, attacks.build(attack_name,
                                           **ATTACKS[attack_name]),
            attacks.per_round(fraction), execution=execution)
      members = sweep.run_sweep(
          lambda hparams, rule=rule: rule, seeds=args.seeds, model=model,
          data=data, test_data=test, num_rounds=args.rounds,
          participation=participation, training=training,
          execution=execution, evaluation=evaluation,
          local_update=update)
      for member in members:
        accuracy = member.history.rows[-1]["test_accuracy"]
        lines.append(f"{rule_name},{attack_name},{fraction},{member.seed},"
                     f"{accuracy}")
        print(json.dumps({"rule": rule_name, "attack": attack_name,
                          "fraction": fraction, "seed": member.seed,
                          "test_accuracy": accuracy}), flush=True)
      if attack_name == "none":
        times = [row["time_s"] for row in members[0].history.rows[2:]]
        costs.append(f"{rule_name},{float(np.median(times))}")
      jsonio.write_text(os.path.join(args.out, "attacks.csv"),
                        "\n".join(lines) + "\n")
  jsonio.write_text(os.path.join(args.out, "round_cost.csv"),
                    "\n".join(costs) + "\n")
  table_and_plot(args)


def _merged_record(record, path):
  """``record`` with the rules and commands of an earlier record at
  ``path`` kept (a run with --rules adds to the committed table)."""
  if not os.path.exists(path):
    return record
  with open(path) as f:
    previous = json.load(f)
  earlier = previous.get("commands", [previous.get("command")])
  return {**record, "rules": {**previous.get("rules", {}),
                              **record["rules"]},
          "commands": earlier + [record["command"]]}


def _kept_rows(path, rules, header):
  """The header and the rows of ``path`` whose first field is not one of
  ``rules``."""
  if not os.path.exists(path):
    return [header]
  with open(path) as f:
    rows = f.read().splitlines()
  return [header] + [r for r in rows[1:] if r.split(",")[0] not in rules]


def run_backdoor(args, dataset, model, training, participation, execution):
  """Attack success and clean accuracy of the backdoor against each
  defence, on IID and Dirichlet(0.3) label-skewed clients."""
  test = (dataset.test_x, dataset.test_y)
  eval_set = attacks.backdoor_eval_set(*test, **BACKDOOR)
  evaluation = Evaluation(every=args.rounds, clients=False,
                          extra=(eval_set,))
  lines = ["partition,rule,boost,seed,test_accuracy,attack_success"]
  for partition, partition_args in PARTITIONS.items():
    parts = partitions.REGISTRY.build(
        partition.split("_")[0], labels=dataset.train_y,
        num_clients=NUM_CLIENTS, seed=0, **partition_args)
    data = federated.from_partition(dataset.train_x, dataset.train_y, parts)
    for rule_name, (factory, kwargs) in BACKDOOR_RULES.items():
      rule = aggregators.get(factory, num_clients=NUM_CLIENTS, **kwargs)
      for boost in (0.0,) + BOOSTS:  # 0: the clean run
        update = None if boost == 0 else attacks.local_update(
            model, training, attacks.backdoor(**BACKDOOR, boost=boost),
            attacks.per_round(0.1), execution=execution)
        members = sweep.run_sweep(
            lambda hparams, rule=rule: rule, seeds=args.seeds, model=model,
            data=data, test_data=test, num_rounds=args.rounds,
            participation=participation, training=training,
            execution=execution, evaluation=evaluation, local_update=update)
        for member in members:
          last = member.history.rows[-1]
          lines.append(f"{partition},{rule_name},{boost},{member.seed},"
                       f"{last['test_accuracy']},{last['attack_success']}")
          print(lines[-1], flush=True)
        jsonio.write_text(os.path.join(args.out, "backdoor.csv"),
                          "\n".join(lines) + "\n")
  backdoor_table(args)


def backdoor_table(args):
  import pandas as pd  # pylint: disable=import-outside-toplevel
  frame = pd.read_csv(os.path.join(args.out, "backdoor.csv"))
  stats = frame.groupby(["partition", "rule", "boost"]).agg(
      acc=("test_accuracy", "mean"), acc_sd=("test_accuracy", "std"),
      success=("attack_success", "mean"),
      success_sd=("attack_success", "std")).reset_index()
  header = ["partition", "rule", "clean: acc. / success"] + [
      f"backdoor gamma={b:g}: acc. / success" for b in BOOSTS]
  rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for partition in PARTITIONS:
    for rule in BACKDOOR_RULES:
      cells = [partition, rule]
      for boost in (0.0,) + BOOSTS:
        hit = stats[(stats.partition == partition) & (stats.rule == rule)
                    & np.isclose(stats.boost, boost)]
        cells.append(
            f"{hit.acc.iloc[0]:.3f} ± {hit.acc_sd.iloc[0]:.3f} / "
            f"{hit.success.iloc[0]:.3f} ± {hit.success_sd.iloc[0]:.3f}"
            if len(hit) else "")
      rows.append("| " + " | ".join(cells) + " |")
  jsonio.write_text(os.path.join(args.out, "backdoor_table.md"),
                    "\n".join(rows) + "\n")


def table_and_plot(args):
  import pandas as pd  # pylint: disable=import-outside-toplevel
  frame = pd.read_csv(os.path.join(args.out, "attacks.csv"))
  stats = frame.groupby(["rule", "attack", "fraction"])[
      "test_accuracy"].agg(["mean", "std"]).reset_index()
  clean = stats[stats.attack == "none"].set_index("rule")
  rules = [rule for rule in RULES if rule in set(frame.rule)]
  header = ["rule", "clean"] + [f"{a} {int(f * 100)}%" for a in args.attacks
                                for f in args.fractions]
  rows = ["| " + " | ".join(header) + " |",
          "|" + "---|" * len(header)]
  for rule in rules:
    cells = [rule, f"{clean.loc[rule, 'mean']:.3f} ± "
                   f"{clean.loc[rule, 'std']:.3f}"]
    for attack in args.attacks:
      for fraction in args.fractions:
        hit = stats[(stats.rule == rule) & (stats.attack == attack)
                    & np.isclose(stats.fraction, fraction)]
        cells.append(f"{hit['mean'].iloc[0]:.3f} ± {hit['std'].iloc[0]:.3f}"
                     if len(hit) else "")
    rows.append("| " + " | ".join(cells) + " |")
  jsonio.write_text(os.path.join(args.out, "attacks_table.md"),
                    "\n".join(rows) + "\n")
  fig, axes = plt.subplots(1, len(args.attacks),
                           figsize=(3.2 * len(args.attacks), 3.2),
                           sharey=True, squeeze=False)
  for ax, attack in zip(axes[0], args.attacks, strict=True):
    for rule in rules:
      xs = [0.0] + list(args.fractions)
      ys = [clean.loc[rule, "mean"]] + [
          stats[(stats.rule == rule) & (stats.attack == attack)
                & np.isclose(stats.fraction, f)]["mean"].iloc[0]
          for f in args.fractions]
      ax.plot([100 * x for x in xs], ys, marker="o", label=rule)
    ax.set_title(attack)
    ax.set_xlabel("malicious clients (%)")
  axes[0][0].set_ylabel("final test accuracy")
  axes[0][-1].legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "attacks.png"), dpi=120)


def matched_tree_noise(epsilon, cohorts, delta):
  """The smallest z (to 0.1 %) whose tree epsilon after all of
  ``cohorts``' rounds is at most ``epsilon``."""
  low, high = 0.01, 1000.0
  while high / low > 1.001:
    mid = (low * high) ** 0.5
    spent = privacy_lib.tree_epsilons(mid, cohorts, delta=delta)[-1]
    low, high = (mid, high) if spent > epsilon else (low, mid)
  return high


def run_dp_ftrl(args, model, data, test, training, participation,
                execution, evaluation):
  """DP-FTRL (tree noise, no amplification by sampling) at the final
  epsilon of each DP-FedAvg noise level of ``--noise``, per seed: z is
  chosen so that the seed's own cohorts spend that epsilon."""
  cohort_size = max(int(participation * NUM_CLIENTS), 1)
  lines = ["fedavg_noise_multiplier,seed,noise_multiplier,epsilon,"
           "max_participations,test_accuracy"]
  for fedavg_noise in args.noise:
    if fedavg_noise == 0:
      continue
    target = privacy_lib.epsilons(fedavg_noise, args.rounds,
                                  num_clients=NUM_CLIENTS,
                                  cohort_size=cohort_size, delta=1e-5)[-1]
    for seed in args.seeds:
      cohorts = loop.drawn_cohorts(loop.seed_keys(seed)[1], args.rounds,
                                   NUM_CLIENTS, cohort_size)
      noise = matched_tree_noise(target, cohorts, 1e-5)
      result = simulation.run(
          model, data, test,
          aggregators.dp_ftrl(clip_norm=1.0, noise_multiplier=noise,
                              num_participants=cohort_size),
          num_rounds=args.rounds, participation=participation,
          training=training, execution=execution, evaluation=evaluation,
          privacy=Privacy(delta=1e-5), seed=seed)
      last = result.history.rows[-1]
      peak = result.history.config["privacy"]["max_participations"]
      lines.append(f"{fedavg_noise},{seed},{noise},{last['epsilon']},"
                   f"{peak},{last['test_accuracy']}")
      print(lines[-1], flush=True)
      jsonio.write_text(os.path.join(args.out, "dp_ftrl.csv"),
                        "\n".join(lines) + "\n")


def run_dp(args, model, data, test, training, participation, execution,
           evaluation):
  lines = ["noise_multiplier,seed,epsilon,test_accuracy"]
  for noise in args.noise:
    for seed in args.seeds:
      result = simulation.run(
          model, data, test,
          aggregators.dp_fedavg(clip_norm=1.0, noise_multiplier=noise),
          num_rounds=args.rounds, participation=participation,
          training=training, execution=execution, evaluation=evaluation,
          privacy=Privacy(noise, delta=1e-5), seed=seed)
      last = result.history.rows[-1]
      lines.append(f"{noise},{seed},{last['epsilon']},"
                   f"{last['test_accuracy']}")
      print(json.dumps({"noise_multiplier": noise, "seed": seed,
                        "epsilon": last["epsilon"],
                        "test_accuracy": last["test_accuracy"]}),
            flush=True)
      jsonio.write_text(os.path.join(args.out, "dp.csv"),
                        "\n".join(lines) + "\n")
  import pandas as pd  # pylint: disable=import-outside-toplevel
  frame = pd.read_csv(os.path.join(args.out, "dp.csv"))
  stats = frame.groupby("noise_multiplier").agg(
      epsilon=("epsilon", "first"), mean=("test_accuracy", "mean"),
      std=("test_accuracy", "std")).reset_index()
  fig, ax = plt.subplots(figsize=(4, 3.2))
  finite = stats[np.isfinite(stats.epsilon)]
  ax.errorbar(finite.epsilon, finite["mean"], yerr=finite["std"],
              marker="o")
  for _, row in stats[~np.isfinite(stats.epsilon)].iterrows():
    ax.axhline(row["mean"], ls="--", color="gray",
               label=f"z = {row.noise_multiplier:g} (no privacy)")
  if len(finite):  # (a run of z = 0 alone has no finite epsilon)
    ax.set_xscale("log")
  ax.set_xlabel("epsilon (delta = 1e-5)")
  ax.set_ylabel("final test accuracy")
  ax.set_title(f"DP-FedAvg, {args.rounds} rounds")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "dp.png"), dpi=120)


if __name__ == "__main__":
  main()
