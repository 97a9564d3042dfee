"""How strong is FedLap's penalty? Per-epoch dissimilarities and their effect.

For a config of ``run.py`` (its dataset, partition, model, train settings and
its "FedLap" algorithm's objective), takes the global model after each of
``--after-rounds`` FedAvg rounds and trains ``--clients`` clients locally
for E epochs twice from it, on the same minibatches: once with plain
cross-entropy (FedAvg's local step) and once with FedLap's objective. It
reports, per local epoch, the mean dissimilarity lambda (Eq. 7) of each
regularised layer at the start of the epoch, FedLap's penalty (Eq. 10) and
the norms of the penalty's and the data loss's gradients on that epoch's
last batch; and, after E epochs, how far apart the two local models are
relative to FedAvg's update:
``||W_FedLap - W_FedAvg|| / ||W_FedAvg - W_g||``.

  python experiments/fedlap/lambda_stats.py --config configs/fig1b_fmnist.json

Writes ``results/lambda_stats_<config>/lambda_stats.json``.
"""

import argparse
import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fedjax_agg import experiment  # pylint: disable=wrong-import-position
from fedjax_agg import models  # pylint: disable=wrong-import-position
from fedjax_agg import objectives  # pylint: disable=wrong-import-position


def global_after(config: dict, rounds: int, seed: int, prepared):
  """The FedAvg global model after ``rounds`` rounds of ``config``."""
  fedavg = {"FedAvg": {"aggregator": "fedavg",
                       "aggregator_args": {"weighting": "uniform"}}}
  cfg = experiment.override(config, {"train.rounds": rounds,
                                     "train.stragglers": 0.0})
  cfg["algorithms"] = fedavg
  return experiment.run_algorithm(cfg, "FedAvg", seed, prepared).state.params


def local_compare(model, objective_args, params, x, y, train, seed):
  """Trains one client from ``params`` with and without FedLap's penalty."""
  plain = objectives.local_loss(model, objectives.cross_entropy())
  if objective_args.get("recompute", "epoch") != "epoch":
    raise ValueError("lambda_stats needs FedLap's recompute='epoch'")
  lap_objective = objectives.fedlap(**objective_args)
  lap = objectives.local_loss(model, lap_objective)
  optimizer = optax.sgd(train["learning_rate"],
                        momentum=train["momentum"] or None)
  batch_size = train["batch_size"]

  def grad_of(loss_fn):
    return jax.grad(lambda p, b, g, c: loss_fn(p, b, g, c)[0])

  @jax.jit
  def step(state, batch, global_params, context):
    (w_plain, o_plain), (w_lap, o_lap) = state
    g_plain = grad_of(plain)(w_plain, batch, global_params, ())
    g_lap = grad_of(lap)(w_lap, batch, global_params, context)
    u_plain, o_plain = optimizer.update(g_plain, o_plain, w_plain)
    u_lap, o_lap = optimizer.update(g_lap, o_lap, w_lap)
    return ((optax.apply_updates(w_plain, u_plain), o_plain),
            (optax.apply_updates(w_lap, u_lap), o_lap))

  @jax.jit
  def diagnose(w_lap, batch, global_params, context):
    data_grad = grad_of(plain)(w_lap, batch, global_params, ())
    pen_grad = jax.grad(lap_objective.penalty)(w_lap, global_params,
                                               context)
    return (lap_objective.penalty(w_lap, global_params, context),
            optax.tree.norm(pen_grad), optax.tree.norm(data_grad))

  state = ((params, optimizer.init(params)), (params, optimizer.init(params)))
  rng = np.random.default_rng(seed)
  epochs = []
  for _ in range(train["local_epochs"]):
    w_lap = state[1][0]
    # With recompute="epoch" the context is the per-row lambdas (Eq. 7).
    lambdas = context = lap_objective.prepare(w_lap, params)
    order = rng.permutation(len(y))
    for start in range(0, len(y), batch_size):
      take = order[start:start + batch_size]
      batch = {"x": x[take], "y": y[take],
               "mask": jnp.ones((len(take),), jnp.float32)}
      state = step(state, batch, params, context)
    penalty, pen_norm, data_norm = diagnose(state[1][0], batch, params,
                                            context)
    epochs.append({"lambda_mean_per_layer": [float(jnp.mean(lam))
                                             for lam in lambdas],
                   "lambda_max_per_layer": [float(jnp.max(lam))
                                            for lam in lambdas],
                   "penalty_end": float(penalty),
                   "penalty_grad_norm_end": float(pen_norm),
                   "data_grad_norm_end": float(data_norm)})
  w_plain, w_lap = state[0][0], state[1][0]
  gap = optax.tree.norm(optax.tree.sub(w_lap, w_plain))
  update = optax.tree.norm(optax.tree.sub(w_plain, params))
  return {"epochs": epochs, "relative_gap": float(gap / update)}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", required=True)
  parser.add_argument("--after-rounds", default="0,10",
                      help="comma-separated FedAvg rounds before the look")
  parser.add_argument("--clients", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  path = experiment.config_path(args.config, False, HERE)
  config = experiment.load_config(path)
  train = dataclasses.asdict(experiment.check_config(config).train)
  objective_args = config["algorithms"]["FedLap"].get("objective_args", {})
  prepared = experiment.prepare_data(config, args.seed)
  data, _, num_classes, input_shape, _, _ = prepared
  model = models.get(config["model"]["name"], num_classes=num_classes,
                     input_shape=input_shape,
                     **config["model"].get("args", {}))
  clients = np.random.default_rng(args.seed).choice(
      data.num_clients, args.clients, replace=False)
  report = {"config": os.path.basename(path), "seed": args.seed,
            "objective_args": objective_args, "looks": []}
  for rounds in (int(r) for r in args.after_rounds.split(",")):
    params = global_after(config, rounds, args.seed, prepared)
    per_client = []
    for client in clients:
      idx = np.asarray(data.client_indices[client][:data.num_examples[client]])
      per_client.append(local_compare(
          model, objective_args, params, np.asarray(data.x)[idx],
          np.asarray(data.y)[idx], train, args.seed + int(client)))
    epochs = [{key: np.mean([c["epochs"][e][key] for c in per_client],
                            axis=0).tolist()
               for key in per_client[0]["epochs"][e]}
              for e in range(train["local_epochs"])]
    gaps = [c["relative_gap"] for c in per_client]
    look = {"after_fedavg_rounds": rounds, "clients": clients.tolist(),
            "epochs_mean_over_clients": epochs,
            "relative_gap_mean": float(np.mean(gaps)),
            "relative_gap_max": float(np.max(gaps))}
    report["looks"].append(look)
    print(f"after {rounds} FedAvg rounds: ||W_lap - W_avg|| / "
          f"||W_avg - W_g|| = {look['relative_gap_mean']:.4f} (max "
          f"{look['relative_gap_max']:.4f})")
    for e, entry in enumerate(epochs):
      lam = ", ".join(f"{v:.4f}" for v in entry["lambda_mean_per_layer"])
      print(f"  epoch {e + 1:2d}: mean lambda per layer [{lam}], penalty "
            f"{entry['penalty_end']:.2e}, |grad pen| "
            f"{entry['penalty_grad_norm_end']:.3f}, |grad data| "
            f"{entry['data_grad_norm_end']:.3f}")
  out_dir = args.out or os.path.join(
      HERE, "results", "lambda_stats_" + os.path.splitext(
          os.path.basename(path))[0])
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "lambda_stats.json"), "w") as f:
    json.dump(report, f, indent=2)


if __name__ == "__main__":
  main()
