"""Sweeps: S runs of one experiment as one vmapped, jitted round.

A sweep runs S members that differ only in their seed and in numeric
hyperparameters (FedAdp's alpha, FedNNNN's beta and gamma, FedProx's mu,
FedLap's q, a server optimizer's learning rate, the client learning rate,
...). Their server states are stacked along a leading member axis [S, ...]
and every round is ONE jitted call: ``jax.vmap`` over the members of the
round that ``simulation.make_round_fn`` builds, with the members'
hyperparameters as traced scalars. Evaluation of the S global models is
vmapped too.

Each member is exactly the run ``simulation.run`` would do with its seed and
hyperparameters: its own model init, cohorts and shuffles from its seed, the
same History rows and client rows. Results equal the separate runs to float
tolerance (batched matmuls may sum in another order).

What can be swept. ``build(hparams) -> (aggregator, objective or None)``
is called once per grid point with concrete numbers (running the
factories' checks, so a bad value raises their ``ValueError`` naming the
argument, before anything runs) and once more inside the vmapped round with
traced float32 scalars. A hyperparameter can be swept when the factory only
computes with it (``fedjax_agg.checks`` lets traced values through the range
checks); one that sets a shape (a cohort size, a number of layers) or
selects code by a Python test cannot, and gives a tracer error. The members'
aggregator states must have the same shapes. The grid name
``"learning_rate"`` (``CLIENT_LEARNING_RATE``) also sets the members'
client learning rate; it is passed to ``build`` as well.

Data. Members share one ``FederatedData``, or each seed has its own (a
partition drawn from the seed, as ``experiment.run_config`` does): a list
aligned with ``seeds`` over the same pooled examples. The members'
``client_indices`` are then stacked, padded to the largest client (padding
changes no result: a client's shuffle and losses do not depend on the
padded width).

Devices and checkpoints. With several devices (``Execution.devices``) the
member axis is sharded over them (a multiple of their number of members);
checkpoints (``Checkpointing``) hold all members at once.
"""

import dataclasses
import itertools
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import checks
from fedjax_agg import clients
from fedjax_agg import distributed
from fedjax_agg import evaluation as evaluation_lib
from fedjax_agg import rounds
from fedjax_agg import loop
from fedjax_agg.config import (Checkpointing, Evaluation, Execution,
                               LocalTraining, NonFinite)
from fedjax_agg.federated import FederatedData
from fedjax_agg.history import History
from fedjax_agg.types import Aggregator, LocalObjective, Model, Params

__all__ = ["CLIENT_LEARNING_RATE", "SweepMember", "UntraceableGridError",
           "grid_points", "member_name", "run_sweep", "stack_data"]

CLIENT_LEARNING_RATE = "learning_rate"
MEMBER_AXIS = "members"

HParams = dict[str, Any]
Build = Callable[[HParams], Any]  # -> (Aggregator, LocalObjective | None)


class SweepMember(NamedTuple):
  """One member's result.

  Attributes:
    hparams: the member's grid point (name -> number).
    seed: its seed.
    history: the ``History`` that ``simulation.run`` gives.
    state: its final ``rounds.ServerState`` (no member axis).
  """
  hparams: HParams
  seed: int
  history: History
  state: rounds.ServerState


def grid_points(grid: Optional[Mapping[str, Sequence[float]]]
                ) -> list[HParams]:
  """The cartesian product of ``grid`` (the first name varies slowest).

  Args:
    grid: name -> non-empty sequence of numbers; None or {} gives [{}].

  Returns:
    One dict per point, values as given.
  """
  if not grid:
    return [{}]
  if not isinstance(grid, Mapping):
    raise TypeError(f"grid must be a dict name -> list of numbers, got "
                    f"{type(grid).__name__}")
  for name, values in grid.items():
    if not isinstance(name, str):
      raise TypeError(f"grid names must be strings, got {name!r}")
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) \
        or not values:
      raise ValueError(f"grid[{name!r}] must be a non-empty list of "
                       f"numbers, got {values!r}")
    for value in values:
      checks.check_range(f"grid[{name!r}]", value)
    # Members get their values as float32 scalars: two values that are one
    # float32 would be two identical members (and one output folder).
    as_float32 = [float(np.float32(value)) for value in values]
    for i, value in enumerate(as_float32):
      if value in as_float32[:i]:
        other = values[as_float32.index(value)]
        raise ValueError(
            f"grid[{name!r}] repeats a value: {other!r} and {values[i]!r} "
            "are the same float32 number (the members would be identical "
            "and share one output folder)")
  names = list(grid)
  return [dict(zip(names, point, strict=True))
          for point in itertools.product(*(grid[n] for n in names))]


def _number_name(value) -> str:
  """A grid value as a file name part: distinct float32 values give
  distinct names (``:g`` would write 5 and 5.0000001 both as "5")."""
  value = float(np.float32(value))
  if value.is_integer() and abs(value) < 1e15:
    return str(int(value))
  return repr(value)


def member_name(hparams: HParams, seed: int) -> str:
  """A member's name for files: ``alpha5_mu0.1_seed0``."""
  parts = [f"{name}{_number_name(value)}" for name, value in hparams.items()]
  return "_".join(parts + [f"seed{seed}"])


def _parts(built) -> tuple[Aggregator, Optional[LocalObjective]]:
  """``build``'s result as (aggregator, objective or None)."""
  if isinstance(built, Aggregator):
    return built, None
  if (isinstance(built, tuple) and len(built) == 2
      and isinstance(built[0], Aggregator)
      and (built[1] is None or isinstance(built[1], LocalObjective))):
    return built
  raise TypeError("build(hparams) must return an Aggregator or a tuple "
                  f"(Aggregator, LocalObjective or None), got {built!r:.80}")


def stack_data(data: Sequence[FederatedData]) -> FederatedData:
  """One seed's data per entry -> ``FederatedData`` with a member axis on
  ``client_indices`` [S, N, L] and ``num_examples`` [S, N].

  The entries must share the pooled ``x`` and ``y`` (kept once, no member
  axis) and the number of clients; index rows are padded to the largest L.
  """
  first = data[0]
  for i, other in enumerate(data):
    if not isinstance(other, FederatedData):
      raise TypeError(f"data[{i}] must be a FederatedData, got "
                      f"{type(other).__name__}")
    if other.num_clients != first.num_clients:
      raise ValueError(f"data[{i}] has {other.num_clients} clients, data[0] "
                       f"{first.num_clients}: the members must share N")
    for name in ("x", "y"):
      a, b = getattr(first, name), getattr(other, name)
      if a is not b and (a.shape != b.shape or not np.array_equal(
          np.asarray(a), np.asarray(b))):
        raise ValueError(
            f"data[{i}].{name} differs from data[0].{name}: the members "
            "must share the pooled examples (only the partition may differ)")
  width = max(d.max_examples for d in data)
  indices = jnp.stack([jnp.pad(d.client_indices,
                               ((0, 0), (0, width - d.max_examples)))
                       for d in data])
  counts = jnp.stack([d.num_examples for d in data])
  return FederatedData(first.x, first.y, indices, counts)


def _data_axes(stacked: bool) -> FederatedData:
  """vmap ``in_axes`` of the data: pooled arrays shared, indices per member
  when ``stacked``."""
  axis = 0 if stacked else None
  return FederatedData(None, None, axis, axis, None)


def _pack_rows(rows, client_rows):
  """Members' rows -> one row per round (as a checkpoint holds a run's):
  ``{"round": r, "members": [...]}`` and client rows keyed ``m:name``."""
  packed = [{"round": r, "members": [member[r] for member in rows]}
            for r in range(len(rows[0]))]
  packed_clients = [
      {f"{m}:{name}": value for m, member in enumerate(client_rows)
       for name, value in member[r].items()}
      for r in range(len(client_rows[0]))]
  return packed, packed_clients


def _unpack_rows(packed, packed_clients, num_members: int):
  """The inverse of ``_pack_rows``."""
  rows = [[row["members"][m] for row in packed] for m in range(num_members)]
  client_rows = [[] for _ in range(num_members)]
  for row in packed_clients:
    split = [{} for _ in range(num_members)]
    for key, value in row.items():
      m, name = key.split(":", 1)
      split[int(m)][name] = value
    for m in range(num_members):
      client_rows[m].append(split[m])
  return rows, client_rows


class UntraceableGridError(ValueError):
  """A grid argument that cannot be a traced value (it sets a shape or
  picks code by a Python test)."""


_TRACER_ERRORS = (jax.errors.ConcretizationTypeError,
                  jax.errors.TracerArrayConversionError,
                  jax.errors.TracerIntegerConversionError,
                  jax.errors.TracerBoolConversionError)


def _check_traceable(sweep_round, points, *arguments) -> None:
  """Traces the vmapped round once (no computation) before the first round,
  so that a grid argument that sets a shape is named up front."""
  try:
    jax.eval_shape(sweep_round, *arguments)
  except _TRACER_ERRORS as error:
    names = sorted(points[0])
    raise UntraceableGridError(
        f"grid: {names} cannot be swept in one vmapped call: a swept "
        "argument sets a shape or selects code by a Python test, so it "
        "cannot be a traced value ("
        f"{type(error).__name__}); run those values one at a time") from None


def _stack(trees):
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _member(tree, index: int):
  return jax.tree.map(lambda leaf: leaf[index], tree)


def run_sweep(
    build: Build,
    grid: Optional[Mapping[str, Sequence[float]]] = None,
    *,
    seeds: Sequence[int] = (0,),
    model: Model,
    data: FederatedData | Sequence[FederatedData],
    test_data: tuple[Any, Any],
    num_rounds: int,
    participation: float = 1.0,
    training: LocalTraining = LocalTraining(),
    execution: Execution = Execution(),
    evaluation: Evaluation = Evaluation(),
    nonfinite: NonFinite = NonFinite(),
    init_params: Optional[Params] = None,
    checkpointing: Optional[Checkpointing] = None,
    callbacks: Optional[Callable[[int], Sequence[Any]]] = None,
    config: Optional[dict] = None,
    local_update: Optional[rounds.LocalUpdate] = None,
) -> list[SweepMember]:
  """Runs every (grid point, seed) member as one vmapped computation.

  Args:
    build: ``build(hparams) -> (aggregator, objective or None)`` (or just
      an aggregator), e.g. ``lambda h: (aggregators.fedadp(h["alpha"],
      num_clients=N), None)``; called with concrete values to validate and
      with traced float32 scalars inside the round (module docstring).
      An objective it returns replaces ``training.objective``.
    grid: name -> list of numbers; the members are the cartesian product
      with ``seeds`` (grid points outer, seeds inner). None: seeds only.
    seeds: one member per seed and grid point; each seeds its model init,
      cohorts and shuffles as ``simulation.run(seed=...)``.
    model: the network.
    data: the federated training data shared by every member, or one per
      seed (aligned with ``seeds``, same pooled x and y).
    test_data: (x, y) test arrays.
    num_rounds, participation, training, evaluation, nonfinite,
      init_params, config: as ``simulation.run`` (``training.learning_rate``
      is the client rate of members whose grid has no "learning_rate").
    execution: as ``simulation.run``; with several ``devices`` the
      members are sharded over them (their number must be a multiple of
      the devices'); the rounds never stream.
    checkpointing: as ``simulation.run``: the stacked members' states and
      rows are saved together; a resume refuses another grid, seeds, data
      or settings, and a larger ``num_rounds`` extends the sweep.
    callbacks: ``callbacks(member_index) -> callables`` called with each of
      that member's rows (see ``simulation``).
    local_update: the client side shared by every member (e.g.
      ``clients.scaffold``); each member keeps its own client state (the
      per-client table gets the member axis) and the grid's
      "learning_rate" reaches it as the round's learning rates. None: the
      engine's training.

  Returns:
    One ``SweepMember`` per member, in the order of ``(grid point, seed)``.
    Each history's ``time_s`` is the wall time of the whole sweep's round.

  Raises:
    ValueError / TypeError: a bad grid, seed or data, a grid value the
      factories reject, or members whose aggregator states differ in shape.
  """
  loop.check_rounds(num_rounds)
  seeds = list(seeds)
  if not seeds:
    raise ValueError("seeds must be a non-empty list of ints")
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds must be distinct, got {seeds}")
  if evaluation.per_client:
    raise ValueError(
        "evaluation: personalized / finetune_steps are not computed for "
        "sweep members (their held-out evaluations are per run); run them "
        "with simulation.run, one member at a time")
  if local_update is not None and not isinstance(local_update,
                                                 rounds.LocalUpdate):
    raise TypeError(f"local_update must be a rounds.LocalUpdate, got "
                    f"{type(local_update).__name__}")
  keys = [loop.seed_keys(s) for s in seeds]
  per_seed_data = not isinstance(data, FederatedData)
  if per_seed_data:
    data = list(data)
    if len(data) != len(seeds):
      raise ValueError(f"data must be one FederatedData or one per seed "
                       f"({len(seeds)}), got {len(data)}")
  points = grid_points(grid)
  for value in (grid or {}).get(CLIENT_LEARNING_RATE, ()):
    checks.check_range(CLIENT_LEARNING_RATE, value, 0, low_open=True)
  # Concrete builds: the factories' checks run on every grid value here.
  built = [_parts(build(dict(point))) for point in points]
  members = [(p, s) for p in range(len(points)) for s in range(len(seeds))]

  member_data = data[0] if per_seed_data else data
  cohort_size = rounds.num_sampled(member_data.num_clients, participation)
  states, run_keys = [], []
  for p, s in members:
    init_key, run_key = keys[s]
    params = model.init(init_key) if init_params is None else init_params
    client_state = (() if local_update is None
                    else local_update.init(
                        (data[0] if per_seed_data else data).num_clients))
    if clients.uses_host_table(client_state):
      raise ValueError(
          "local_update: a per-client table in host memory "
          "(placement='host') cannot be vmapped over sweep members; use "
          "placement='device' or simulation.run per member")
    states.append(rounds.init_state(
        params, built[p][0], client_state=client_state)._replace(
            key=run_key))
    run_keys.append(run_key)
  shapes = [jax.tree.map(jnp.shape, st.aggregator_state) for st in states]
  for (p, _), shape in zip(members, shapes, strict=True):
    if (jax.tree.structure(shape) != jax.tree.structure(shapes[0])
        or shape != shapes[0]):
      raise ValueError(
          f"the aggregator state of grid point {points[p]} differs in shape "
          f"from that of {points[0]}: those hyperparameters set shapes and "
          "cannot be swept in one call")
  state = _stack(states)
  run_key = jnp.stack(run_keys)
  checkpointer, snapshot = loop.open_checkpoints(
      checkpointing, lambda: loop.fingerprint(
          model=model, data=data, test_data=test_data,
          participation=participation, training=training,
          evaluation=evaluation, nonfinite=nonfinite,
          local_update=local_update, init_params=init_params, config=config,
          sweep={"build": build, "grid": points, "seeds": seeds}),
      state, run_key, num_rounds)
  if snapshot is not None:
    state = snapshot.state
  mesh, _ = distributed.round_mesh(execution.devices,
                                   axis_name=MEMBER_AXIS)
  if mesh is not None and len(members) % mesh.size:
    raise ValueError(
        f"execution.devices: the {len(members)} members must be a multiple "
        f"of the {mesh.size} devices they are sharded over")
  by_member = (lambda tree: tree) if mesh is None else (
      lambda tree: jax.device_put(tree, jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec(MEMBER_AXIS))))
  replicated = (lambda tree: tree) if mesh is None else (
      lambda tree: distributed.replicate(tree, mesh))
  state = by_member(state)
  test_x, test_y = (jnp.asarray(a) for a in test_data)
  num_classes = loop.num_classes_of(model, states[0].params, test_x)
  loop.check_labels(test_y, num_classes, "test_data")
  loop.check_labels(member_data.y, num_classes, "data")
  if per_seed_data:
    by_seed = stack_data(data)
    seed_of = np.array([s for _, s in members])
    round_data = by_seed._replace(
        client_indices=by_member(by_seed.client_indices[seed_of]),
        num_examples=by_member(by_seed.num_examples[seed_of]),
        x=replicated(by_seed.x), y=replicated(by_seed.y))
  else:
    round_data = replicated(data)
  data_axes = _data_axes(per_seed_data)
  hparams = by_member({
      name: jnp.asarray([points[p][name] for p, _ in members], jnp.float32)
      for name in points[0]})
  member_execution = dataclasses.replace(execution, stream=False)

  def member_round(hp, member_state, member_data, cohort, mask):
    aggregator, objective = _parts(build(dict(hp)))
    member_training = dataclasses.replace(
        training,
        learning_rate=hp.get(CLIENT_LEARNING_RATE, training.learning_rate),
        objective=objective or training.objective)
    round_fn = rounds.make_round_fn(
        model, aggregator, member_training, execution=member_execution,
        local_update=local_update, nonfinite=nonfinite.clients, jit=False)
    return round_fn(member_state, member_data, cohort, mask)

  sweep_round = jax.jit(
      jax.vmap(member_round, in_axes=(0, 0, data_axes, 0, None)),
      donate_argnums=(1,))
  num_clients = member_data.num_clients
  sample = jax.vmap(lambda key: rounds.sample_cohort(
      key, num_clients, cohort_size, execution.sampler))
  sample_keys = jax.vmap(lambda key: loop.cohort_keys(
      key, num_rounds))(jnp.stack(run_keys))
  mask = jnp.ones((cohort_size,), jnp.float32)
  stacked_eval = evaluation_lib.stacked_per_example_fn(model)
  labels = np.asarray(test_y)

  def evaluate(state, with_clients) -> list[dict]:
    params = aggregators.eval_params(state.aggregator_state, state.params)
    losses, preds = evaluation_lib.map_batches(
        stacked_eval, params, test_x, test_y, evaluation.batch_size)
    mean_loss = np.asarray(jnp.mean(losses, axis=-1))
    preds = np.asarray(preds)
    if with_clients:
      train_losses, _ = evaluation_lib.map_batches(
          stacked_eval, params, round_data.x, round_data.y,
          evaluation.batch_size)
      client_losses = np.asarray(jax.vmap(
          evaluation_lib.per_client_mean,
          in_axes=(0, data_axes.client_indices, data_axes.num_examples))(
              train_losses, round_data.client_indices,
              round_data.num_examples))
    rows = []
    for m in range(len(members)):
      test = evaluation_lib.classification_metrics(labels, preds[m],
                                                   num_classes)
      test["loss"] = float(mean_loss[m])
      row = {f"test_{k}": v for k, v in test.items()}
      if with_clients:
        row["client_loss_mean"] = float(client_losses[m].mean())
        row["client_loss_var"] = float(client_losses[m].var())
      rows.append(row)
    return rows

  _check_traceable(sweep_round, points, hparams, state, round_data,
                   by_member(sample(sample_keys[:, 0])), mask)

  def round_step(state, cohorts):
    state, out = sweep_round(hparams, state, round_data, cohorts, mask)
    jax.block_until_ready(state.params)
    return state, jax.device_get(out)

  driver = loop.Driver(
      round_step=round_step,
      sample=lambda r: by_member(sample(sample_keys[:, r])),
      evaluate=evaluate, member_output=_member, member_state=_member,
      num_members=len(members), nonfinite=nonfinite, evaluation=evaluation,
      progress=execution.progress,
      callbacks=[list(callbacks(m)) if callbacks else []
                 for m in range(len(members))],
      with_losses=training.losses_for(any(
          b[0].uses_losses for b in built)))
  if snapshot is None:
    rows = [[row] for row in driver.initial_rows(state, num_rounds)]
    client_rows = [[] for _ in members]
  else:
    rows, client_rows = _unpack_rows(snapshot.rows, snapshot.client_rows,
                                     len(members))
    driver.replay(rows, client_rows)

  state = loop.loop_with_checkpoints(
      driver, checkpointer, state, run_key, num_rounds, rows, client_rows,
      pack=_pack_rows)

  results = []
  for m, (p, s) in enumerate(members):
    point = points[p]
    base_config = loop.base_config(
        num_rounds=num_rounds, participation=participation,
        cohort_size=cohort_size, training=training,
        learning_rate=point.get(CLIENT_LEARNING_RATE,
                                training.learning_rate),
        seed=seeds[s], num_clients=num_clients, num_classes=num_classes,
        num_devices=1, extra={"sweep_size": len(members),
                              "sweep_hparams": dict(point),
                              **driver.stop_record(), **(config or {})})
    results.append(SweepMember(
        dict(point), int(seeds[s]),
        History(rows[m], client_rows[m], base_config), _member(state, m)))
  return results
