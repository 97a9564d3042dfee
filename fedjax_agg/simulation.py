"""Rounds of federated training: sample, train locally, aggregate, evaluate.

The engine knows no algorithm: a round calls the local trainer (with the
chosen ``LocalObjective``) and an ``Aggregator`` through their contracts.

* ``make_round_fn`` gives a pure, jitted ``round_fn(state, data, cohort,
  mask) -> (state, RoundOutput)``: one whole round (local training of the
  cohort in one call, aggregation, optional server optimizer). It is a pure
  function of its inputs, so independent runs can be ``jax.vmap``-ed.
* ``evaluate`` gives test accuracy, loss and macro-F1; ``client_losses`` the
  global model's loss on every client's training data.
* ``run`` drives R rounds with a progress bar and returns a ``History``.
"""

import dataclasses
import json
import os
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm.auto as tqdm

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import distributed
from fedjax_agg import engine
from fedjax_agg import sampling
from fedjax_agg.federated import FederatedData
from fedjax_agg.types import (Aggregator, ClientInfo, LocalObjective, Model,
                              Params, PRNGKey)

# (key, full_steps [K]) -> num_steps [K]: per-round local step budgets
# (stragglers, unstable participation).
LocalStepsFn = Callable[[PRNGKey, jax.Array], jax.Array]


class ServerState(NamedTuple):
  """Everything the server carries from one round to the next.

  Attributes:
    params: the global model (broadcast to clients).
    aggregator_state: the aggregator's state.
    round: [] int32, rounds completed so far.
    key: PRNG key for the rounds to come.
  """
  params: Params
  aggregator_state: Any
  round: jax.Array
  key: PRNGKey


class RoundOutput(NamedTuple):
  """Per-round outputs of ``round_fn`` (all arrays).

  Attributes:
    client_ids: [K] cohort.
    mask: [K] 1 for real participants.
    loss_before: [K] global model's loss on each participant's data.
    loss_after: [K] local model's loss after training.
    steps_taken: [K] local steps performed.
    train_loss: [] mask-weighted mean of the clients' minibatch losses.
    metrics: the aggregator's metrics dict.
  """
  client_ids: jax.Array
  mask: jax.Array
  loss_before: jax.Array
  loss_after: jax.Array
  steps_taken: jax.Array
  train_loss: jax.Array
  metrics: Any


def num_sampled(num_clients: int, participation: float) -> int:
  """m = max(floor(C * N), 1) clients per round."""
  if not 0 < participation <= 1:
    raise ValueError(
        f"participation must be in (0, 1], got {participation!r}")
  return max(int(participation * num_clients), 1)


def sample_cohort(key: PRNGKey, num_clients: int, cohort_size: int,
                  method: str = "auto") -> jax.Array:
  """Draws ``cohort_size`` distinct client ids uniformly. -> [K] int32.

  ``method``: see ``fedjax_agg.sampling`` ("auto": a permutation of all N
  ids up to 65,536 clients, O(K log K) rejection sampling beyond).
  """
  return sampling.sample_without_replacement(key, num_clients, cohort_size,
                                             method)


def init_state(params: Params, aggregator: Aggregator, seed: int = 0
               ) -> ServerState:
  """The server state before round 1."""
  return ServerState(params, aggregator.init(params),
                     jnp.zeros((), jnp.int32), jax.random.key(seed))


def make_round_fn(
    model: Model,
    aggregator: Aggregator,
    *,
    batch_size: int,
    local_epochs: int,
    learning_rate: float | jax.Array = 0.01,
    objective: Optional[LocalObjective] = None,
    client_optimizer: engine.OptimizerFactory = optax.sgd,
    clients_per_step: int = 8,
    unroll: int | bool = 1,
    local_steps_fn: Optional[LocalStepsFn] = None,
    compute_losses: bool = True,
    mesh: Optional[jax.sharding.Mesh] = None,
    donate_state: bool = False,
    jit: bool = True,
    stream: Optional[bool] = None,
) -> Callable[..., tuple[ServerState, RoundOutput]]:
  """Builds one jitted FL round.

  Args:
    model: the network.
    aggregator: the server rule (wrap it with a server optimizer first if
      one is wanted, see ``fedjax_agg.aggregators``).
    batch_size, local_epochs, objective, client_optimizer, clients_per_step,
      unroll, compute_losses, mesh: see ``engine.make_local_trainer``.
    learning_rate: client learning rate, scalar or [K] per cohort slot.
    local_steps_fn: optional per-round step budgets (stragglers).
    donate_state: donate the input ``state``'s buffers to the output (no
      copy of large aggregator states such as FedDRL's replay buffer); the
      caller must not use the old state after the call.
    jit: False gives the same round un-jitted, to be composed under
      ``jax.vmap`` with hyperparameters that are traced values (the
      aggregator, objective and learning rate built inside the trace, as
      ``fedjax_agg.sweep`` does); ``donate_state`` is then unused.
    stream: aggregate on the fly (``engine.make_local_reducer`` with the
      aggregator's ``StreamingForm``): client models exist a chunk at a
      time, so memory does not grow with the cohort. None: whenever
      ``aggregator.stream`` is not None; False: always stack the [K, ...]
      client models (``engine.make_local_trainer``). Both give the same
      round to float rounding.

  Returns:
    ``round_fn(state, data, cohort, mask) -> (new_state, RoundOutput)``
    where ``cohort`` is [K] client ids and ``mask`` [K] (1 = participates).
  """
  if not compute_losses and aggregator.uses_losses:
    raise ValueError(
        "compute_losses=False: this aggregator reads info.loss_before / "
        "info.loss_after (aggregator.uses_losses), which would be zeros; "
        "keep compute_losses=True")
  if stream is None:
    stream = aggregator.stream is not None
  elif stream and aggregator.stream is None:
    raise ValueError("stream=True needs an aggregator with a streaming form "
                     "(aggregator.stream is None)")
  trainer_options = dict(
      batch_size=batch_size, num_epochs=local_epochs, objective=objective,
      client_optimizer=client_optimizer, clients_per_step=clients_per_step,
      unroll=unroll, compute_losses=compute_losses, mesh=mesh)
  if stream:
    reducer = engine.make_local_reducer(
        model, aggregator.stream.client_stats, **trainer_options)
  else:
    trainer = engine.make_local_trainer(model, **trainer_options)

  def round_fn(state: ServerState, data: FederatedData, cohort: jax.Array,
               mask: jax.Array):
    key, train_key, agg_key, steps_key = jax.random.split(state.key, 4)
    mask = mask.astype(jnp.float32)
    full = engine.full_steps(data, cohort, batch_size, local_epochs)
    num_steps = full if local_steps_fn is None else local_steps_fn(steps_key,
                                                                  full)
    # Padding rows do no work and carry weight 0.
    num_steps = jnp.where(mask > 0, num_steps, 0)
    lrs = jnp.broadcast_to(jnp.asarray(learning_rate, jnp.float32),
                           cohort.shape)
    info = ClientInfo(
        client_ids=cohort, num_examples=data.num_examples[cohort].astype(
            jnp.float32), mask=mask, loss_before=jnp.zeros_like(mask),
        loss_after=jnp.zeros_like(mask), round=state.round + 1, key=agg_key)
    if stream:
      local = reducer(state.params, data, cohort, lrs, num_steps, train_key,
                      info)
    else:
      local = trainer(state.params, data, cohort, lrs, num_steps, train_key)
    info = info._replace(loss_before=local.loss_before,
                         loss_after=local.loss_after)
    if stream:
      new_params, agg_state, metrics = aggregator.stream.finalize(
          state.params, local.stats, info, state.aggregator_state)
    else:
      new_params, agg_state, metrics = aggregator.aggregate(
          state.params, local.client_params, info, state.aggregator_state)
    train_loss = jnp.sum(local.train_loss * mask) / jnp.maximum(
        jnp.sum(mask), 1.0)
    new_state = ServerState(new_params, agg_state, state.round + 1, key)
    return new_state, RoundOutput(cohort, mask, local.loss_before,
                                  local.loss_after, local.steps_taken,
                                  train_loss, metrics)

  if not jit:
    return round_fn
  return jax.jit(round_fn, donate_argnums=(0,) if donate_state else ())


# ---------------------------------------------------------------------------
# Evaluation.


def _per_example(model: Model):
  @jax.jit
  def batch_stats(params, x, y):
    logits, _ = model.apply(params, x, False)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return losses, jnp.argmax(logits, axis=-1)
  return batch_stats


_EVAL_FNS = {}  # (model, batch size) -> jitted per-batch evaluation


def per_example_losses(model: Model, params: Params, x, y,
                       eval_batch_size: int = 1024):
  """Per-example loss and prediction of ``params`` on (x, y). -> [M], [M]."""
  fn = _EVAL_FNS.get((model, eval_batch_size))
  if fn is None:
    fn = _EVAL_FNS.setdefault((model, eval_batch_size),
                              _per_example(model))
  return map_batches(fn, params, x, y, eval_batch_size)


def map_batches(fn, params, x, y, eval_batch_size: int):
  """``fn(params, x_batch, y_batch) -> (losses, preds)`` over (x, y).

  Runs ``fn`` on batches of ``eval_batch_size`` (the last one padded, so
  ``fn`` compiles once) and concatenates along the last axis: [..., M]
  each (a leading axis is kept, e.g. the members of a sweep).
  """
  total = x.shape[0]
  losses, preds = [], []
  for start in range(0, total, eval_batch_size):
    xb = x[start:start + eval_batch_size]
    yb = y[start:start + eval_batch_size]
    short = eval_batch_size - xb.shape[0]
    if short:  # pad the last batch so the function compiles once
      xb = jnp.concatenate([xb, jnp.zeros((short,) + xb.shape[1:], xb.dtype)])
      yb = jnp.concatenate([yb, jnp.zeros((short,), yb.dtype)])
    loss_b, pred_b = fn(params, xb, yb)
    losses.append(loss_b[..., :eval_batch_size - short])
    preds.append(pred_b[..., :eval_batch_size - short])
  return jnp.concatenate(losses, -1), jnp.concatenate(preds, -1)


def classification_metrics(labels, predictions, num_classes: int
                           ) -> dict[str, float]:
  """Accuracy and macro-F1 (mean over classes present in labels or preds)."""
  labels = np.asarray(labels)
  predictions = np.asarray(predictions)
  confusion = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(confusion, (labels, predictions), 1)
  tp = np.diag(confusion).astype(np.float64)
  fp = confusion.sum(0) - tp
  fn = confusion.sum(1) - tp
  present = (tp + fp + fn) > 0
  denom = 2 * tp + fp + fn
  f1 = np.where(denom > 0, 2 * tp / np.where(denom > 0, denom, 1), 0.0)
  return {"accuracy": float(np.mean(labels == predictions)),
          "macro_f1": float(f1[present].mean()) if present.any() else 0.0}


def evaluate(model: Model, params: Params, x, y, num_classes: int,
             eval_batch_size: int = 1024) -> dict[str, float]:
  """Test loss, accuracy and macro-F1 of ``params`` on (x, y)."""
  losses, preds = per_example_losses(model, params, x, y, eval_batch_size)
  out = classification_metrics(y, preds, num_classes)
  out["loss"] = float(jnp.mean(losses))
  return out


def client_losses(model: Model, params: Params, data: FederatedData,
                  eval_batch_size: int = 1024) -> jax.Array:
  """Mean loss of ``params`` on each client's training data. -> [N].

  Computes each pooled example's loss once, then averages per client.
  """
  losses, _ = per_example_losses(model, params, data.x, data.y,
                                 eval_batch_size)
  return per_client_mean(losses, data.client_indices, data.num_examples)


def per_client_mean(losses, client_indices, num_examples) -> jax.Array:
  """[M] pooled per-example values -> [N] mean over each client's rows."""
  positions = jnp.arange(client_indices.shape[1])[None]
  mask = positions < num_examples[:, None]
  per_client = jnp.sum(jnp.where(mask, losses[client_indices], 0.0), 1)
  return per_client / num_examples


# ---------------------------------------------------------------------------
# History.


@dataclasses.dataclass
class History:
  """One row of scalars per round (row 0 = the initial model), plus the
  per-round client-level arrays (cohort, weights, losses)."""
  rows: list[dict]
  client_rows: list[dict]
  config: dict

  def to_dataframe(self):
    import pandas as pd  # pylint: disable=g-import-not-at-top
    return pd.DataFrame(self.rows)

  def column(self, name: str) -> np.ndarray:
    return np.array([row.get(name, np.nan) for row in self.rows])

  def save(self, directory: str, name: str = "history") -> dict[str, str]:
    """Writes ``<name>.csv`` (rows) and ``<name>.json`` (everything)."""
    os.makedirs(directory, exist_ok=True)
    csv_path = os.path.join(directory, f"{name}.csv")
    json_path = os.path.join(directory, f"{name}.json")
    self.to_dataframe().to_csv(csv_path, index=False)
    with open(json_path, "w") as f:
      json.dump({"config": self.config, "rows": self.rows,
                 "clients": self.client_rows}, f, default=_to_json)
    return {"csv": csv_path, "json": json_path}


def _to_json(value):
  if isinstance(value, (np.ndarray, jax.Array)):
    return np.asarray(value).tolist()
  if isinstance(value, (np.generic,)):
    return value.item()
  return str(value)


def rounds_to_target(history: History, target: float,
                     metric: str = "test_accuracy") -> Optional[int]:
  """First round whose ``metric`` reaches ``target`` (None if never)."""
  for row in history.rows:
    value = row.get(metric)
    if value is not None and not np.isnan(value) and value >= target:
      return int(row["round"])
  return None


def round_scalars(out: RoundOutput) -> dict[str, float]:
  """A round's scalar outputs, as ``History.rows`` holds them."""
  row = {"train_loss": float(out.train_loss),
         "cohort_loss_before": float(jnp.mean(out.loss_before)),
         "cohort_loss_after": float(jnp.mean(out.loss_after))}
  for name, value in out.metrics.items():
    if jnp.ndim(value) == 0:
      row[name] = float(value)
  return row


def client_row(round_num: int, out: RoundOutput) -> dict:
  """A round's per-client outputs, as ``History.client_rows`` holds them."""
  return {"round": round_num, "client_ids": np.asarray(out.client_ids),
          "loss_before": np.asarray(out.loss_before),
          "loss_after": np.asarray(out.loss_after),
          "steps_taken": np.asarray(out.steps_taken),
          **{k: np.asarray(v) for k, v in out.metrics.items()
             if jnp.ndim(v) > 0}}


class RunResult(NamedTuple):
  history: History
  state: ServerState


def run(
    model: Model,
    data: FederatedData,
    test_data: tuple[Any, Any],
    aggregator: Aggregator,
    *,
    num_rounds: int,
    num_classes: int,
    participation: float = 1.0,
    local_epochs: int = 1,
    batch_size: int = 16,
    learning_rate: float = 0.01,
    client_optimizer: engine.OptimizerFactory = optax.sgd,
    objective: Optional[LocalObjective] = None,
    clients_per_step: Optional[int] = None,
    unroll: int | bool = 1,
    local_steps_fn: Optional[LocalStepsFn] = None,
    compute_losses: bool = True,
    devices: distributed.Devices = None,
    sampler: str = "auto",
    seed: int = 0,
    init_params: Optional[Params] = None,
    eval_every: int = 1,
    eval_clients: bool = True,
    progress: bool = True,
    config: Optional[dict] = None,
    checkpoint_dir: Optional[str] = None,
    checkpoint_every: int = 0,
    resume: bool = False,
) -> RunResult:
  """Runs ``num_rounds`` rounds of federated training.

  Args:
    model: the network.
    data: the federated training data.
    test_data: (x, y) test arrays for the global model.
    aggregator: the server rule.
    num_rounds: R.
    num_classes: number of classes (for macro-F1).
    participation: C, fraction of clients sampled per round
      (m = max(floor(C N), 1), without replacement, seeded).
    local_epochs, batch_size, learning_rate, client_optimizer, objective,
      clients_per_step, unroll, local_steps_fn, compute_losses: see
      ``make_round_fn`` (``compute_losses=False`` skips the two extra
      forward passes per client; aggregators that read ``loss_before`` /
      ``loss_after``, such as FedDRL, then see zeros). ``clients_per_step``
      None: ``engine.default_clients_per_step`` for the devices (a valid
      multiple of their number); a given value must be such a multiple.
    devices: where rounds run (``distributed.client_mesh``): None = every
      device of the job (the local ones, or all hosts' after
      ``jax.distributed.initialize()``), an int count, a list of devices or
      a ``Mesh`` with a "clients" axis. With several devices each round's
      clients are sharded over them, params and data replicated; with one
      the round runs unsharded on it.
    sampler: cohort sampler, see ``sample_cohort``.
    seed: seeds the model init, the cohorts and the shuffles.
    init_params: start from these params instead of ``model.init``.
    eval_every: evaluate the global model every this many rounds (and after
      the last round).
    eval_clients: also compute the global model's loss on every client's
      training data (mean and variance over clients).
    progress: show a tqdm progress bar.
    config: extra key/values recorded in the history.
    checkpoint_dir: folder of this run's checkpoints (see
      ``fedjax_agg.checkpoint``); without ``resume`` it must hold none.
    checkpoint_every: save the whole run every this many rounds and after
      the last one (0: never).
    resume: continue from the latest checkpoint in ``checkpoint_dir`` (the
      history and final state equal the uninterrupted run's); with no
      checkpoint there, start at round 0. A checkpoint of a different run
      or a damaged one raises ``checkpoint.CheckpointError``.

  Returns:
    ``RunResult(history, final_state)``.
  """
  if not isinstance(num_rounds, int) or num_rounds < 0:
    raise ValueError(f"num_rounds must be an int >= 0, got {num_rounds!r}")
  if not isinstance(eval_every, int) or eval_every < 1:
    raise ValueError(f"eval_every must be an int >= 1, got {eval_every!r}")
  checkpoint.check_arguments(checkpoint_dir, checkpoint_every, resume)
  cohort_size = num_sampled(data.num_clients, participation)
  init_key, run_key = jax.random.split(jax.random.key(seed))
  params = model.init(init_key) if init_params is None else init_params
  state = init_state(params, aggregator)
  # Rounds donate their input state; copy it so that the caller's
  # ``init_params`` (which the state may alias) stay valid.
  state = jax.tree.map(jnp.copy, state._replace(key=run_key))
  checkpointer = snapshot = None
  if checkpoint_dir is not None:
    # What must match for a checkpoint to continue this run (how rounds
    # are executed -- devices, chunking, unroll, sampler -- may change).
    run_config = checkpoint.describe({
        "num_rounds": num_rounds, "participation": participation,
        "local_epochs": local_epochs, "batch_size": batch_size,
        "learning_rate": learning_rate, "seed": seed,
        "num_classes": num_classes, "eval_every": eval_every,
        "eval_clients": eval_clients, "compute_losses": compute_losses,
        "model": model, "aggregator": aggregator, "objective": objective,
        "client_optimizer": client_optimizer,
        "local_steps_fn": local_steps_fn, "init_params": init_params,
        "data": checkpoint.data_fingerprint(data),
        "test_data": [list(np.shape(a)) for a in test_data],
        "config": config})
    checkpointer, snapshot = checkpoint.open_run(
        checkpoint_dir, checkpoint_every, resume, run_config, state, run_key)
    if snapshot is not None:
      state, run_key = snapshot.state, snapshot.run_key
  mesh, device = distributed.round_mesh(devices)
  place = ((lambda tree: distributed.replicate(tree, mesh)) if mesh
           else (lambda tree: jax.device_put(tree, device)))
  # Data and state live on the devices once, up front (replicated like the
  # round's outputs, so round 2 reuses round 1's compilation); evaluation
  # runs on one device, from a local copy.
  state, data = place(state), place(data)
  eval_data = data if mesh is None else distributed.local_copy(data, device)
  round_fn = make_round_fn(
      model, aggregator, batch_size=batch_size, local_epochs=local_epochs,
      learning_rate=learning_rate, objective=objective,
      client_optimizer=client_optimizer, clients_per_step=clients_per_step,
      unroll=unroll, local_steps_fn=local_steps_fn,
      compute_losses=compute_losses, mesh=mesh, donate_state=True)
  test_x, test_y = (jnp.asarray(a) for a in test_data)
  sample_keys = jax.random.split(jax.random.fold_in(run_key, 1), max(
      num_rounds, 1))
  mask = place(jnp.ones((cohort_size,), jnp.float32))

  def eval_row(state, round_num, elapsed):
    row = {"round": round_num, "time_s": elapsed}
    params = aggregators.eval_params(state.aggregator_state, state.params)
    params = distributed.local_copy(params, device)
    test = evaluate(model, params, test_x, test_y, num_classes)
    row.update({f"test_{k}": v for k, v in test.items()})
    if eval_clients:
      losses = np.asarray(client_losses(model, params, eval_data))
      row["client_loss_mean"] = float(losses.mean())
      row["client_loss_var"] = float(losses.var())
    return row

  if snapshot is None:
    rows, client_rows = [eval_row(state, 0, 0.0)], []
  else:
    rows, client_rows = snapshot.rows, snapshot.client_rows
  first_round = len(rows) - 1
  bar = tqdm.trange(first_round, num_rounds, disable=not progress,
                    desc="rounds")
  for r in bar:
    start = time.perf_counter()
    cohort = place(sample_cohort(sample_keys[r], data.num_clients,
                                 cohort_size, sampler))
    if r == first_round:  # hosts start their first round together
      distributed.compile_together(round_fn, state, data, cohort, mask)
    state, out = round_fn(state, data, cohort, mask)
    if mesh is not None:
      # Leaves whose sharding XLA chose otherwise (per-client state) are
      # replicated again, so that the next round reuses this compilation.
      state = place(state)
    jax.block_until_ready(state.params)
    out = distributed.to_numpy(out)  # gathered from the other hosts
    elapsed = time.perf_counter() - start
    if (r + 1) % eval_every == 0 or r + 1 == num_rounds:
      row = eval_row(state, r + 1, elapsed)
    else:
      row = {"round": r + 1, "time_s": elapsed}
    row.update(round_scalars(out))
    rows.append(row)
    client_rows.append(client_row(r + 1, out))
    if "test_accuracy" in row:
      bar.set_postfix(acc=f"{row['test_accuracy']:.4f}")
    if checkpointer is not None and checkpointer.should_save(r + 1,
                                                             num_rounds):
      checkpointer.save(r + 1, state, run_key, rows, client_rows)
  if checkpointer is not None:
    checkpointer.close()
  base_config = {"num_rounds": num_rounds, "participation": participation,
                 "cohort_size": cohort_size, "local_epochs": local_epochs,
                 "batch_size": batch_size, "learning_rate": learning_rate,
                 "seed": seed, "num_clients": data.num_clients,
                 "num_devices": 1 if mesh is None else mesh.size}
  base_config.update(config or {})
  return RunResult(History(rows, client_rows, base_config), state)
