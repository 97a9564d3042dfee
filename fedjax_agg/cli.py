"""Command line: run one configurable federated experiment.

  python -m fedjax_agg --dataset fashion_mnist --partition shards \
      --num-clients 100 --model cnn_mcmahan --aggregator fedavg \
      --rounds 20 --participation 0.1 --epochs 1 --batch-size 16 --lr 0.05

Writes ``history.csv``, ``history.json`` and ``accuracy.png`` (test
accuracy per round) to ``--out``; ``--partition-plot`` also saves the
partition's label heatmap. Algorithm hyperparameters go through repeated
``--agg-arg name=value`` / ``--objective-arg`` / ``--partition-arg`` flags
(values are Python literals, e.g. ``alpha=5.0``). ``--checkpoint-every n``
saves the whole run every n rounds (to ``<out>/checkpoint`` unless
``--checkpoint-dir`` says where); the same command with ``--resume``
continues a killed run where its last checkpoint left it.

``--seeds 0,1,2`` and ``--sweep alpha=1,5,10`` (repeatable; ``lr`` is the
client learning rate) run every seed x grid point as ONE vmapped
computation (``fedjax_agg.sweep``) and write ``<out>/<member>/history.*``,
e.g. ``<out>/alpha5_seed1/history.csv``.
"""

import argparse
import ast
import json
import os
import sys
from typing import Optional, Sequence

from fedjax_agg import partitions



def _literal(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def parse_kv(pairs: Sequence[str], flag: str) -> dict:
  """["a=1", "b=x"] -> {"a": 1, "b": "x"}; names the flag on bad input."""
  out = {}
  for pair in pairs or ():
    if "=" not in pair:
      raise SystemExit(f"{flag} expects name=value, got {pair!r}")
    name, value = pair.split("=", 1)
    out[name.strip().replace("-", "_")] = _literal(value.strip())
  return out


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m fedjax_agg", description=__doc__.splitlines()[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--dataset", default="fashion_mnist",
                 help="mnist | fashion_mnist | cifar10 | cifar100")
  p.add_argument("--source", default="auto",
                 help="data source: auto | files | tfds | mnist_5k")
  p.add_argument("--data-dir", default=None)
  p.add_argument("--standardize", action="store_true",
                 help="per-channel standardisation of the images")
  p.add_argument("--max-train-examples", type=int, default=None,
                 help="keep only the first M training examples")
  p.add_argument("--partition", default="iid",
                 choices=partitions.NAMES,
                 help="a partition recipe of fedjax_agg.partitions")
  p.add_argument("--partition-arg", action="append", default=[])
  p.add_argument("--partition-plot", action="store_true",
                 help="save the partition's label heatmap")
  p.add_argument("--num-clients", type=int, default=100)
  p.add_argument("--model", default="cnn_mcmahan")
  p.add_argument("--conv-impl", default=None,
                 help="conv lowering (default: the models' default)")
  p.add_argument("--aggregator", default="fedavg")
  p.add_argument("--agg-arg", action="append", default=[])
  p.add_argument("--objective", default="cross_entropy",
                 help="local objective: cross_entropy | fedprox | fedlap")
  p.add_argument("--objective-arg", action="append", default=[])
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--participation", type=float, default=0.1,
                 help="C: fraction of clients per round")
  p.add_argument("--epochs", type=int, default=1, help="E: local epochs")
  p.add_argument("--batch-size", type=int, default=16, help="B")
  p.add_argument("--lr", type=float, default=0.05, help="client lr")
  p.add_argument("--momentum", type=float, default=0.0,
                 help="client SGD momentum")
  p.add_argument("--stragglers", type=float, default=0.0,
                 help="fraction of each cohort that straggles")
  p.add_argument("--clients-per-step", type=int, default=None,
                 help="clients trained side by side (vmap width)")
  p.add_argument("--cpu-devices", type=int, default=None,
                 help="split the CPU into this many XLA devices before JAX "
                 "starts (one per core); rounds then shard the clients over "
                 "them (2x faster measured on a 2-core CPU)")
  p.add_argument("--devices", type=int, default=None,
                 help="shard each round's clients over this many devices "
                 "(default: all devices of the job; 1: unsharded)")
  p.add_argument("--distributed", action="store_true",
                 help="multi-host: call jax.distributed.initialize() first "
                 "(one process per host; coordinator, process count and id "
                 "from the flags below, else detected: SLURM, Open MPI, "
                 "Kubernetes, Cloud TPU, JAX_COORDINATOR_ADDRESS)")
  p.add_argument("--coordinator-address", default=None,
                 help="with --distributed: host:port of process 0")
  p.add_argument("--num-processes", type=int, default=None,
                 help="with --distributed: number of processes (hosts)")
  p.add_argument("--process-id", type=int, default=None,
                 help="with --distributed: this process' index")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--seeds", default=None,
                 help="comma-separated seeds, run as ONE vmapped sweep "
                 "(e.g. 0,1,2); replaces --seed")
  p.add_argument("--sweep", action="append", default=[],
                 help="name=v1,v2,...: sweep an aggregator/objective "
                 "argument or lr in the same vmapped call (repeatable; "
                 "the members are the product with the seeds)")
  p.add_argument("--eval-every", type=int, default=1)
  p.add_argument("--no-client-eval", action="store_true",
                 help="skip the global model's loss on every client")
  p.add_argument("--out", default="results/run")
  p.add_argument("--no-progress", action="store_true")
  p.add_argument("--checkpoint-dir", default=None,
                 help="checkpoint folder (default <out>/checkpoint when "
                 "--checkpoint-every or --resume is given)")
  p.add_argument("--checkpoint-every", type=int, default=0,
                 help="save the whole run every this many rounds (0: never)")
  p.add_argument("--resume", action="store_true",
                 help="continue from the latest checkpoint (starts at "
                 "round 0 if there is none)")
  return p


def config_from_args(args) -> dict:
  """The experiment config (see ``fedjax_agg.experiment``) of the flags."""
  model_args = {} if args.conv_impl is None else {"conv_impl": args.conv_impl}
  return {
      "name": "cli",
      "dataset": {"name": args.dataset, "source": args.source,
                  "data_dir": args.data_dir, "standardize": args.standardize,
                  "max_train_examples": args.max_train_examples},
      "partition": {"name": args.partition, "num_clients": args.num_clients,
                    "args": parse_kv(args.partition_arg, "--partition-arg")},
      "model": {"name": args.model, "args": model_args},
      "train": {"rounds": args.rounds, "participation": args.participation,
                "local_epochs": args.epochs, "batch_size": args.batch_size,
                "learning_rate": args.lr, "momentum": args.momentum,
                "stragglers": args.stragglers, "eval_every": args.eval_every,
                "eval_clients": not args.no_client_eval,
                "clients_per_step": args.clients_per_step,
                "devices": args.devices},
      "algorithms": {args.aggregator: {
          "aggregator": args.aggregator,
          "aggregator_args": parse_kv(args.agg_arg, "--agg-arg"),
          "objective": args.objective,
          "objective_args": parse_kv(args.objective_arg, "--objective-arg")}},
      "seeds": [args.seed],
  }


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = build_parser().parse_args(argv)
  if args.cpu_devices is not None:
    from fedjax_agg import distributed  # pylint: disable=g-import-not-at-top
    try:
      distributed.use_cpu_devices(args.cpu_devices)
    except (ValueError, RuntimeError) as e:
      raise SystemExit(f"error: --cpu-devices: {e}") from e
  if args.distributed:
    import jax  # pylint: disable=g-import-not-at-top
    jax.distributed.initialize(coordinator_address=args.coordinator_address,
                               num_processes=args.num_processes,
                               process_id=args.process_id)
  # Imported here so that --help is instant.
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import plotting  # pylint: disable=g-import-not-at-top

  config = config_from_args(args)
  experiment.check_config(config)
  os.makedirs(args.out, exist_ok=True)
  if args.seeds is not None or args.sweep:
    if args.devices is not None or args.distributed:
      raise SystemExit("error: --seeds/--sweep runs use one device; drop "
                       "--devices/--distributed")
    return sweep_main(args, config)
  prepared = experiment.prepare_data(config, args.seed)
  if args.partition_plot:
    experiment.plot_partition(prepared,
                              os.path.join(args.out, "partition.png"))
  checkpoint_dir = args.checkpoint_dir
  if checkpoint_dir is None and (args.checkpoint_every or args.resume):
    checkpoint_dir = os.path.join(args.out, "checkpoint")
  from fedjax_agg import checkpoint  # pylint: disable=g-import-not-at-top
  try:
    result = experiment.run_algorithm(
        config, args.aggregator, args.seed, prepared,
        progress=not args.no_progress, checkpoint_dir=checkpoint_dir,
        checkpoint_every=args.checkpoint_every, resume=args.resume)
  except checkpoint.CheckpointError as e:
    raise SystemExit(f"error: {e}") from e
  if args.distributed and jax.process_index() > 0:
    return 0  # every process holds the same history; process 0 writes it
  paths = result.history.save(args.out)
  plot_path = os.path.join(args.out, "accuracy.png")
  plotting.plot_history({args.aggregator: result.history}, plot_path)
  summary = {"final_test_accuracy": result.history.rows[-1].get(
                 "test_accuracy"),
             "initial_test_accuracy": result.history.rows[0].get(
                 "test_accuracy"),
             "rounds": args.rounds, **paths, "plot": plot_path}
  print(json.dumps(summary))
  return 0


def parse_grid(pairs: Sequence[str]) -> dict[str, list]:
  """["alpha=1,5", "lr=0.1,0.2"] -> {"alpha": [1, 5], "learning_rate":
  [0.1, 0.2]} ("lr" is the client learning rate)."""
  grid = {}
  for pair in pairs or ():
    if "=" not in pair:
      raise SystemExit(f"--sweep expects name=v1,v2,..., got {pair!r}")
    name, values = pair.split("=", 1)
    name = name.strip().replace("-", "_")
    grid["learning_rate" if name == "lr" else name] = [
        _literal(v.strip()) for v in values.split(",") if v.strip()]
  return grid


def sweep_main(args, config: dict) -> int:
  """``--seeds`` / ``--sweep``: every member in one vmapped computation;
  writes ``<out>/<member>/history.csv|json`` and ``accuracy.png``."""
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_agg import plotting  # pylint: disable=g-import-not-at-top
  from fedjax_agg import sweep  # pylint: disable=g-import-not-at-top
  if args.checkpoint_every or args.resume or args.checkpoint_dir:
    raise SystemExit("error: --seeds/--sweep runs do not checkpoint")
  try:
    seeds = ([int(s) for s in args.seeds.split(",") if s.strip()]
             if args.seeds is not None else [args.seed])
  except ValueError as e:
    raise SystemExit(f"--seeds expects comma-separated ints, got "
                     f"{args.seeds!r}") from e
  config["seeds"] = seeds
  prepared = [experiment.prepare_data(config, seed) for seed in seeds]
  if args.partition_plot:
    experiment.plot_partition(prepared[0],
                              os.path.join(args.out, "partition.png"))
  members = experiment.sweep_algorithm(
      config, args.aggregator, seeds, prepared, parse_grid(args.sweep),
      progress=not args.no_progress)
  histories, rows = {}, []
  for member in members:
    name = sweep.member_name(member.hparams, member.seed)
    paths = member.history.save(os.path.join(args.out, name))
    histories[name] = member.history
    rows.append({"member": name, "hparams": member.hparams,
                 "seed": member.seed, "final_test_accuracy":
                 member.history.rows[-1].get("test_accuracy"), **paths})
  plot_path = os.path.join(args.out, "accuracy.png")
  plotting.plot_history(histories, plot_path)
  print(json.dumps({"members": rows, "rounds": args.rounds,
                    "plot": plot_path}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
