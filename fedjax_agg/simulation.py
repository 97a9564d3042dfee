"""The round driver: seeding, cohorts, the jitted round, evaluation, history.

``run`` drives R rounds of one experiment. Everything a run does besides
the round itself lives here once and is shared by every way of running:

* seeding: ``seed`` -> (model init key, run key); the cohort of round r is
  drawn from ``split(fold_in(run_key, 1), R)[r]`` (a prefix of the keys of
  a longer run, so a finished run can be extended) and the round's own keys
  from the state's key;
* the evaluation schedule (``config.Evaluation``), the history rows and
  client rows (``fedjax_agg.history``), the non-finite policy
  (``config.NonFinite``), checkpoints, the progress bar and callbacks.

``Driver`` is that loop over one or several *members*: ``run`` is one
member; ``fedjax_agg.sweep.run_sweep`` is the same loop over S vmapped
members; client-side algorithms (ADCT) are ``run`` with another
``local_update`` (see ``fedjax_agg.rounds``).

Callbacks. Each callable in ``callbacks`` is called after every round with
``(row, client_row)``: the round's history row (a dict of scalars) and its
per-client arrays; ``history.HistoryWriter`` writes the history files that
way as the run goes.
"""

import dataclasses
import sys
import time
import warnings
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tqdm.auto as tqdm

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import checks
from fedjax_agg import clients as clients_lib
from fedjax_agg import distributed
from fedjax_agg import engine
from fedjax_agg import evaluation as evaluation_lib
from fedjax_agg import history as history_lib
from fedjax_agg import privacy as privacy_lib
from fedjax_agg import rounds
from fedjax_agg import sampling as sampling_lib
from fedjax_agg.config import (Checkpointing, Evaluation, Execution,
                               LocalTraining, NonFinite, Privacy)
from fedjax_agg.federated import FederatedData
from fedjax_agg.history import History
from fedjax_agg.types import Aggregator, Model, Params

__all__ = ["Driver", "MAX_SEED", "NonFiniteError", "RunResult",
           "loop_with_checkpoints", "num_classes_of", "open_checkpoints",
           "resolve_privacy", "run", "seed_keys"]

Callback = Callable[[dict, Optional[dict]], None]


class NonFiniteError(FloatingPointError):
  """A run met a non-finite value its ``config.NonFinite`` policy refuses."""


class RunResult(NamedTuple):
  history: History
  state: rounds.ServerState


# Seeds are 32-bit: ``jax.random.key`` keeps only the low 32 bits of a
# larger one (2**32 + 5 would silently be seed 5) and overflows at 2**63.
MAX_SEED = 2**32 - 1


def seed_keys(seed: int) -> tuple[jax.Array, jax.Array]:
  """``seed`` (an int in [0, 2**32 - 1]) -> (model init key, run key)."""
  checks.check_int("seed", seed, 0, MAX_SEED)
  return tuple(jax.random.split(jax.random.key(int(seed))))


def cohort_keys(run_key: jax.Array, num_rounds: int) -> jax.Array:
  """[R] keys of the rounds' cohorts (prefix-stable in R)."""
  return jax.random.split(jax.random.fold_in(run_key, 1), max(num_rounds, 1))


def num_classes_of(model: Model, params: Params, x) -> int:
  """The width of the model's outputs on ``x`` (classes for metrics)."""
  shape = jax.eval_shape(lambda p, xb: model.apply(p, xb, False)[0], params,
                         jax.ShapeDtypeStruct((1,) + tuple(x.shape[1:]),
                                              x.dtype))
  return int(shape.shape[-1])


def check_labels(y, num_classes: int, where: str) -> None:
  """Refuses labels outside [0, num_classes) naming ``where``."""
  y = np.asarray(y)
  bad = (y < 0) | (y >= num_classes)
  if bad.any():
    raise ValueError(
        f"{where} holds labels outside [0, {num_classes}) (the model's "
        f"{num_classes} outputs): {sorted(set(y[bad].tolist()))[:10]}")


def open_checkpoints(checkpointing: Optional[Checkpointing],
                     fingerprint: Callable[[], dict], state, run_key,
                     num_rounds: int):
  """-> (checkpointer or None, snapshot or None) for a run of
  ``num_rounds`` rounds; refuses a checkpoint past ``num_rounds``.
  ``fingerprint()`` (called only with ``checkpointing``) describes what a
  checkpoint must match."""
  if checkpointing is None:
    return None, None
  checkpointer, snapshot = checkpoint.open_run(
      checkpointing.directory, checkpointing.every, checkpointing.resume,
      checkpoint.describe(fingerprint()), state, run_key)
  if snapshot is not None and snapshot.round > num_rounds:
    checkpointer.close()
    raise checkpoint.CheckpointMismatchError(
        f"the checkpoint in {checkpointing.directory} is at round "
        f"{snapshot.round}, past num_rounds={num_rounds}")
  return checkpointer, snapshot


def loop_with_checkpoints(driver: "Driver", checkpointer, state, run_key,
                          num_rounds: int, rows, client_rows,
                          pack=lambda rows, client_rows: (rows[0],
                                                          client_rows[0])):
  """``driver.loop`` from the rows' last round, saving as ``checkpointer``
  says (``pack`` turns the members' rows into what a checkpoint holds)."""
  def after_round(round_num, state):
    if checkpointer is not None and checkpointer.should_save(round_num,
                                                             num_rounds):
      checkpointer.save(round_num, state, run_key,
                        *pack(rows, client_rows))

  try:
    return driver.loop(state, len(rows[0]) - 1, num_rounds, rows,
                       client_rows, after_round)
  finally:
    if checkpointer is not None:
      checkpointer.close()


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


def _check_rounds(num_rounds) -> None:
  if isinstance(num_rounds, bool) or not isinstance(num_rounds, int) or (
      num_rounds < 0):
    raise ValueError(f"num_rounds must be an int >= 0, got {num_rounds!r}")


class Driver:
  """The round loop over ``num_members`` runs stepped together.

  Args:
    round_step: ``(state, cohorts) -> (state, outputs)`` for all members
      (outputs already on the host, numpy).
    sample: ``r -> cohorts`` of round r (0-based).
    evaluate: ``(state, with_clients) -> [one dict of test metrics per
      member]``; ``with_clients``: also the losses on the clients' data.
    member_output: ``(outputs, m) -> member m's RoundOutput``.
    member_state: ``(state, m) -> member m's ServerState`` (for the
      non-finite checks).
    num_members: M.
    nonfinite: the ``config.NonFinite`` policy.
    progress: show a progress bar.
    callbacks: per member, called with each row (see the module docstring).
    with_losses: the rounds compute per-client losses (else the rows have
      no ``cohort_loss_*`` columns).
  """

  def __init__(self, *, round_step, sample, evaluate, member_output,
               member_state, num_members: int, nonfinite: NonFinite,
               evaluation: Evaluation, progress: bool,
               callbacks: Sequence[Sequence[Callback]],
               with_losses: bool = True):
    self.round_step = round_step
    self.sample = sample
    self.evaluate = evaluate
    self.member_output = member_output
    self.member_state = member_state
    self.num_members = num_members
    self.nonfinite = nonfinite
    self.evaluation = evaluation
    self.progress = progress
    self.callbacks = callbacks
    self.with_losses = with_losses

  def initial_rows(self, state, num_rounds: int) -> list[dict]:
    if self.progress:
      # The bar appears after the first evaluation; say what runs first.
      print("fedjax_agg: evaluating the initial model, then compiling the "
            "round (the first round's time includes compilation) ...",
            file=sys.stderr, flush=True)
    with_clients = self.evaluation.clients_due(0, num_rounds)
    rows = [{"round": 0, "time_s": 0.0, **test}
            for test in self.evaluate(state, with_clients)]
    for m, row in enumerate(rows):
      self._check_model(row, state, m)
      for callback in self.callbacks[m]:
        callback(row, None)
    return rows

  def replay(self, rows: list[list[dict]],
             client_rows: list[list[dict]]) -> None:
    """Hands a resumed run's restored rows to the callbacks, in order, so
    that history writers start from the checkpoint's rows (a resumed run's
    files then hold every round, not only those after the resume)."""
    for m in range(self.num_members):
      for i, row in enumerate(rows[m]):
        client = client_rows[m][i - 1] if i > 0 else None
        for callback in self.callbacks[m]:
          callback(row, client)

  def _check_model(self, row: dict, state, m: int) -> None:
    """The global model (and its test loss) must stay finite."""
    if self.nonfinite.model == "record":
      return
    bad = []
    loss = row.get("test_loss")
    if loss is not None and not np.isfinite(loss):
      bad.append(f"test loss {loss}")
    params = self.member_state(state, m).params
    finite = all(bool(jnp.all(jnp.isfinite(leaf)))
                 for leaf in jax.tree.leaves(params)
                 if jnp.issubdtype(leaf.dtype, jnp.inexact))
    if not finite:
      bad.append("non-finite global parameters")
    if bad:
      member = f" (member {m})" if self.num_members > 1 else ""
      raise NonFiniteError(
          f"round {row['round']}{member}: {', '.join(bad)}; the model "
          "diverged (lower the learning rate, or pass "
          "NonFinite(model='record') to record it and go on)")

  def loop(self, state, first_round: int, num_rounds: int,
           rows: list[list[dict]], client_rows: list[list[dict]],
           after_round: Optional[Callable[..., None]] = None):
    """Rounds ``first_round + 1 .. num_rounds``; appends to the rows."""
    desc = "rounds" if self.num_members == 1 else (
        f"rounds ({self.num_members} members)")
    bar = tqdm.trange(first_round, num_rounds, disable=not self.progress,
                      desc=desc)
    for r in bar:
      start = time.perf_counter()
      state, outputs = self.round_step(state, self.sample(r))
      elapsed = time.perf_counter() - start
      round_num = r + 1
      if self.evaluation.due(round_num, num_rounds):
        with_clients = self.evaluation.clients_due(round_num, num_rounds)
        new_rows = [{"round": round_num, "time_s": elapsed, **test}
                    for test in self.evaluate(state, with_clients)]
      else:
        new_rows = [{"round": round_num, "time_s": elapsed}
                    for _ in range(self.num_members)]
      for m, row in enumerate(new_rows):
        out = self.member_output(outputs, m)
        row.update(history_lib.round_scalars(out, self.with_losses))
        client = history_lib.client_row(round_num, out, self.with_losses)
        rows[m].append(row)
        client_rows[m].append(client)
        for callback in self.callbacks[m]:
          callback(row, client)
        self._check_clients(out, round_num, m)
        if "test_loss" in row or self.nonfinite.model == "raise":
          self._check_model(row, state, m)
      if "test_accuracy" in new_rows[0]:
        bar.set_postfix(acc=" ".join(f"{row['test_accuracy']:.4f}"
                                     for row in new_rows[:4]))
      if after_round is not None:
        after_round(round_num, state)
    return state

  def _check_clients(self, out, round_num: int, m: int) -> None:
    if self.nonfinite.clients != "raise":
      return
    excluded = (np.asarray(out.mask) > 0) & ~np.asarray(out.finite)
    if excluded.any():
      member = f" (member {m})" if self.num_members > 1 else ""
      ids = np.asarray(out.client_ids)[excluded].tolist()
      raise NonFiniteError(
          f"round {round_num}{member}: clients {ids} returned non-finite "
          "models or losses (NonFinite(clients='raise'); 'exclude' drops "
          "them from the round instead)")


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
  _check_rounds(num_rounds)
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
      checkpointing, lambda: {
        "participation": participation, "training": training,
        "seed": seed, "evaluation": evaluation, "model": model,
        "aggregator": aggregator, "local_update": local_update,
        "nonfinite": nonfinite, "init_params": init_params,
        "privacy": privacy,
        "data": checkpoint.data_fingerprint(data),
        "test_data": checkpoint.data_fingerprint(test_data),
        "config": config}, state, run_key, num_rounds)
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
  base_config = {"num_rounds": num_rounds, "participation": participation,
                 "cohort_size": cohort_size,
                 "local_epochs": training.epochs,
                 "batch_size": training.batch_size,
                 "learning_rate": training.learning_rate,
                 "seed": seed, "num_clients": data.num_clients,
                 "num_classes": num_classes,
                 "num_devices": 1 if mesh is None else mesh.size}
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
