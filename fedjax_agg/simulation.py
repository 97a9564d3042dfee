"""One run: R rounds of one experiment (``run``).

``run`` builds one member's jitted round (``rounds.make_round_fn``), its
cohort sampling (fixed-size, or Poisson under ``config.Privacy``), its
evaluation (test set, clients' data, held-out personalised and fine-tuned
accuracies) and its privacy accounting, and hands them to the one round
loop, ``loop.Driver``, which every run shares (``sweep.run_sweep`` is the
same loop over S vmapped members; client-side algorithms such as ADCT are
``run`` with another ``local_update``, see ``fedjax_agg.rounds``). Seeding,
the evaluation schedule, history rows, the non-finite policy, checkpoints,
callbacks and early stopping are the loop's (``fedjax_agg.loop``).
"""

import dataclasses
import warnings
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import clients as clients_lib
from fedjax_agg import distributed
from fedjax_agg import engine
from fedjax_agg import evaluation as evaluation_lib
from fedjax_agg import loop
from fedjax_agg import privacy as privacy_lib
from fedjax_agg import rounds
from fedjax_agg import sampling as sampling_lib
from fedjax_agg.config import (Checkpointing, Evaluation, Execution,
                               LocalTraining, NonFinite, Privacy)
from fedjax_agg.federated import FederatedData
from fedjax_agg.history import History
# The loop's names, as this module gave them before the loop had its own.
from fedjax_agg.loop import (Callback, Driver, MAX_SEED, NonFiniteError,
                             check_labels, cohort_keys,
                             loop_with_checkpoints, num_classes_of,
                             open_checkpoints, seed_keys)
from fedjax_agg.types import Aggregator, Model, Params

__all__ = ["Callback", "Driver", "MAX_SEED", "NonFiniteError", "RunResult",
           "check_labels", "cohort_keys", "loop_with_checkpoints",
           "num_classes_of", "open_checkpoints", "resolve_privacy", "run",
           "seed_keys"]


class RunResult(NamedTuple):
  history: History
  state: rounds.ServerState


def _global_for_all(client_state, params, client_ids):
  """The global model as every listed client's model. -> [R, ...]."""
  del client_state
  return jax.tree.map(
      lambda a: jnp.broadcast_to(a, client_ids.shape + a.shape), params)


def _check_per_client_evaluation(evaluation: Evaluation, data,
                                 local_update) -> None:
  if not evaluation.per_client:
    return
  if data.validation is None:
    raise ValueError(
        "evaluation: personalized / finetune_steps evaluate on the clients' "
        "held-out split, but data has no validation split (use "
        "validation.holdout_split and FederatedData.with_validation)")
  if evaluation.personalized and getattr(local_update, "personalize",
                                         None) is None:
    raise ValueError(
        "evaluation.personalized=True needs a local_update with personal "
        "models (a LocalUpdate with personalize, e.g. clients.ditto or "
        "clients.fedbn); use finetune_steps for fine-tuned global models")


def run(
    model: Model,
    data: FederatedData,
    test_data: tuple[Any, Any],
    aggregator: Aggregator,
    *,
    num_rounds: int,
    participation: float = 1.0,
    training: LocalTraining = LocalTraining(),
    execution: Execution = Execution(),
    evaluation: Evaluation = Evaluation(),
    local_update: Optional[rounds.LocalUpdate] = None,
    nonfinite: NonFinite = NonFinite(),
    seed: int = 0,
    init_params: Optional[Params] = None,
    checkpointing: Optional[Checkpointing] = None,
    callbacks: Sequence[Callback] = (),
    config: Optional[dict] = None,
    privacy: Optional[Privacy] = None,
) -> RunResult:
  """Runs ``num_rounds`` rounds of federated training.

  Args:
    model: the network and its task loss (``types.Model``).
    data: the federated training data (with a ``validation`` split when the
      local update reads one).
    test_data: (x, y) test arrays for the global model; labels must lie in
      [0, C) for the model's C outputs (C is also the number of classes of
      the macro-F1).
    aggregator: the server rule.
    num_rounds: R.
    participation: C, fraction of clients sampled per round
      (m = max(floor(C N), 1), without replacement, seeded).
    training: what the clients do (``config.LocalTraining``).
    execution: chunking, devices, streaming, sampler, progress bar
      (``config.Execution``). With several devices each round's clients
      are sharded over them, params and data replicated.
    evaluation: when and what to evaluate (``config.Evaluation``).
    local_update: the client side (``rounds.LocalUpdate``); None: the
      engine's local training.
    nonfinite: what to do with NaN/Inf clients and models
      (``config.NonFinite``).
    seed: seeds the model init, the cohorts and the shuffles.
    init_params: start from these params instead of ``model.init``.
    checkpointing: save (and resume) the whole run
      (``config.Checkpointing``); resuming with a larger ``num_rounds``
      extends a finished run, which then equals the longer run.
    callbacks: called with each history row (module docstring).
    config: extra key/values recorded in the history's config (and in the
      checkpoint fingerprint).
    privacy: differential-privacy accounting (``config.Privacy``): the
      ``epsilon`` column after every round, Poisson cohorts when it says
      so, and an early end before epsilon passes its target (the history's
      config then says at which round and why).

  Returns:
    ``RunResult(history, final_state)``.

  Raises:
    NonFiniteError: per ``nonfinite``.
    checkpoint.CheckpointError: a checkpoint of another run or data.
  """
  loop.check_rounds(num_rounds)
  _check_per_client_evaluation(evaluation, data, local_update)
  cohort_size = rounds.num_sampled(data.num_clients, participation)
  privacy = resolve_privacy(privacy, aggregator, cohort_size)
  accounting = _privacy_accounting(privacy, data.num_clients, cohort_size,
                                   num_rounds)
  num_rounds = accounting.get("rounds_run", num_rounds)
  poisson = privacy is not None and privacy.sampling == "poisson"
  if poisson:
    rate = cohort_size / data.num_clients  # q = m / N
    capacity = sampling_lib.poisson_capacity(data.num_clients, rate)
  init_key, run_key = seed_keys(seed)
  params = model.init(init_key) if init_params is None else init_params
  test_x, test_y = (jnp.asarray(a) for a in test_data)
  num_classes = num_classes_of(model, params, test_x)
  check_labels(test_y, num_classes, "test_data")
  check_labels(data.y, num_classes, "data (the clients' training labels)")
  client_state = (() if local_update is None
                  or not isinstance(local_update, rounds.LocalUpdate)
                  else local_update.init(data.num_clients))
  if checkpointing is not None and clients_lib.uses_host_table(client_state):
    raise ValueError(
        "checkpointing: the local update keeps its per-client table in host "
        "memory (placement='host'), outside the server state, so the run "
        "cannot be checkpointed; use placement='device' or no checkpoints")
  state = rounds.init_state(params, aggregator, client_state=client_state)
  # Rounds donate their input state; copy it so that the caller's
  # ``init_params`` (which the state may alias) stay valid.
  state = jax.tree.map(jnp.copy, state._replace(key=run_key))
  # What must match for a checkpoint to continue this run: everything that
  # decides its results (not how rounds are executed, nor R).
  checkpointer, snapshot = open_checkpoints(
      checkpointing, lambda: loop.fingerprint(
          model=model, data=data, test_data=test_data,
          participation=participation, training=training,
          evaluation=evaluation, nonfinite=nonfinite,
          local_update=local_update, init_params=init_params, config=config,
          seed=seed, aggregator=aggregator, privacy=privacy),
      state, run_key, num_rounds)
  if snapshot is not None:
    state, run_key = snapshot.state, snapshot.run_key
  mesh, device = distributed.round_mesh(execution.devices)
  place = ((lambda tree: distributed.replicate(tree, mesh)) if mesh
           else (lambda tree: jax.device_put(tree, device)))

  def place_state(state):
    # A per-client table ([N, ...] leaves) is split by rows over the
    # devices, everything else replicated.
    if mesh is None:
      return place(state)
    return place(state._replace(client_state=()))._replace(
        client_state=distributed.shard_rows(state.client_state, mesh,
                                            data.num_clients))
  # Data and state live on the devices once, up front (placed like the
  # round's outputs, so round 2 reuses round 1's compilation); evaluation
  # runs on one device, from a local copy.
  state, data = place_state(state), place(data)
  eval_data = data if mesh is None else distributed.local_copy(data, device)
  round_fn = rounds.make_round_fn(
      model, aggregator, training, execution=execution, mesh=mesh,
      local_update=local_update, nonfinite=nonfinite.clients,
      donate_state=True)
  sample_keys = cohort_keys(run_key, num_rounds)
  full_mask = place(jnp.ones((cohort_size,), jnp.float32))
  compiled = []

  def sample(r):
    if not poisson:
      return place(rounds.sample_cohort(
          sample_keys[r], data.num_clients, cohort_size,
          execution.sampler)), full_mask
    cohort, mask, count = sampling_lib.poisson_cohort(
        sample_keys[r], data.num_clients, rate, capacity)
    if int(count) > capacity:
      raise RuntimeError(
          f"round {r + 1}: the Poisson cohort drew {int(count)} clients, "
          f"more than its capacity {capacity}; refusing to truncate it "
          "(that would change the sampling the accounting assumes)")
    return place(cohort), place(mask)

  def round_step(state, drawn):
    cohort, mask = drawn
    if not compiled:  # hosts start their first round together
      distributed.compile_together(round_fn, state, data, cohort, mask)
      compiled.append(True)
    state, out = round_fn(state, data, cohort, mask)
    if mesh is not None:
      # Leaves whose sharding XLA chose otherwise are placed again, so
      # that the next round reuses this compilation.
      state = place_state(state)
    jax.block_until_ready(state.params)
    out = distributed.to_numpy(out)  # gathered from other hosts
    if "epsilons" in accounting:
      out = out._replace(metrics={
          **out.metrics,
          "epsilon": accounting["epsilons"][int(state.round) - 1]})
    return state, out

  # One process: every evaluation batch is split over the round's devices
  # (params replicated there). Several: evaluated on one local device.
  batch_sharding = None
  if mesh is not None and jax.process_count() == 1:
    batch_sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(mesh.axis_names[0]))

  def evaluate(state, with_clients):
    params = aggregators.eval_params(state.aggregator_state, state.params)
    if batch_sharding is None:
      params = distributed.local_copy(params, device)
    else:
      params = place(params)
    test = evaluation_lib.evaluate(model, params, test_x, test_y,
                                   num_classes, evaluation.batch_size,
                                   batch_sharding)
    row = {f"test_{k}": v for k, v in test.items()}
    if with_clients:
      losses = np.asarray(evaluation_lib.client_losses(
          model, params, data if batch_sharding is not None else eval_data,
          evaluation.batch_size, batch_sharding))
      row["client_loss_mean"] = float(losses.mean())
      row["client_loss_var"] = float(losses.var())
      if evaluation.per_client:
        row.update(held_out(state, distributed.local_copy(params, device)))
    return [row]

  def held_out(state, params):
    """Accuracies on the clients' held-out splits (``Evaluation``)."""
    validation = eval_data.validation
    row = clients_lib.summarize(
        "global_accuracy", clients_lib.personal_accuracies(
            model, _global_for_all, (), params, validation))
    if evaluation.personalized:
      row.update(clients_lib.summarize(
          "personal_accuracy", clients_lib.personal_accuracies(
              model, local_update.personalize,
              distributed.local_copy(state.client_state, device), params,
              validation)))
    if evaluation.finetune_steps:
      row.update(clients_lib.summarize(
          "finetuned_accuracy", clients_lib.finetuned_accuracies(
              model, training, params, eval_data, evaluation.finetune_steps,
              jax.random.fold_in(run_key, int(state.round)),
              trainer=finetune_trainer)))
    return row

  finetune_trainer = (engine.make_local_trainer(model, training)
                      if evaluation.finetune_steps else None)

  driver = Driver(
      round_step=round_step,
      sample=sample,
      evaluate=evaluate, member_output=lambda out, m: out,
      member_state=lambda state, m: state, num_members=1,
      nonfinite=nonfinite, evaluation=evaluation,
      progress=execution.progress, callbacks=[list(callbacks)],
      with_losses=training.losses_for(aggregator.uses_losses))
  if snapshot is None:
    rows, client_rows = [driver.initial_rows(state, num_rounds)], [[]]
  else:
    rows, client_rows = [snapshot.rows], [snapshot.client_rows]
    driver.replay(rows, client_rows)

  state = loop_with_checkpoints(driver, checkpointer, state, run_key,
                                num_rounds, rows, client_rows)
  base_config = loop.base_config(
      num_rounds=num_rounds, participation=participation,
      cohort_size=cohort_size, training=training,
      learning_rate=training.learning_rate, seed=seed,
      num_clients=data.num_clients, num_classes=num_classes,
      num_devices=1 if mesh is None else mesh.size,
      extra=driver.stop_record())
  if privacy is not None:
    base_config["privacy"] = {
        **dataclasses.asdict(privacy),
        **{k: v for k, v in accounting.items() if k != "epsilons"}}
  base_config.update(config or {})
  return RunResult(History(rows[0], client_rows[0], base_config), state)


def resolve_privacy(privacy: Optional[Privacy], aggregator: Aggregator,
                    cohort_size: int) -> Optional[Privacy]:
  """``privacy`` with the noise multiplier of the rule that adds the noise.

  The accounting is derived from ``aggregator.noise_multiplier``, never
  taken on trust: a rule that adds no calibrated noise, a stated
  ``Privacy.noise_multiplier`` that differs from the rule's, and Poisson
  sampling with a rule that divides by the realised cohort size (its noise
  then depends on who was drawn) are refused.

  Args:
    privacy: the run's ``config.Privacy`` or None.
    aggregator: the run's rule.
    cohort_size: m; under Poisson sampling q N = m.
  """
  if privacy is None:
    return None
  if not isinstance(privacy, Privacy):
    raise TypeError(f"privacy must be a config.Privacy, got "
                    f"{type(privacy).__name__}")
  rule_z = aggregator.noise_multiplier
  if rule_z is None:
    raise ValueError(
        "privacy: the aggregator adds no calibrated Gaussian noise "
        "(Aggregator.noise_multiplier is None), so the run has no privacy "
        "guarantee to account; use a private rule such as "
        "aggregators.dp_fedavg, or drop privacy")
  rule_z = float(rule_z)
  if privacy.noise_multiplier is not None and not np.isclose(
      privacy.noise_multiplier, rule_z, rtol=1e-6, atol=0.0):
    raise ValueError(
        f"privacy.noise_multiplier={privacy.noise_multiplier} differs from "
        f"the noise the aggregator adds (noise_multiplier={rule_z}); the "
        "accounting is that of the rule's noise: leave "
        "Privacy.noise_multiplier unset or make them equal")
  if privacy.sampling == "poisson":
    expected = aggregator.expected_clients
    if expected is None or not np.isclose(float(expected), cohort_size):
      raise ValueError(
          f"privacy.sampling='poisson': the aggregator must divide by the "
          f"fixed expected cohort size q N = {cohort_size} (e.g. "
          f"dp_fedavg(expected_clients={cohort_size})), got expected_clients="
          f"{expected}; dividing by the realised cohort size makes the "
          "noise depend on who was drawn, which the accountant does not "
          "cover")
  return dataclasses.replace(privacy, noise_multiplier=rule_z)


def _privacy_accounting(privacy: Optional[Privacy], num_clients: int,
                        cohort_size: int, num_rounds: int) -> dict:
  """Epsilon after each round, and where the target ends the run (the
  Poisson rate is q = m / N, as the sampler draws)."""
  if privacy is None or num_rounds == 0:
    return {}
  kwargs = dict(num_clients=num_clients, delta=privacy.delta,
                sampling=privacy.sampling, accountant=privacy.accountant,
                cohort_size=cohort_size)
  epsilons = privacy_lib.epsilons(privacy.noise_multiplier, num_rounds,
                                  **kwargs)
  out = {"epsilons": epsilons, "requested_rounds": num_rounds}
  if privacy.target_epsilon is not None:
    allowed = int(np.sum(epsilons <= privacy.target_epsilon))
    if allowed == 0:
      raise ValueError(
          f"privacy: a single round already costs epsilon="
          f"{epsilons[0]:.4g} > target_epsilon={privacy.target_epsilon}")
    if allowed < num_rounds:
      warnings.warn(
          f"privacy: epsilon passes target_epsilon="
          f"{privacy.target_epsilon} after round {allowed}; the run ends "
          f"there instead of at round {num_rounds}", stacklevel=3)
      out["rounds_run"] = allowed
      out["stopped_by"] = "target_epsilon"
  out["final_epsilon"] = float(epsilons[out.get("rounds_run",
                                                num_rounds) - 1])
  return out
