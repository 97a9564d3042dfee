"""The one run of S >= 1 members that every entry point executes.

A ``Plan`` describes a run of S members: grid points (hyperparameters that
``build`` turns into an aggregator and an optional objective) crossed with
seeds, over one ``FederatedData`` or one per seed, with the settings every
member shares. ``execute(plan)`` does everything a run does once, for one
member or S: the argument checks, the seeds' keys and the members' initial
states, the label checks, the privacy accounting (per member, from each
member's rule: ``fedjax_agg.accounting``), the checkpoint fingerprint
and resume, the evaluation of the clients' held-out splits (personalised
and fine-tuned accuracies; the test set and the clients' losses are
``evaluation.member_rows``, which both forms call), the round loop
(``loop.Driver``), and the histories with their recorded settings.

Only the round itself has two forms (``Plan.vmapped``; see
``fedjax_agg.round_forms``):

* unvmapped (``simulation.run``, S = 1): the member's cohort sharded over
  ``Execution.devices``, streaming, Poisson cohorts and per-client tables in
  host memory;
* vmapped (``sweep.run_sweep``): the S members' states stacked along a
  leading axis and every round ONE ``jax.vmap`` of the member round with
  the grid values as traced scalars, the member axis sharded over the
  devices. Options that need a per-member cohort size (Poisson sampling)
  or a host table are refused there with a clear error, never dropped.
"""

import dataclasses
import sys
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import accounting
from fedjax_agg import aggregators
from fedjax_agg import clients as clients_lib
from fedjax_agg import clock
from fedjax_agg import config as config_lib
from fedjax_agg import distributed
from fedjax_agg import engine
from fedjax_agg import loop
from fedjax_agg import round_forms
from fedjax_agg import rounds
from fedjax_agg import run_context
from fedjax_agg.config import LocalTraining
from fedjax_agg.federated import FederatedData
from fedjax_agg.history import History
from fedjax_agg.options import RunOptions
from fedjax_agg.types import Aggregator, LocalObjective, Model, RunContext

__all__ = ["CLIENT_LEARNING_RATE", "Member", "Plan", "execute", "parts"]

CLIENT_LEARNING_RATE = "learning_rate"
"""The grid name that also sets the members' client learning rate."""


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Plan:
  """A run of S members (grid point x seed), as ``execute`` runs it.

  Attributes:
    model: the network and its task loss.
    data: one ``FederatedData`` per seed, or one shared by every seed.
    test_data: (x, y) test arrays.
    build: ``build(hparams) -> Aggregator or (Aggregator, objective or
      None)``; called with each grid point's concrete numbers (and, when
      vmapped, with traced float32 scalars inside the round).
    points: the grid points (``[{}]`` without a grid).
    seeds: the seeds; members are (point, seed), points outer.
    options: the settings every member shares (``options.RunOptions``).
    callbacks: per member, the callables called with its rows.
    vmapped: step the members as one vmapped round (``sweep``); else one
      member, unvmapped (``simulation.run``).
  """
  model: Model
  data: Sequence[FederatedData]
  test_data: tuple[Any, Any]
  build: Callable[[dict], Any]
  points: Sequence[dict] = ({},)
  seeds: Sequence[int] = (0,)
  options: RunOptions
  callbacks: Sequence[Sequence[loop.Callback]] = ((),)
  vmapped: bool = False

  def parts_of(self, hparams: dict):
    """``build(hparams)`` as (aggregator, objective or None), the rule
    bound to what the run fixes (``run_context.bind``)."""
    aggregator, objective = parts(self.build(dict(hparams)))
    return run_context.bind(aggregator, self.context(hparams, objective)), \
        objective

  @property
  def cohort_size(self) -> int:
    """m, the clients drawn a round: computed once for the run (every
    member and round reads this)."""
    # The plan is frozen: the value is cached in its __dict__ on first use.
    if "_cohort_size" not in self.__dict__:
      object.__setattr__(self, "_cohort_size", rounds.num_sampled(
          self.data[0].num_clients, self.options.participation))
    return self.__dict__["_cohort_size"]

  def context(self, hparams: dict, objective=None) -> RunContext:
    """What this run fixes for a member of grid point ``hparams``."""
    training = self.training_of(hparams, objective)
    num_clients = self.data[0].num_clients
    cohort_size = self.cohort_size
    privacy = self.options.privacy
    local_update = self.options.local_update
    term = training.objective
    return RunContext(
        num_clients=num_clients, cohort_size=cohort_size,
        # A Poisson cohort's size varies by round; DP-FedAvg divides by its
        # expectation q N (here m), which does not depend on who was drawn.
        expected_clients=(float(cohort_size) if privacy is not None
                          and privacy.sampling == "poisson" else None),
        learning_rate=training.learning_rate,
        momentum=config_lib.sgd_momentum(training.optimizer),
        proximal_mu=0.0 if term is None else term.proximal_mu,
        client_side=dict(local_update.shared) if local_update is not None
        else {},
        batch_size=training.batch_size,
        # The largest client over every seed's data: one bound that holds for
        # each member of the run.
        max_examples=max(int(np.max(np.asarray(data.num_examples)))
                         for data in self.data))

  @property
  def members(self) -> list[tuple[int, int]]:
    """(point index, seed index) of each member, points outer."""
    return [(p, s) for p in range(len(self.points))
            for s in range(len(self.seeds))]

  def training_of(self, point: dict, objective=None) -> LocalTraining:
    """The member's training: the grid's client learning rate and the
    objective its rule comes with."""
    return dataclasses.replace(
        self.options.training,
        learning_rate=point.get(CLIENT_LEARNING_RATE,
                                self.options.training.learning_rate),
        objective=objective or self.options.training.objective)


class Member(NamedTuple):
  """One member's result: its grid point, seed, history and final state."""
  hparams: dict
  seed: int
  history: History
  state: rounds.ServerState


def parts(built) -> tuple[Aggregator, Optional[LocalObjective]]:
  """``build``'s result as (aggregator, objective or None)."""
  if isinstance(built, Aggregator):
    return built, None
  if (isinstance(built, tuple) and len(built) == 2
      and isinstance(built[0], Aggregator)
      and (built[1] is None or isinstance(built[1], LocalObjective))):
    return built
  raise TypeError("build(hparams) must return an Aggregator or a tuple "
                  f"(Aggregator, LocalObjective or None), got {built!r:.80}")


def _check_per_client_evaluation(plan: Plan) -> None:
  evaluation = plan.options.evaluation
  if not evaluation.per_client:
    return
  if any(data.validation is None for data in plan.data):
    raise ValueError(
        "evaluation: personalized / finetune_steps evaluate on the clients' "
        "held-out split, but data has no validation split (use "
        "validation.holdout_split and FederatedData.with_validation)")
  if evaluation.personalized and getattr(
      plan.options.local_update, "personalize", None) is None:
    raise ValueError(
        "evaluation.personalized=True needs a local_update with personal "
        "models (a LocalUpdate with personalize, e.g. clients.ditto or "
        "clients.fedbn); use finetune_steps for fine-tuned global models")


def _client_state(plan: Plan, params, num_clients: int):
  """The client side's initial state (the codec's residuals with it)."""
  local_update = plan.options.local_update
  wrap = clock.uplink(plan.options.systems, params)
  if wrap is not None:
    # Only ``init`` is read: the engine's own trainer (None) is stateless.
    local_update = wrap(local_update or rounds.stateless(lambda *a: None))
  if not isinstance(local_update, rounds.LocalUpdate):
    return ()
  return local_update.init(num_clients)


def _global_for_all(client_state, params, client_ids):
  """The global model as every listed client's model. -> [R, ...]."""
  del client_state
  return jax.tree.map(
      lambda a: jnp.broadcast_to(a, client_ids.shape + a.shape), params)


def execute(plan: Plan) -> list[Member]:
  """Runs ``plan``'s members. -> one ``Member`` per (point, seed).

  In order: the plan's checks; each grid point's rule (with the systems
  layer's server rule); the privacy accounting (which may set R); the
  members' initial states; the labels' checks; the checkpoint (its
  fingerprint refused or its snapshot resumed); the round's form; the
  driver's loop; each member's result.
  """
  options = plan.options
  _check_per_client_evaluation(plan)
  clock.check(options.systems, vmapped=plan.vmapped, privacy=options.privacy,
              local_update=options.local_update,
              stream=options.execution.stream)
  cohort_size = plan.cohort_size
  built = [(clock.server_rule(options.systems, aggregator, cohort_size,
                              plan.data[0]), objective)
           for aggregator, objective in map(plan.parts_of, plan.points)]
  keys = [loop.seed_keys(s) for s in plan.seeds]
  # The accounting comes before the states and the checkpoint: a target epsilon
  # may set R, which the checkpoint is checked against.
  accounts = accounting.account(
      options, plan.members, plan.vmapped, plan.data[0].num_clients, built,
      cohort_size, [run_key for _, run_key in keys])
  num_rounds = accounts.num_rounds
  state, run_keys, first_params = _initial_state(plan, built, keys)
  # The classes are read off the model's outputs, so this needs the initial
  # params.
  num_classes = _check_labels(plan, first_params)
  run_key = jnp.stack(run_keys) if plan.vmapped else run_keys[0]
  checkpointer, snapshot = loop.open_checkpoints(
      options.checkpointing, lambda: _fingerprint(plan, built, accounts),
      state, run_key, num_rounds)
  if snapshot is not None:
    state = snapshot.state
    if not plan.vmapped:
      run_key = snapshot.run_key
      run_keys = [run_key]
  form = (round_forms.vmapped if plan.vmapped
          else round_forms.unvmapped)(
      plan, state, built, cohort_size, accounts, run_keys, num_rounds,
      num_classes)
  driver = _driver(plan, form, built, accounts, run_keys, num_rounds)
  rows, client_rows = _first_rows(plan, driver, form.state, snapshot,
                                  num_rounds)
  # One Checkpoints callback saves every member: ``after_round`` gets the
  # whole state, and ``pack`` the rows of all members.
  if checkpointer is not None:
    pack = round_forms.pack_rows if plan.vmapped else (
        lambda rows, client_rows: (rows[0], client_rows[0]))
    driver.callbacks[0].append(loop.Checkpoints(
        checkpointer, run_key, num_rounds, rows, client_rows, pack))
  # Rows hold round 0 (the initial evaluation), so a resumed run restarts after
  # round len - 1.
  state = driver.loop(form.state, len(rows[0]) - 1, num_rounds, rows,
                      client_rows)
  stopped = driver.stop_record()
  return [Member(dict(plan.points[p]), int(plan.seeds[s]),
                 History(rows[m], client_rows[m],
                         _recorded_config(plan, m, accounts, cohort_size,
                                          num_classes, form.num_devices,
                                          stopped)),
                 form.member_state(state, m))
          for m, (p, s) in enumerate(plan.members)]


def _initial_state(plan: Plan, built, keys):
  """The members' initial server states (stacked when vmapped), their run
  keys, and the first member's initial params."""
  states, run_keys = [], []
  for p, s in plan.members:
    # Keys depend on the seed only: every grid point of a seed starts from the
    # same model and draws the same cohorts, so members differ by the rule.
    init_key, run_key = keys[s]
    params = (plan.model.init(init_key) if plan.options.init_params is None
              else plan.options.init_params)
    client_state = _client_state(plan, params, plan.data[0].num_clients)
    _check_host_table(plan, client_state)
    states.append(rounds.init_state(
        params, built[p][0], client_state=client_state)._replace(
            key=run_key))
    run_keys.append(run_key)
  if plan.vmapped:
    _check_same_shapes(plan, states)
    # Stacking copies: the caller's init_params stay valid.
    return round_forms.stack(states), run_keys, states[0].params
  # Rounds donate their input state; copy it so that the caller's
  # ``init_params`` (which the state may alias) stay valid.
  return jax.tree.map(jnp.copy, states[0]), run_keys, states[0].params


def _check_labels(plan: Plan, params) -> int:
  """The model's number of classes, every label set checked against it."""
  test_x, test_y = (jnp.asarray(a) for a in plan.test_data)
  num_classes = loop.num_classes_of(plan.model, params, test_x)
  loop.check_labels(test_y, num_classes, "test_data")
  loop.check_labels(plan.data[0].y, num_classes,
                    "data (the clients' training labels)")
  for item in plan.options.evaluation.extra:
    loop.check_labels(jnp.asarray(item.y), num_classes,
                      f"Evaluation.extra {item.name!r}")
  return num_classes


def _driver(plan: Plan, form, built, accounts: accounting.Accounts, run_keys,
            num_rounds: int) -> loop.Driver:
  """The loop over rounds of ``form``: its evaluation (the form's rows,
  then the clients' held-out splits) and callbacks (privacy first)."""
  options = plan.options
  held_out = _held_out_evaluation(plan, built, run_keys, form.device)

  def evaluate(state, with_clients):
    rows = form.evaluate(state, with_clients)
    if with_clients and held_out is not None:
      for m, row in enumerate(rows):
        row.update(held_out(form.member_state(state, m), m))
    return rows

  return loop.Driver(
      round_step=form.round_step, sample=form.sample, evaluate=evaluate,
      member_output=form.member_output, member_state=form.member_state,
      num_members=len(plan.members), nonfinite=options.nonfinite,
      evaluation=options.evaluation, progress=options.execution.progress,
      # Privacy callbacks first: the others see the ``epsilon`` column.
      callbacks=[accounting.callbacks(accounts, m, num_rounds) + list(c)
                 for m, c in enumerate(plan.callbacks)],
      with_losses=options.training.losses_for(any(
          b[0].uses_losses for b in built)))


def _first_rows(plan: Plan, driver: loop.Driver, state, snapshot,
                num_rounds: int):
  """Each member's rows before the loop: the initial evaluation, or a
  resumed checkpoint's rows (replayed to the callbacks)."""
  if snapshot is None:
    rows = [[row] for row in driver.initial_rows(state, num_rounds)]
    return rows, [[] for _ in plan.members]
  rows, client_rows = (
      round_forms.unpack_rows(snapshot.rows, snapshot.client_rows,
                              len(plan.members)) if plan.vmapped
      else ([snapshot.rows], [snapshot.client_rows]))
  driver.replay(rows, client_rows)
  done = len(rows[0]) - 1  # say where the run picks up
  print(f"resumed from round {done} of {num_rounds}" + (
      " (already finished)" if done >= num_rounds else ""),
        file=sys.stderr, flush=True)
  return rows, client_rows


def _recorded_config(plan: Plan, m: int, accounts: accounting.Accounts,
                     cohort_size: int, num_classes: int, num_devices: int,
                     stopped: dict) -> dict:
  """Member ``m``'s history config: the settings of its run, its grid
  point in a sweep, its privacy and systems, the entry point's own."""
  p, s = plan.members[m]
  options, point = plan.options, plan.points[p]
  extra = ({"sweep_size": len(plan.members), "sweep_hparams": dict(point)}
           if plan.vmapped else {})
  extra.update(stopped)
  if accounts.privacy[m] is not None:
    extra["privacy"] = {
        **dataclasses.asdict(accounts.privacy[m]),
        **{k: v for k, v in accounts.accounting[m].items()
           if k != "epsilons"}}
  if options.systems is not None:
    extra["systems"] = dataclasses.asdict(options.systems)
    if options.systems.asynchronous:  # the resolved default
      extra["systems"]["max_staleness"] = options.systems.num_versions(
          cohort_size) - 1
  extra.update(options.config or {})
  return loop.base_config(
      num_rounds=accounts.num_rounds, participation=options.participation,
      cohort_size=cohort_size, training=options.training,
      learning_rate=plan.training_of(point).learning_rate,
      seed=plan.seeds[s], num_clients=plan.data[0].num_clients,
      num_classes=num_classes, num_devices=num_devices, extra=extra)


def _check_host_table(plan: Plan, client_state) -> None:
  if not clients_lib.uses_host_table(client_state):
    return
  if plan.vmapped:
    raise ValueError(
        "local_update: a per-client table in host memory "
        "(placement='host') cannot be vmapped over sweep members; use "
        "placement='device' or simulation.run per member")
  if plan.options.checkpointing is not None:
    raise ValueError(
        "checkpointing: the local update keeps its per-client table in host "
        "memory (placement='host'), outside the server state, so the run "
        "cannot be checkpointed; use placement='device' or no checkpoints")


def _check_same_shapes(plan: Plan, states) -> None:
  shapes = [jax.tree.map(jnp.shape, st.aggregator_state) for st in states]
  for (p, _), shape in zip(plan.members, shapes, strict=True):
    if (jax.tree.structure(shape) != jax.tree.structure(shapes[0])
        or shape != shapes[0]):
      raise ValueError(
          f"the aggregator state of grid point {plan.points[p]} differs in "
          f"shape from that of {plan.points[0]}: those hyperparameters set "
          "shapes and cannot be swept in one call")


def _fingerprint(plan: Plan, built, accounts: accounting.Accounts) -> dict:
  """What a checkpoint must match (``loop.fingerprint``): a run's seed,
  rule and privacy; a sweep's build, grid and seeds (and privacy)."""
  if plan.vmapped:
    specific = {"sweep": {"build": plan.build, "grid": list(plan.points),
                          "seeds": list(plan.seeds)}}
    if plan.options.privacy is not None:
      specific["privacy"] = accounts.privacy
  else:
    specific = {"seed": plan.seeds[0], "aggregator": built[0][0],
                "privacy": accounts.privacy[0]}
  if plan.options.systems is not None:
    specific["systems"] = plan.options.systems
    # The trace files' contents, not only their paths: an edited trace must
    # refuse the resume.
    specific["systems_traces"] = clock.trace_fingerprint(plan.options.systems)
  data = list(plan.data) if len(plan.data) > 1 else plan.data[0]
  options = plan.options
  return loop.fingerprint(
      model=plan.model, data=data, test_data=plan.test_data,
      participation=options.participation, training=options.training,
      evaluation=options.evaluation, nonfinite=options.nonfinite,
      local_update=options.local_update, init_params=options.init_params,
      config=options.config, **specific)


def _held_out_evaluation(plan: Plan, built, run_keys, device):
  """``(member state, m) -> row`` of accuracies on the clients' held-out
  splits (``config.Evaluation``), or None when not asked for."""
  evaluation, model = plan.options.evaluation, plan.model
  if not evaluation.per_client:
    return None
  # One trainer per grid point, built on first use: a new one every evaluation
  # would compile again.
  trainers = {}
  # Each seed's data on the evaluation device, copied once for the run.
  local_data = [distributed.local_copy(data, device) for data in plan.data]

  def held_out(state, m):
    p, s = plan.members[m]
    data = local_data[s if len(local_data) > 1 else 0]
    params = distributed.local_copy(
        aggregators.eval_params(state.aggregator_state, state.params),
        device)
    row = clients_lib.summarize(
        "global_accuracy", clients_lib.personal_accuracies(
            model, _global_for_all, (), params, data.validation))
    if evaluation.personalized:
      row.update(clients_lib.summarize(
          "personal_accuracy", clients_lib.personal_accuracies(
              model, plan.options.local_update.personalize,
              distributed.local_copy(state.client_state, device), params,
              data.validation)))
    if evaluation.finetune_steps:
      training = plan.training_of(plan.points[p], built[p][1])
      if p not in trainers:
        trainers[p] = engine.make_local_trainer(model, training)
      row.update(clients_lib.summarize(
          "finetuned_accuracy", clients_lib.finetuned_accuracies(
              model, training, params, data, evaluation.finetune_steps,
              # A key of its own per round, from the run key: apart from the
              # keys the rounds draw from the state's key.
              jax.random.fold_in(run_keys[m], int(state.round)),
              trainer=trainers[p])))
    return row

  return held_out

