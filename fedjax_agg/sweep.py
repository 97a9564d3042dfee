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

The sweep runs on the default device; the member axis is not sharded.
"""

import itertools
import time
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm.auto as tqdm

from fedjax_agg import aggregators
from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg import simulation
from fedjax_agg.federated import FederatedData
from fedjax_agg.types import Aggregator, LocalObjective, Model, Params

CLIENT_LEARNING_RATE = "learning_rate"

HParams = dict[str, Any]
Build = Callable[[HParams], Any]  # -> (Aggregator, LocalObjective | None)


class SweepMember(NamedTuple):
  """One member's result.

  Attributes:
    hparams: the member's grid point (name -> number).
    seed: its seed.
    history: the ``simulation.History`` that ``simulation.run`` gives.
    state: its final ``simulation.ServerState`` (no member axis).
  """
  hparams: HParams
  seed: int
  history: simulation.History
  state: simulation.ServerState


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
  names = list(grid)
  return [dict(zip(names, point, strict=True))
          for point in itertools.product(*(grid[n] for n in names))]


def member_name(hparams: HParams, seed: int) -> str:
  """A member's name for files: ``alpha5_mu0.1_seed0``."""
  parts = [f"{name}{value:g}" for name, value in hparams.items()]
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
  return FederatedData(None, None, axis, axis)


def _stack(trees):
  return jax.tree.map(lambda *leaves: jnp.stack(leaves), *trees)


def _member(tree, index: int):
  return jax.tree.map(lambda leaf: leaf[index], tree)


_STACKED_EVAL_FNS = {}  # model -> jitted per-batch evaluation of S models


def _stacked_eval_fn(model: Model):
  fn = _STACKED_EVAL_FNS.get(model)
  if fn is None:
    fn = _STACKED_EVAL_FNS.setdefault(model, jax.jit(jax.vmap(
        simulation._per_example(model), in_axes=(0, None, None))))  # pylint: disable=protected-access
  return fn


def run_sweep(
    build: Build,
    grid: Optional[Mapping[str, Sequence[float]]] = None,
    *,
    seeds: Sequence[int] = (0,),
    model: Model,
    data: FederatedData | Sequence[FederatedData],
    test_data: tuple[Any, Any],
    num_rounds: int,
    num_classes: int,
    participation: float = 1.0,
    local_epochs: int = 1,
    batch_size: int = 16,
    learning_rate: float = 0.01,
    client_optimizer: engine.OptimizerFactory = optax.sgd,
    clients_per_step: Optional[int] = None,
    unroll: int | bool = 1,
    local_steps_fn: Optional[simulation.LocalStepsFn] = None,
    compute_losses: bool = True,
    sampler: str = "auto",
    init_params: Optional[Params] = None,
    eval_every: int = 1,
    eval_clients: bool = True,
    eval_batch_size: int = 1024,
    progress: bool = True,
    config: Optional[dict] = None,
) -> list[SweepMember]:
  """Runs every (grid point, seed) member as one vmapped computation.

  Args:
    build: ``build(hparams) -> (aggregator, objective or None)`` (or just
      an aggregator), e.g. ``lambda h: (aggregators.fedadp(h["alpha"],
      num_clients=N), None)``; called with concrete values to validate and
      with traced float32 scalars inside the round (module docstring).
    grid: name -> list of numbers; the members are the cartesian product
      with ``seeds`` (grid points outer, seeds inner). None: seeds only.
    seeds: one member per seed and grid point; each seeds its model init,
      cohorts and shuffles as ``simulation.run(seed=...)``.
    model: the network.
    data: the federated training data shared by every member, or one per
      seed (aligned with ``seeds``, same pooled x and y).
    test_data: (x, y) test arrays.
    num_rounds, num_classes, participation, local_epochs, batch_size,
      learning_rate, client_optimizer, clients_per_step, unroll,
      local_steps_fn, compute_losses, sampler, init_params, eval_every,
      eval_clients, progress, config: as ``simulation.run``
      (``learning_rate`` is the client rate of members whose grid has no
      "learning_rate").
    eval_batch_size: batch size of the evaluation passes.

  Returns:
    One ``SweepMember`` per member, in the order of ``(grid point, seed)``.
    Each history's ``time_s`` is the wall time of the whole sweep's round.

  Raises:
    ValueError / TypeError: a bad grid, seed or data, a grid value the
      factories reject, or members whose aggregator states differ in shape.
  """
  if not isinstance(num_rounds, int) or num_rounds < 0:
    raise ValueError(f"num_rounds must be an int >= 0, got {num_rounds!r}")
  if not isinstance(eval_every, int) or eval_every < 1:
    raise ValueError(f"eval_every must be an int >= 1, got {eval_every!r}")
  seeds = list(seeds)
  if not seeds or not all(isinstance(s, (int, np.integer))
                          and not isinstance(s, bool) for s in seeds):
    raise ValueError(f"seeds must be a non-empty list of ints, got {seeds!r}")
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
  cohort_size = simulation.num_sampled(member_data.num_clients,
                                       participation)
  states, run_keys = [], []
  for p, s in members:
    init_key, run_key = jax.random.split(jax.random.key(int(seeds[s])))
    params = model.init(init_key) if init_params is None else init_params
    states.append(simulation.init_state(params, built[p][0])._replace(
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
  if per_seed_data:
    by_seed = stack_data(data)
    seed_of = np.array([s for _, s in members])
    round_data = by_seed._replace(
        client_indices=by_seed.client_indices[seed_of],
        num_examples=by_seed.num_examples[seed_of])
  else:
    round_data = data
  data_axes = _data_axes(per_seed_data)
  hparams = {name: jnp.asarray([points[p][name] for p, _ in members],
                               jnp.float32) for name in points[0]}

  def member_round(hp, member_state, member_data, cohort, mask):
    aggregator, objective = _parts(build(dict(hp)))
    round_fn = simulation.make_round_fn(
        model, aggregator, batch_size=batch_size, local_epochs=local_epochs,
        learning_rate=hp.get(CLIENT_LEARNING_RATE, learning_rate),
        objective=objective, client_optimizer=client_optimizer,
        clients_per_step=clients_per_step, unroll=unroll,
        local_steps_fn=local_steps_fn, compute_losses=compute_losses,
        jit=False)
    return round_fn(member_state, member_data, cohort, mask)

  sweep_round = jax.jit(
      jax.vmap(member_round, in_axes=(0, 0, data_axes, 0, None)),
      donate_argnums=(1,))
  num_clients = member_data.num_clients
  sample = jax.vmap(lambda key: simulation.sample_cohort(
      key, num_clients, cohort_size, sampler))
  sample_keys = jax.vmap(lambda key: jax.random.split(
      jax.random.fold_in(key, 1), max(num_rounds, 1)))(jnp.stack(run_keys))
  mask = jnp.ones((cohort_size,), jnp.float32)
  evaluate = _stacked_eval_fn(model)
  test_x, test_y = (jnp.asarray(a) for a in test_data)
  labels = np.asarray(test_y)

  def eval_rows(state, round_num, elapsed) -> list[dict]:
    params = aggregators.eval_params(state.aggregator_state, state.params)
    losses, preds = simulation.map_batches(evaluate, params, test_x, test_y,
                                           eval_batch_size)
    mean_loss = np.asarray(jnp.mean(losses, axis=-1))
    preds = np.asarray(preds)
    if eval_clients:
      train_losses, _ = simulation.map_batches(
          evaluate, params, round_data.x, round_data.y, eval_batch_size)
      client_losses = np.asarray(jax.vmap(
          simulation.per_client_mean,
          in_axes=(0, data_axes.client_indices, data_axes.num_examples))(
              train_losses, round_data.client_indices,
              round_data.num_examples))
    rows = []
    for m in range(len(members)):
      row = {"round": round_num, "time_s": elapsed}
      test = simulation.classification_metrics(labels, preds[m], num_classes)
      test["loss"] = float(mean_loss[m])
      row.update({f"test_{k}": v for k, v in test.items()})
      if eval_clients:
        row["client_loss_mean"] = float(client_losses[m].mean())
        row["client_loss_var"] = float(client_losses[m].var())
      rows.append(row)
    return rows

  rows = [[row] for row in eval_rows(state, 0, 0.0)]
  client_rows = [[] for _ in members]
  bar = tqdm.trange(num_rounds, disable=not progress,
                    desc=f"rounds ({len(members)} members)")
  for r in bar:
    start = time.perf_counter()
    cohorts = sample(sample_keys[:, r])
    state, out = sweep_round(hparams, state, round_data, cohorts, mask)
    jax.block_until_ready(state.params)
    out = jax.device_get(out)
    elapsed = time.perf_counter() - start
    if (r + 1) % eval_every == 0 or r + 1 == num_rounds:
      new_rows = eval_rows(state, r + 1, elapsed)
    else:
      new_rows = [{"round": r + 1, "time_s": elapsed} for _ in members]
    for m, row in enumerate(new_rows):
      member_out = _member(out, m)
      row.update(simulation.round_scalars(member_out))
      rows[m].append(row)
      client_rows[m].append(simulation.client_row(r + 1, member_out))
    if "test_accuracy" in new_rows[0]:
      bar.set_postfix(acc=" ".join(f"{row['test_accuracy']:.3f}"
                                   for row in new_rows[:4]))

  results = []
  for m, (p, s) in enumerate(members):
    point = points[p]
    base_config = {
        "num_rounds": num_rounds, "participation": participation,
        "cohort_size": cohort_size, "local_epochs": local_epochs,
        "batch_size": batch_size,
        "learning_rate": point.get(CLIENT_LEARNING_RATE, learning_rate),
        "seed": int(seeds[s]), "num_clients": num_clients,
        "num_devices": 1, "sweep_size": len(members),
        "sweep_hparams": dict(point)}
    base_config.update(config or {})
    results.append(SweepMember(
        dict(point), int(seeds[s]),
        simulation.History(rows[m], client_rows[m], base_config),
        _member(state, m)))
  return results
