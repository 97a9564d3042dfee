"""Robust aggregation under attack, and DP-FedAvg's accuracy against epsilon.

  python experiments/robustness/run.py                    # the committed run
  python experiments/robustness/run.py --rounds 3 --seeds 0 --out /tmp/r
  python experiments/robustness/run.py --trace fedadp label_flip 0.2 \
      --seeds 0                                           # one run traced

Fashion-MNIST (the full 60k/10k), 100 clients (IID), 10 of them per
round, mlp2, one local epoch of SGD (batch 32, lr 0.05). Every attack of
``ATTACKS`` at 10 / 20 / 30 % malicious clients of each round's cohort
(1 / 2 / 3 of 10, ``attacks.per_round``), plus the clean run, against
every rule of ``RULES``; the seeds of one (rule, attack, fraction) run side
by side as one vmapped sweep, one seed per CPU core. Then DP-FedAvg
(clip 1) at the noise multipliers of ``--noise``, with epsilon at delta =
1e-5 for the cohorts drawn.

Writes ``<out>/attacks.csv`` (one row per rule, attack, fraction, seed:
final test accuracy), ``<out>/attacks_table.md`` (mean ± sd over seeds;
every sd here is the population sd over the seeds, ddof 0, as in every
table of the project),
``<out>/round_cost.csv`` (median seconds per round of each rule, clean,
both seeds together), ``<out>/dp.csv`` and ``<out>/dp_table.md``,
``<out>/config_attacks.json`` and
``<out>/config_dp.json`` (the experiment config the part's runs are built
from, every default written out, with its provenance: data source, every
rule's arguments, versions and command; plus the part's own grid) and
``<out>/attacks.png``, ``<out>/dp.png``.

Every run is described by an experiment config (``study_config``) and
built by ``experiment.build``; the partition is drawn once
(``PARTITION_SEED``) and shared by the seeds, and the clean runs of the
backdoor study are also scored on its triggered test set.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
from typing import Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fedjax_agg import distributed  # pylint: disable=wrong-import-position
distributed.use_all_cores()  # before JAX starts: one device per core

import jax  # pylint: disable=wrong-import-position

import matplotlib  # pylint: disable=wrong-import-position
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from fedjax_agg import attacks  # pylint: disable=wrong-import-position
from fedjax_agg import experiment  # pylint: disable=wrong-import-position
from fedjax_agg import jsonio  # pylint: disable=wrong-import-position
from fedjax_agg import loop  # pylint: disable=wrong-import-position
from fedjax_agg import privacy as privacy_lib  # pylint: disable=wrong-import-position
from fedjax_agg import simulation  # pylint: disable=wrong-import-position
from fedjax_agg import spec  # pylint: disable=wrong-import-position
from fedjax_agg import sweep  # pylint: disable=wrong-import-position

NUM_CLIENTS = 100
PARTICIPATION = 0.1  # 10 clients per round
# Every seed trains on the same clients: the partition is drawn once, with
# this seed (a run's own seed draws its init, cohorts and shuffles).
PARTITION_SEED = 0
DELTA = 1e-5
# One local epoch of SGD; no per-client losses (none of the rules reads
# them).
TRAIN = {"local_epochs": 1, "batch_size": 32, "learning_rate": 0.05,
         "optimizer": "sgd", "compute_losses": False}
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
# Malicious share of each cohort in the backdoor study.
BACKDOOR_FRACTION = 0.1


def study_config(rounds: int, seeds, rules: dict, partition: str = "iid",
                 attack: Optional[dict] = None) -> dict:
  """Runs of ``rules`` (name -> (factory, arguments)) as one experiment
  config (``fedjax_agg.experiment``): Fashion-MNIST over ``NUM_CLIENTS``
  clients (``partition``: a key of ``PARTITIONS``), mlp2, ``TRAIN``, the
  test set scored after the last round only; ``attack``: the config's
  "attack" block (None: clean runs)."""
  config = {
      "name": "robustness",
      "dataset": {"name": "fashion_mnist"},
      "partition": {"name": partition.split("_")[0],
                    "num_clients": NUM_CLIENTS,
                    "args": dict(PARTITIONS[partition])},
      "model": {"name": "mlp2"},
      "train": {"rounds": rounds, "participation": PARTICIPATION, **TRAIN,
                "eval_every": rounds, "eval_clients": False},
      "algorithms": {name: {"aggregator": factory,
                            "aggregator_args": dict(arguments)}
                     for name, (factory, arguments) in rules.items()},
      "seeds": list(seeds),
  }
  if any(factory in spec.PRIVATE_AGGREGATORS
         for factory, _ in rules.values()):
    config["privacy"] = {"delta": DELTA}
  if attack is not None:
    config["attack"] = attack
  return config


def attack_block(name: str, arguments: dict, fraction: float) -> dict:
  """A config's "attack": ``fraction`` of each round's cohort malicious."""
  return {"name": name, "args": dict(arguments), "fraction": fraction,
          "adversaries": "per_round"}


def prepare(config: dict, dataset):
  """``experiment.prepare_data`` of ``config`` with the one partition
  every seed shares (``PARTITION_SEED``)."""
  return experiment.prepare_data(config, PARTITION_SEED, dataset)


def run_members(config: dict, name: str, prepared, extra=()) -> list:
  """Algorithm ``name`` of ``config``, its seeds side by side as one
  vmapped sweep on ``prepared``'s clients. ``extra``: ``EvalSet``s scored
  besides the test set. -> ``sweep.SweepMember``s."""
  # As experiment.sweep_algorithm: the members' shared (attacked) local
  # update is built on one device; the sweep shards the members over the
  # devices of "train.devices" (null: the most devices of the job that
  # divide the member count, e.g. one seed per core).
  built = experiment.build(config, name, prepared, devices=1)
  devices = config["train"].get("devices")
  if devices is None:
    devices = math.gcd(len(config["seeds"]), len(jax.devices()))
  options = built.options.replace(execution=dataclasses.replace(
      built.options.execution, devices=devices))
  if extra:
    # A clean run scored on a backdoor's triggered set: the format adds
    # that set only to the runs the backdoor attacks.
    options = options.replace(evaluation=dataclasses.replace(
        options.evaluation, extra=tuple(extra)))
  return sweep.run_sweep(lambda hparams: built.aggregator,
                         seeds=config["seeds"], model=built.model,
                         data=built.data, test_data=built.test_data,
                         options=options)


def run_one(config: dict, name: str, prepared, seed: int):
  """Algorithm ``name`` of ``config`` for one seed. -> ``RunResult``."""
  return simulation.run(*experiment.build(config, name, prepared),
                        seed=seed)


def parse_args(argv=None) -> argparse.Namespace:
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
  parser.add_argument("--trace", nargs=3, metavar=("RULE", "ATTACK",
                                                   "FRACTION"),
                      help="trace one attacked run round by round (only): "
                      "the test accuracy after every round and the "
                      "weight each malicious client received, for the "
                      "first of --seeds, to <out>/trace_<rule>_<attack>_"
                      "<fraction>.csv")
  parser.add_argument("--tables-only", action="store_true",
                      help="write the tables and plots again from the "
                      "CSVs in --out (no runs)")
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  if args.tables_only:
    tables(args)
    return
  # Recorded relative to the repository when inside it (no machine paths).
  shown_out = experiment.shown_path(args.out)
  os.makedirs(args.out, exist_ok=True)
  command = [experiment.shown_path(sys.argv[0])] + sys.argv[1:]
  dataset = experiment.load_dataset(study_config(args.rounds, args.seeds,
                                                 RULES))

  def record(config: dict, **extras) -> dict:
    """What a part writes down: the config its runs are built from, every
    default written out, with its provenance, and the part's own
    settings."""
    experiment.check_config(config)
    indices = experiment.partition_indices(config, PARTITION_SEED,
                                           dataset.train_y)
    return {**experiment.run_record(
        config, dataset=dataset,
        indices={seed: indices for seed in config["seeds"]},
        execution={"out": shown_out, "partition_seed": PARTITION_SEED},
        command=command), **extras, "args": {**vars(args), "out": shown_out}}

  if args.dp_ftrl:
    run_dp_ftrl(args, dataset, record)
    return
  if args.trace:
    run_trace(args, dataset, record)
    return
  if args.backdoor:
    jsonio.dump_json(record(
        study_config(args.rounds, args.seeds, BACKDOOR_RULES),
        backdoor=BACKDOOR, backdoor_fraction=BACKDOOR_FRACTION,
        boosts=BOOSTS, partitions=PARTITIONS),
        os.path.join(args.out, "config_backdoor.json"))
    run_backdoor(args, dataset)
    return
  if not args.skip_attacks:
    path = os.path.join(args.out, "config_attacks.json")
    clean = study_config(args.rounds, args.seeds,
                         {name: RULES[name] for name in args.rules})
    for attack in args.attacks:  # refused before anything runs
      for fraction in args.fractions:
        experiment.check_config({**clean, "attack": attack_block(
            attack, ATTACKS[attack], fraction)})
    jsonio.dump_json(_merged_record(record(
        clean, attacks={name: ATTACKS[name] for name in args.attacks},
        fractions=list(args.fractions), adversaries="per_round"), path),
        path)
    run_attacks(args, dataset)
  if not args.skip_dp:
    config = dp_config(args)
    jsonio.dump_json(record(config),
                     os.path.join(args.out, "config_dp.json"))
    run_dp(args, config, dataset)


def run_attacks(args, dataset):
  conditions = [("none", 0.0)] + [(a, f) for a in args.attacks
                                   for f in args.fractions]
  # Rows of rules not run now stay (a run with --rules adds its rows).
  lines = _kept_rows(os.path.join(args.out, "attacks.csv"), args.rules,
                     "rule,attack,fraction,seed,test_accuracy")
  costs = _kept_rows(os.path.join(args.out, "round_cost.csv"), args.rules,
                     "rule,median_round_s")
  prepared = prepare(study_config(args.rounds, args.seeds, RULES), dataset)
  for rule_name in args.rules:
    for attack_name, fraction in conditions:
      attack = None if attack_name == "none" else attack_block(
          attack_name, ATTACKS[attack_name], fraction)
      config = study_config(args.rounds, args.seeds,
                            {rule_name: RULES[rule_name]}, attack=attack)
      members = run_members(config, rule_name, prepared)
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


def trace_setting(args) -> tuple[str, str, float]:
  """``--trace``'s (rule, attack, fraction), each checked by name."""
  rule, attack, fraction = args.trace
  if rule not in RULES:
    raise SystemExit(f"--trace: rule must be one of {sorted(RULES)}, got "
                     f"{rule!r}")
  if attack not in ATTACKS:
    raise SystemExit(f"--trace: attack must be one of {sorted(ATTACKS)}, "
                     f"got {attack!r}")
  try:
    value = float(fraction)
  except ValueError:
    raise SystemExit(f"--trace: fraction must be a number in (0, 1), got "
                     f"{fraction!r}") from None
  if not 0.0 < value < 1.0:
    raise SystemExit(f"--trace: fraction must be in (0, 1), got {value}")
  return rule, attack, value


def run_trace(args, dataset, record):
  """One attacked run of the study with the test set scored after every
  round; per round its accuracy, the malicious participants and the
  weights the rule gave them (``client_weights``)."""
  rule, attack, fraction = trace_setting(args)
  seed = args.seeds[0]
  config = study_config(args.rounds, [seed], {rule: RULES[rule]},
                        attack=attack_block(attack, ATTACKS[attack],
                                            fraction))
  config["train"]["eval_every"] = 1
  name = f"trace_{rule}_{attack}_{fraction:g}"
  jsonio.dump_json(record(config, trace={"rule": rule, "attack": attack,
                                         "fraction": fraction,
                                         "seed": seed}),
                   os.path.join(args.out, f"config_{name}.json"))
  history = run_one(config, rule, prepare(config, dataset), seed).history
  lines = ["round,test_accuracy,malicious_clients,malicious_weights,"
           "malicious_weight_total,largest_honest_weight"]
  for row, clients in zip(history.rows[1:], history.client_rows,
                          strict=True):
    bad = np.asarray(clients["malicious"]) > 0
    weights = np.asarray(clients.get("client_weights",
                                     np.full(bad.shape, np.nan)))
    ids = np.asarray(clients["client_ids"])
    honest = weights[~bad]
    lines.append(
        f"{row['round']},{row['test_accuracy']},"
        f"{' '.join(str(int(i)) for i in ids[bad])},"
        f"{' '.join(f'{w:.4f}' for w in weights[bad])},"
        f"{float(np.sum(weights[bad])):.4f},"
        f"{float(np.max(honest)) if honest.size else float('nan'):.4f}")
  path = os.path.join(args.out, f"{name}.csv")
  jsonio.write_text(path, "\n".join(lines) + "\n")
  print(f"{rule} under {attack} at {fraction:g}, seed {seed}: final test "
        f"accuracy {history.rows[-1]['test_accuracy']:.4f}; {path}",
        flush=True)


def _merged_record(record, path):
  """``record`` with the algorithms and commands of an earlier record at
  ``path`` kept (a run with --rules adds to the committed table); an
  earlier record of the hand-built runs names its rules as (factory,
  arguments)."""
  if not os.path.exists(path):
    return record
  with open(path) as f:
    previous = json.load(f)
  command = record["provenance"]["command"]
  if "provenance" in previous:
    earlier = previous.get("commands",
                           [previous["provenance"]["command"]])
    algorithms = previous.get("algorithms", {})
  else:
    earlier = previous.get("commands", [previous.get("command")])
    algorithms = {name: {"aggregator": factory,
                         "aggregator_args": arguments}
                  for name, (factory, arguments) in previous.get(
                      "rules", {}).items()}
  return {**record, "algorithms": {**algorithms, **record["algorithms"]},
          "commands": earlier + [command]}


def _kept_rows(path, rules, header):
  """The header and the rows of ``path`` whose first field is not one of
  ``rules``."""
  if not os.path.exists(path):
    return [header]
  with open(path) as f:
    rows = f.read().splitlines()
  return [header] + [r for r in rows[1:] if r.split(",")[0] not in rules]


def backdoor_attack(boost: float) -> dict:
  """The config's "attack" of the backdoor study at ``boost``."""
  return attack_block("backdoor", {**BACKDOOR, "boost": boost},
                      BACKDOOR_FRACTION)


def run_backdoor_members(clean: dict, name: str, prepared,
                         boost: float) -> list:
  """Algorithm ``name`` of the backdoor study's ``clean`` config under
  the backdoor at ``boost`` (0: the clean run, scored on the triggered
  test set too), its seeds as one sweep (``run_members``)."""
  if boost == 0:
    return run_members(clean, name, prepared, (
        attacks.backdoor_eval_set(*prepared[1], **BACKDOOR),))
  return run_members({**clean, "attack": backdoor_attack(boost)}, name,
                     prepared)


def run_backdoor(args, dataset):
  """Attack success and clean accuracy of the backdoor against each
  defence, on IID and Dirichlet(0.3) label-skewed clients."""
  lines = ["partition,rule,boost,seed,test_accuracy,attack_success"]
  for partition in PARTITIONS:
    clean = study_config(args.rounds, args.seeds, BACKDOOR_RULES, partition)
    prepared = prepare(clean, dataset)
    for rule_name in BACKDOOR_RULES:
      for boost in (0.0,) + BOOSTS:  # 0: the clean run
        members = run_backdoor_members(clean, rule_name, prepared, boost)
        for member in members:
          last = member.history.rows[-1]
          lines.append(f"{partition},{rule_name},{boost},{member.seed},"
                       f"{last['test_accuracy']},{last['attack_success']}")
          print(lines[-1], flush=True)
        jsonio.write_text(os.path.join(args.out, "backdoor.csv"),
                          "\n".join(lines) + "\n")
  backdoor_table(args)


def seed_sd(values) -> float:
  """The sd every table gives: the population sd over the seeds (ddof 0;
  with 2 seeds, half their difference)."""
  return float(np.std(np.asarray(values, np.float64)))


def tables(args):
  """Every table and plot again from the committed CSVs (no runs)."""
  table_and_plot(args)
  backdoor_table(args)
  dp_table_and_plot(args)


def backdoor_table(args):
  import pandas as pd  # pylint: disable=import-outside-toplevel
  frame = pd.read_csv(os.path.join(args.out, "backdoor.csv"))
  stats = frame.groupby(["partition", "rule", "boost"]).agg(
      acc=("test_accuracy", "mean"), acc_sd=("test_accuracy", seed_sd),
      success=("attack_success", "mean"),
      success_sd=("attack_success", seed_sd)).reset_index()
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
      "test_accuracy"].agg(mean="mean", std=seed_sd).reset_index()
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


def dp_ftrl_plan(args) -> list[tuple[float, int, float]]:
  """(DP-FedAvg's z, seed, DP-FTRL's z) for every nonzero noise level of
  ``--noise`` and seed: the DP-FTRL z whose epsilon over the seed's own
  cohorts equals DP-FedAvg's final epsilon at that z."""
  cohort_size = max(int(PARTICIPATION * NUM_CLIENTS), 1)
  plan = []
  for fedavg_noise in args.noise:
    if fedavg_noise == 0:
      continue
    target = privacy_lib.epsilons(fedavg_noise, args.rounds,
                                  num_clients=NUM_CLIENTS,
                                  cohort_size=cohort_size, delta=DELTA)[-1]
    for seed in args.seeds:
      cohorts = loop.drawn_cohorts(loop.seed_keys(seed)[1], args.rounds,
                                   NUM_CLIENTS, cohort_size)
      plan.append((fedavg_noise, seed,
                   matched_tree_noise(target, cohorts, DELTA)))
  return plan


def dp_ftrl_name(fedavg_noise: float, seed: int) -> str:
  return f"dp_ftrl_z{fedavg_noise:g}_seed{seed}"


def dp_ftrl_config(args, plan) -> dict:
  """The DP-FTRL runs of ``plan`` (``dp_ftrl_plan``), one algorithm per
  noise level and seed (each runs its own seed only)."""
  return study_config(args.rounds, args.seeds, {
      dp_ftrl_name(fedavg_noise, seed): (
          "dp_ftrl", {"clip_norm": 1.0, "noise_multiplier": noise})
      for fedavg_noise, seed, noise in plan})


def run_dp_ftrl(args, dataset, record):
  """DP-FTRL (tree noise, no amplification by sampling) at the final
  epsilon of each DP-FedAvg noise level of ``--noise``, per seed: z is
  chosen so that the seed's own cohorts spend that epsilon."""
  plan = dp_ftrl_plan(args)
  config = dp_ftrl_config(args, plan)
  jsonio.dump_json(record(config),
                   os.path.join(args.out, "config_dp_ftrl.json"))
  prepared = prepare(config, dataset)
  lines = ["fedavg_noise_multiplier,seed,noise_multiplier,epsilon,"
           "max_participations,test_accuracy"]
  for fedavg_noise, seed, noise in plan:
    result = run_one(config, dp_ftrl_name(fedavg_noise, seed), prepared,
                     seed)
    last = result.history.rows[-1]
    peak = result.history.config["privacy"]["max_participations"]
    lines.append(f"{fedavg_noise},{seed},{noise},{last['epsilon']},"
                 f"{peak},{last['test_accuracy']}")
    print(lines[-1], flush=True)
    jsonio.write_text(os.path.join(args.out, "dp_ftrl.csv"),
                      "\n".join(lines) + "\n")


def dp_name(noise: float) -> str:
  return f"dp_fedavg_z{noise:g}"


def dp_config(args) -> dict:
  """DP-FedAvg (clip 1) at every noise multiplier of ``--noise``."""
  return study_config(args.rounds, args.seeds, {
      dp_name(noise): ("dp_fedavg", {"clip_norm": 1.0,
                                     "noise_multiplier": noise})
      for noise in args.noise})


def run_dp(args, config, dataset):
  prepared = prepare(config, dataset)
  lines = ["noise_multiplier,seed,epsilon,test_accuracy"]
  for noise in args.noise:
    for seed in args.seeds:
      result = run_one(config, dp_name(noise), prepared, seed)
      last = result.history.rows[-1]
      lines.append(f"{noise},{seed},{last['epsilon']},"
                   f"{last['test_accuracy']}")
      print(json.dumps({"noise_multiplier": noise, "seed": seed,
                        "epsilon": last["epsilon"],
                        "test_accuracy": last["test_accuracy"]}),
            flush=True)
      jsonio.write_text(os.path.join(args.out, "dp.csv"),
                        "\n".join(lines) + "\n")
  dp_table_and_plot(args)


def dp_table_and_plot(args):
  """``dp_table.md`` and ``dp.png`` from ``dp.csv``."""
  import pandas as pd  # pylint: disable=import-outside-toplevel
  frame = pd.read_csv(os.path.join(args.out, "dp.csv"))
  stats = frame.groupby("noise_multiplier").agg(
      epsilon=("epsilon", "first"), mean=("test_accuracy", "mean"),
      std=("test_accuracy", seed_sd)).reset_index()
  rows = ["| noise multiplier z | ε (δ = 1e-5) | final test accuracy "
          "(mean ± population sd) |",
          "|---|---|---|"]
  for _, row in stats.iterrows():
    epsilon = ("∞" if not np.isfinite(row.epsilon) else
               f"{row.epsilon:.4g}")
    rows.append(f"| {row.noise_multiplier:g} | {epsilon} | "
                f"{row['mean']:.3f} ± {row['std']:.3f} |")
  jsonio.write_text(os.path.join(args.out, "dp_table.md"),
                    "\n".join(rows) + "\n")
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
