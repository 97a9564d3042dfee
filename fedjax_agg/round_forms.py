"""The two forms of a run's round: one member unvmapped, S vmapped.

``fedjax_agg.runner`` does everything else a run does once; the round
differs:

* ``unvmapped`` (one member, ``simulation.run``): its cohort sharded over
  ``Execution.devices``, streaming, Poisson cohorts, per-client tables in
  host memory;
* ``vmapped`` (``sweep.run_sweep``): the S members' states stacked along a
  leading axis, every round ONE ``jax.vmap`` of the member round with the
  grid values as traced scalars, the member axis sharded over the
  devices.

Each returns a ``Round``: the placed state, the round step, the cohorts'
sampler, the test (and client-loss) evaluation and the members' views.
"""

import dataclasses
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import clock
from fedjax_agg import distributed
from fedjax_agg import evaluation as evaluation_lib
from fedjax_agg import fedbuff
from fedjax_agg import loop
from fedjax_agg import rounds
from fedjax_agg import sampling as sampling_lib
from fedjax_agg.federated import FederatedData

__all__ = ["MEMBER_AXIS", "Round", "UntraceableGridError", "member",
           "pack_rows", "stack", "stack_data", "unpack_rows", "unvmapped",
           "vmapped"]

MEMBER_AXIS = "members"
"""The mesh axis name over which a sweep's stacked members are sharded."""


def member(tree, index: int):
  """Member ``index`` of a tree stacked over members: every leaf's
  ``[index]`` entry along its leading axis."""
  return jax.tree.map(lambda leaf: leaf[index], tree)


def stack(trees):
  """The trees (same structure) stacked leaf by leaf along a new leading
  member axis: leaves ``[S, ...]``."""
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


class Round(NamedTuple):
  """The part of a run that differs between its two forms."""
  state: Any  # the placed initial state (members stacked when vmapped)
  round_step: Callable
  sample: Callable
  evaluate: Callable  # (state, with_clients) -> per-member test rows
  member_output: Callable
  member_state: Callable
  num_devices: int
  device: Any  # where the held-out evaluations run


def unvmapped(plan, state, built, cohort_size: int,
               accounts, run_keys, num_rounds: int,
               num_classes: int) -> Round:
  """One member's round: its cohort sharded over the devices, streaming,
  Poisson cohorts, host tables."""
  model, options = plan.model, plan.options
  execution, evaluation = options.execution, options.evaluation
  aggregator = built[0][0]
  training = plan.training_of(plan.points[0], built[0][1])
  data = plan.data[0]
  privacy = accounts.privacy[0]
  poisson = privacy is not None and privacy.sampling == "poisson"
  if poisson:
    rate = cohort_size / data.num_clients  # q = m / N
    # A Poisson cohort's size varies by round, a compiled round's does not:
    # every round takes ``capacity`` rows, the ones not drawn masked.
    capacity = sampling_lib.poisson_capacity(data.num_clients, rate)
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
  systems = plan.options.systems
  asynchronous = systems is not None and systems.asynchronous
  if asynchronous:
    round_fn = fedbuff.make_async_round_fn(
        model, aggregator, training, clock.built(systems).staleness,
        execution=execution, mesh=mesh, codec=clock.built(systems).codec,
        nonfinite=plan.options.nonfinite.clients, donate_state=True)
  else:
    round_fn = rounds.make_round_fn(
        model, aggregator, training, execution=execution, mesh=mesh,
        local_update=options.local_update,
        nonfinite=options.nonfinite.clients,
        donate_state=True, uplink=clock.uplink(systems, state.params))
  sample_keys = loop.cohort_keys(run_keys[0], num_rounds)
  # Placed once: every fixed-size cohort of the run shares it.
  full_mask = place(jnp.ones((cohort_size,), jnp.float32))
  # A list, so that ``round_step`` can mark the first compilation done from
  # inside the closure.
  compiled = []
  timeline = None
  if systems is not None:
    system = clock.build_system(systems, state.params, data, training,
                                plan.parts_of(plan.points[0])[0])
    timeline = (
        clock.async_plan(systems, system, num_rounds, cohort_size,
                         plan.seeds[0]) if asynchronous else
        clock.round_plan(systems, system, sample_keys, num_rounds,
                         cohort_size, execution.sampler))

  def sample(r):
    # The systems layer decides every round's cohort (and, asynchronous, each
    # update's start version and staleness) on the host before the run, from the
    # seed: a round only reads row r of that timeline.
    if asynchronous:
      return (place(jnp.asarray(timeline.client_ids[r])), full_mask,
              place(jnp.asarray(timeline.start_versions[r])),
              place(jnp.asarray(timeline.staleness[r])))
    if timeline is not None:
      return (place(jnp.asarray(timeline.client_ids[r])),
              place(jnp.asarray(timeline.mask[r])))
    if not poisson:
      return place(rounds.sample_cohort(
          sample_keys[r], data.num_clients, cohort_size,
          execution.sampler)), full_mask
    cohort, mask, count = sampling_lib.poisson_cohort(
        sample_keys[r], data.num_clients, rate, capacity)
    # Checked on the host before the round runs, so an oversized draw never
    # reaches the aggregation.
    if int(count) > capacity:
      raise RuntimeError(
          f"round {r + 1}: the Poisson cohort drew {int(count)} clients, "
          f"more than its capacity {capacity}; refusing to truncate it "
          "(that would change the sampling the accounting assumes)")
    return place(cohort), place(mask)

  def round_step(state, drawn):
    if not compiled:  # hosts start their first round together
      distributed.compile_together(round_fn, state, data, *drawn)
      compiled.append(True)
    state, out = round_fn(state, data, *drawn)
    if mesh is not None:
      # Leaves whose sharding XLA chose otherwise are placed again, so
      # that the next round reuses this compilation.
      state = place_state(state)
    # The loop times ``round_step``: wait for the device, or the time would be
    # the dispatch's only.
    jax.block_until_ready(state.params)
    out = distributed.to_numpy(out)  # gathered from other hosts
    # ``state.round`` counts the rounds done: the round just run is the
    # last of them.
    if timeline is not None:
      out = out._replace(metrics={
          **out.metrics, **timeline.metrics(int(state.round) - 1)})
    return state, out

  # One process: every evaluation batch is split over the round's devices
  # (params replicated there). Several: evaluated on one local device.
  batch_sharding = None
  if mesh is not None and jax.process_count() == 1:
    batch_sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(mesh.axis_names[0]))
  test = tuple(jnp.asarray(a) for a in plan.test_data)
  extra = [tuple(item) for item in evaluation.extra]

  def evaluate(state, with_clients):
    params = aggregators.eval_params(state.aggregator_state, state.params)
    if batch_sharding is None:
      params = distributed.local_copy(params, device)
    else:
      params = place(params)
    clients = data if batch_sharding is not None else eval_data
    return evaluation_lib.member_rows(
        model, params, test, num_classes, evaluation.batch_size,
        clients=clients if with_clients else None, extra=extra,
        sharding=batch_sharding)

  return Round(state=state, round_step=round_step, sample=sample,
                evaluate=evaluate, member_output=lambda out, m: out,
                member_state=lambda state, m: state,
                num_devices=1 if mesh is None else mesh.size, device=device)


def _data_axes(stacked: bool) -> FederatedData:
  """vmap ``in_axes`` of the data: pooled arrays shared, indices per member
  when ``stacked``."""
  axis = 0 if stacked else None
  # x, y (pooled) and validation are shared; indices and counts are per member
  # when each seed has its own partition.
  return FederatedData(None, None, axis, axis, None)


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
  # Padded index entries (0) lie past each client's ``num_examples``, so no
  # client ever reads them as its examples.
  indices = jnp.stack([jnp.pad(d.client_indices,
                               ((0, 0), (0, width - d.max_examples)))
                       for d in data])
  counts = jnp.stack([d.num_examples for d in data])
  return FederatedData(first.x, first.y, indices, counts)


def vmapped(plan, state, built, cohort_size: int,
             accounts, run_keys, num_rounds: int,
             num_classes: int) -> Round:
  """S members' round as one vmapped, jitted call; the member axis sharded
  over the devices."""
  model, options = plan.model, plan.options
  execution, evaluation = options.execution, options.evaluation
  members, points = plan.members, plan.points
  mesh, device = distributed.round_mesh(execution.devices,
                                        axis_name=MEMBER_AXIS)
  # The member axis is split evenly over the devices; uneven shards would need
  # padding members.
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
  per_seed_data = len(plan.data) > 1
  if per_seed_data:
    by_seed = stack_data(plan.data)
    seed_of = np.array([s for _, s in members])
    round_data = by_seed._replace(
        client_indices=by_member(by_seed.client_indices[seed_of]),
        num_examples=by_member(by_seed.num_examples[seed_of]),
        x=replicated(by_seed.x), y=replicated(by_seed.y))
  else:
    round_data = replicated(plan.data[0])
  data_axes = _data_axes(per_seed_data)
  # Every grid value becomes a float32 traced scalar; a value that must stay a
  # Python number (a shape, a branch) is caught by ``_check_traceable``.
  hparams = by_member({
      name: jnp.asarray([points[p][name] for p, _ in members], jnp.float32)
      for name in points[0]})
  member_execution = dataclasses.replace(execution, stream=False)

  # The rule is built inside the vmapped function, from traced grid values: one
  # compilation serves the whole grid. ``jit=False``: the outer jit compiles it.
  def member_round(hp, member_state, member_data, cohort, mask):
    aggregator, objective = plan.parts_of(hp)
    round_fn = rounds.make_round_fn(
        model, aggregator, plan.training_of(hp, objective),
        execution=member_execution, local_update=plan.options.local_update,
        nonfinite=plan.options.nonfinite.clients, jit=False)
    return round_fn(member_state, member_data, cohort, mask)

  sweep_round = jax.jit(
      jax.vmap(member_round, in_axes=(0, 0, data_axes, 0, None)),
      # The stacked state's buffers are reused for the next state; the runner
      # copied the initial one, so a caller's arrays stay valid.
      donate_argnums=(1,))
  num_clients = plan.data[0].num_clients
  sample = jax.vmap(lambda key: rounds.sample_cohort(
      key, num_clients, cohort_size, execution.sampler))
  sample_keys = jax.vmap(lambda key: loop.cohort_keys(
      key, num_rounds))(jnp.stack(run_keys))
  mask = jnp.ones((cohort_size,), jnp.float32)
  test = tuple(jnp.asarray(a) for a in plan.test_data)
  extra = [tuple(item) for item in evaluation.extra]

  def evaluate(state, with_clients) -> list[dict]:
    params = aggregators.eval_params(state.aggregator_state, state.params)
    return evaluation_lib.member_rows(
        model, params, test, num_classes, evaluation.batch_size,
        stacked=True, clients=round_data if with_clients else None,
        clients_stacked=per_seed_data, extra=extra)

  # Round 0's cohorts serve as example arguments: only shapes are traced.
  _check_traceable(sweep_round, points, hparams, state, round_data,
                   by_member(sample(sample_keys[:, 0])), mask)

  def round_step(state, cohorts):
    state, out = sweep_round(hparams, state, round_data, cohorts, mask)
    jax.block_until_ready(state.params)
    return state, jax.device_get(out)

  return Round(state=state, round_step=round_step,
                sample=lambda r: by_member(sample(sample_keys[:, r])),
                evaluate=evaluate, member_output=member,
                member_state=member,
                num_devices=1 if mesh is None else mesh.size, device=device)


def pack_rows(rows, client_rows):
  """Members' rows -> one row per round (as a checkpoint holds a run's):
  ``{"round": r, "members": [...]}`` and client rows keyed ``m:name``."""
  packed = [{"round": r, "members": [member[r] for member in rows]}
            for r in range(len(rows[0]))]
  packed_clients = [
      {f"{m}:{name}": value for m, member in enumerate(client_rows)
       for name, value in member[r].items()}
      for r in range(len(client_rows[0]))]
  return packed, packed_clients


def unpack_rows(packed, packed_clients, num_members: int):
  """The inverse of ``pack_rows``."""
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
