"""The one run of S >= 1 members that every entry point executes.

A ``Plan`` describes a run of S members: grid points (hyperparameters that
``build`` turns into an aggregator and an optional objective) crossed with
seeds, over one ``FederatedData`` or one per seed, with the settings every
member shares. ``execute(plan)`` does everything a run does once, for one
member or S: the argument checks, the seeds' keys and the members' initial
states, the label checks, the privacy accounting (per member, from each
member's rule), the checkpoint fingerprint and resume, the evaluation of
the test set, of the clients' data and of their held-out splits
(personalised and fine-tuned accuracies), the round loop
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
import warnings
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import clients as clients_lib
from fedjax_agg import clock
from fedjax_agg import config as config_lib
from fedjax_agg import distributed
from fedjax_agg import engine
from fedjax_agg import evaluation as evaluation_lib
from fedjax_agg import loop
from fedjax_agg import privacy as privacy_lib
from fedjax_agg import round_forms
from fedjax_agg import rounds
from fedjax_agg import run_context
from fedjax_agg.config import (LocalTraining, Privacy)
from fedjax_agg.federated import FederatedData
from fedjax_agg.history import History
from fedjax_agg.options import RunOptions
from fedjax_agg.types import Aggregator, LocalObjective, Model, RunContext

__all__ = ["CLIENT_LEARNING_RATE", "Member", "Plan", "execute", "parts",
           "resolve_privacy"]

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

  def context(self, hparams: dict, objective=None) -> RunContext:
    """What this run fixes for a member of grid point ``hparams``."""
    training = self.training_of(hparams, objective)
    num_clients = self.data[0].num_clients
    cohort_size = rounds.num_sampled(num_clients, self.options.participation)
    privacy = self.options.privacy
    local_update = self.options.local_update
    term = training.objective
    return RunContext(
        num_clients=num_clients, cohort_size=cohort_size,
        expected_clients=(float(cohort_size) if privacy is not None
                          and privacy.sampling == "poisson" else None),
        learning_rate=training.learning_rate,
        momentum=config_lib.sgd_momentum(training.optimizer),
        proximal_mu=0.0 if term is None else term.proximal_mu,
        client_side=dict(local_update.shared) if local_update is not None
        else {},
        batch_size=training.batch_size,
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


def resolve_privacy(privacy: Optional[Privacy], aggregator: Aggregator,
                    cohort_size: int) -> Optional[Privacy]:
  """``privacy`` with the noise multiplier of the rule that adds the noise.

  The accounting is derived from ``aggregator.noise_multiplier``, never
  taken on trust: a rule that adds no calibrated Gaussian noise, a stated
  ``Privacy.noise_multiplier`` that differs from the rule's, Poisson
  sampling with a rule that divides by the realised cohort size (its noise
  then depends on who was drawn) and Poisson sampling with a rule whose
  noise is tree-aggregated (``aggregators.TreeAggregationNoise``, DP-FTRL:
  accounted from the participations in its fixed-size cohorts) are
  refused.

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
  if privacy.sampling == "poisson" and isinstance(
      aggregator.noise_multiplier, aggregators.TreeAggregationNoise):
    raise ValueError(
        "privacy.sampling='poisson': the aggregator adds its noise by tree "
        "aggregation (DP-FTRL), whose accounting takes no amplification by "
        "sampling; it counts how often each client takes part in the run's "
        "fixed-size cohorts: use sampling='without_replacement'")
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


def _accounting(privacy: Optional[Privacy], num_clients: int,
                cohort_size: int, num_rounds: int, tree=None) -> dict:
  """Epsilon after each round, and where the target ends the run (the
  Poisson rate is q = m / N, as the sampler draws). ``tree``: (rounds per
  tree or None, the [R, m] cohorts the run draws) for a rule whose noise
  is tree-aggregated, accounted from those cohorts."""
  if privacy is None or num_rounds == 0:
    return {}
  if tree is None:
    epsilons = privacy_lib.epsilons(
        privacy.noise_multiplier, num_rounds, num_clients=num_clients,
        delta=privacy.delta, sampling=privacy.sampling,
        accountant=privacy.accountant, cohort_size=cohort_size)
  else:
    restart_every, cohorts = tree
    epsilons = privacy_lib.tree_epsilons(
        privacy.noise_multiplier, cohorts, delta=privacy.delta,
        restart_every=restart_every)
  out = {"epsilons": epsilons, "requested_rounds": num_rounds}
  if privacy.target_epsilon is not None:
    allowed = int(np.sum(epsilons <= privacy.target_epsilon))
    if allowed == 0:
      raise ValueError(
          f"privacy: a single round already costs epsilon="
          f"{epsilons[0]:.4g} > target_epsilon={privacy.target_epsilon}")
    if allowed < num_rounds:
      out["rounds_run"] = allowed
      out["stopped_by"] = "target_epsilon"
  out["final_epsilon"] = float(epsilons[out.get("rounds_run",
                                                num_rounds) - 1])
  if tree is not None:
    restart_every, cohorts = tree
    out.update(mechanism="tree_aggregation", neighboring_relation="zero_out",
               restart_every=restart_every,
               max_participations=int(privacy_lib.tree_participations(
                   cohorts[:out.get("rounds_run", num_rounds)],
                   restart_every).max()))
  return out


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


class _Accounts(NamedTuple):
  privacy: list  # per member: the resolved Privacy or None
  accounting: list  # per member: _accounting's dict
  num_rounds: int  # the rounds the run makes (target epsilon may end it)


def _account(plan: Plan, built, cohort_size: int, run_keys) -> _Accounts:
  """Every member's privacy, resolved from its own rule, and accounting
  (``run_keys``: per seed; a tree-aggregation rule is accounted from the
  cohorts its seed draws)."""
  num_clients = plan.data[0].num_clients
  if plan.vmapped and isinstance(plan.options.privacy, Privacy) and (
      plan.options.privacy.sampling == "poisson"):
    raise ValueError(
        "privacy.sampling='poisson' draws a cohort of random size each "
        "round, which members stepped as one vmapped call cannot share; "
        "use sampling='fixed' in a sweep, or run the members one at a time")
  resolved = [resolve_privacy(plan.options.privacy, built[p][0], cohort_size)
              for p, _ in plan.members]
  cache, cohorts = {}, {}
  accounting = []
  for (p, s), privacy in zip(plan.members, resolved, strict=True):
    rule_z = built[p][0].noise_multiplier
    tree = None
    if privacy is not None and isinstance(
        rule_z, aggregators.TreeAggregationNoise) and plan.options.num_rounds:
      if s not in cohorts:
        cohorts[s] = loop.drawn_cohorts(
            run_keys[s], plan.options.num_rounds, num_clients, cohort_size,
            plan.options.execution.sampler)
      tree = (rule_z.restart_every, cohorts[s])
    key = None if privacy is None else (
        privacy.noise_multiplier,
        None if tree is None else (tree[0], s))
    if key not in cache:
      cache[key] = _accounting(privacy, num_clients, cohort_size,
                               plan.options.num_rounds, tree)
    accounting.append(cache[key])
  ends = {a.get("rounds_run", plan.options.num_rounds) for a in accounting}
  if len(ends) > 1:
    raise ValueError(
        f"privacy.target_epsilon: the members reach the target after "
        f"different numbers of rounds {sorted(ends)} (their rules add "
        "different noise); members stepped together must run as many "
        "rounds: run them one at a time")
  end = ends.pop()
  if end < plan.options.num_rounds:
    warnings.warn(
        f"privacy: epsilon passes target_epsilon="
        f"{plan.options.privacy.target_epsilon} after round {end}; the run "
        f"ends there instead of at round {plan.options.num_rounds}",
        stacklevel=4)
  return _Accounts(resolved, accounting, end)


def _privacy_callbacks(accounts: _Accounts, m: int,
                       num_rounds: int) -> list:
  """Member ``m``'s ``loop.PrivacyAccounting`` callback, or none."""
  accounting = accounts.accounting[m]
  if "epsilons" not in accounting:
    return []
  final = accounting.get("rounds_run")
  return [loop.PrivacyAccounting(accounting["epsilons"],
                                 final_round=final or num_rounds)]


def _global_for_all(client_state, params, client_ids):
  """The global model as every listed client's model. -> [R, ...]."""
  del client_state
  return jax.tree.map(
      lambda a: jnp.broadcast_to(a, client_ids.shape + a.shape), params)


def execute(plan: Plan) -> list[Member]:
  """Runs ``plan``'s members. -> one ``Member`` per (point, seed)."""
  options = plan.options
  _check_per_client_evaluation(plan)
  clock.check(options.systems, vmapped=plan.vmapped, privacy=options.privacy,
              local_update=options.local_update,
              stream=options.execution.stream)
  model, members = plan.model, plan.members
  built = [plan.parts_of(point) for point in plan.points]
  num_clients = plan.data[0].num_clients
  cohort_size = rounds.num_sampled(num_clients, plan.options.participation)
  built = [(clock.server_rule(plan.options.systems, aggregator, cohort_size,
                              plan.data[0]), objective)
           for aggregator, objective in built]
  keys = [loop.seed_keys(s) for s in plan.seeds]
  accounts = _account(plan, built, cohort_size,
                      [run_key for _, run_key in keys])
  num_rounds = accounts.num_rounds
  states, run_keys = [], []
  for p, s in members:
    init_key, run_key = keys[s]
    params = (model.init(init_key) if plan.options.init_params is None
              else plan.options.init_params)
    client_state = _client_state(plan, params, num_clients)
    _check_host_table(plan, client_state)
    states.append(rounds.init_state(
        params, built[p][0], client_state=client_state)._replace(
            key=run_key))
    run_keys.append(run_key)
  if plan.vmapped:
    _check_same_shapes(plan, states)
    # Stacking copies: the caller's init_params stay valid.
    state, run_key = round_forms.stack(states), jnp.stack(run_keys)
  else:
    # Rounds donate their input state; copy it so that the caller's
    # ``init_params`` (which the state may alias) stay valid.
    state, run_key = jax.tree.map(jnp.copy, states[0]), run_keys[0]
  test_x, test_y = (jnp.asarray(a) for a in plan.test_data)
  num_classes = loop.num_classes_of(model, states[0].params, test_x)
  loop.check_labels(test_y, num_classes, "test_data")
  loop.check_labels(plan.data[0].y, num_classes,
                    "data (the clients' training labels)")
  checkpointer, snapshot = loop.open_checkpoints(
      plan.options.checkpointing, lambda: _fingerprint(plan, built, accounts),
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
  held_out = _held_out_evaluation(plan, built, run_keys, form.device)
  extra = _extra_evaluation(plan, num_classes, form.device)

  def evaluate(state, with_clients):
    rows = form.evaluate(state, with_clients)
    for m, row in enumerate(rows):
      member = form.member_state(state, m)
      row.update(extra(member))
      if with_clients and held_out is not None:
        row.update(held_out(member, m))
    return rows

  driver = loop.Driver(
      round_step=form.round_step, sample=form.sample, evaluate=evaluate,
      member_output=form.member_output, member_state=form.member_state,
      num_members=len(members), nonfinite=options.nonfinite,
      evaluation=options.evaluation, progress=options.execution.progress,
      callbacks=[_privacy_callbacks(accounts, m, num_rounds) + list(c)
                 for m, c in enumerate(plan.callbacks)],
      with_losses=plan.options.training.losses_for(any(
          b[0].uses_losses for b in built)))
  state = form.state
  pack = round_forms.pack_rows if plan.vmapped else (
      lambda rows, client_rows: (rows[0], client_rows[0]))
  if snapshot is None:
    rows = [[row] for row in driver.initial_rows(state, num_rounds)]
    client_rows = [[] for _ in members]
  else:
    rows, client_rows = (
        round_forms.unpack_rows(snapshot.rows, snapshot.client_rows,
                                len(members)) if plan.vmapped
        else ([snapshot.rows], [snapshot.client_rows]))
    driver.replay(rows, client_rows)
    done = len(rows[0]) - 1  # say where the run picks up
    print(f"resumed from round {done} of {num_rounds}" + (
        " (already finished)" if done >= num_rounds else ""),
          file=sys.stderr, flush=True)
  if checkpointer is not None:
    driver.callbacks[0].append(loop.Checkpoints(
        checkpointer, run_key, num_rounds, rows, client_rows, pack))
  state = driver.loop(state, len(rows[0]) - 1, num_rounds, rows,
                      client_rows)
  results = []
  for m, (p, s) in enumerate(members):
    point = plan.points[p]
    extra = ({"sweep_size": len(members), "sweep_hparams": dict(point)}
             if plan.vmapped else {})
    extra.update(driver.stop_record())
    if accounts.privacy[m] is not None:
      extra["privacy"] = {
          **dataclasses.asdict(accounts.privacy[m]),
          **{k: v for k, v in accounts.accounting[m].items()
             if k != "epsilons"}}
    if plan.options.systems is not None:
      extra["systems"] = dataclasses.asdict(plan.options.systems)
      if plan.options.systems.asynchronous:  # the resolved default
        extra["systems"]["max_staleness"] = plan.options.systems.num_versions(
            cohort_size) - 1
    extra.update(plan.options.config or {})
    config = loop.base_config(
        num_rounds=num_rounds, participation=plan.options.participation,
        cohort_size=cohort_size, training=plan.options.training,
        learning_rate=plan.training_of(point).learning_rate,
        seed=plan.seeds[s], num_clients=num_clients, num_classes=num_classes,
        num_devices=form.num_devices, extra=extra)
    results.append(Member(
        dict(point), int(plan.seeds[s]),
        History(rows[m], client_rows[m], config),
        form.member_state(state, m)))
  return results


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


def _fingerprint(plan: Plan, built, accounts: _Accounts) -> dict:
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
    specific["systems_traces"] = clock.trace_fingerprint(plan.options.systems)
  data = list(plan.data) if len(plan.data) > 1 else plan.data[0]
  options = plan.options
  return loop.fingerprint(
      model=plan.model, data=data, test_data=plan.test_data,
      participation=options.participation, training=options.training,
      evaluation=options.evaluation, nonfinite=options.nonfinite,
      local_update=options.local_update, init_params=options.init_params,
      config=options.config, **specific)


def _extra_evaluation(plan: Plan, num_classes: int, device):
  """``member state -> {name: accuracy}`` on ``Evaluation.extra``."""
  sets = [(item.name, jnp.asarray(item.x), jnp.asarray(item.y))
          for item in plan.options.evaluation.extra]
  for name, _, y in sets:
    loop.check_labels(y, num_classes, f"Evaluation.extra {name!r}")

  def scores(state):
    if not sets:
      return {}
    params = distributed.local_copy(
        aggregators.eval_params(state.aggregator_state, state.params),
        device)
    return {name: evaluation_lib.evaluate(
        plan.model, params, x, y, num_classes,
        plan.options.evaluation.batch_size)["accuracy"] for name, x, y in sets}

  return scores


def _held_out_evaluation(plan: Plan, built, run_keys, device):
  """``(member state, m) -> row`` of accuracies on the clients' held-out
  splits (``config.Evaluation``), or None when not asked for."""
  evaluation, model = plan.options.evaluation, plan.model
  if not evaluation.per_client:
    return None
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
              jax.random.fold_in(run_keys[m], int(state.round)),
              trainer=trainers[p])))
    return row

  return held_out

