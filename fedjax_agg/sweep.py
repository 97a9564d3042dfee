"""Sweeps: S runs of one experiment as one vmapped, jitted round.

A sweep runs S members that differ only in their seed and in numeric
hyperparameters (FedAdp's alpha, FedNNNN's beta and gamma, FedProx's mu,
FedLap's q, a server optimizer's learning rate, the client learning rate,
...). Their server states are stacked along a leading member axis [S, ...]
and every round is ONE jitted call: ``jax.vmap`` over the members of the
round that ``rounds.make_round_fn`` builds, with the members'
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

Everything else is the run every entry point executes
(``fedjax_agg.runner``): held-out personalised and fine-tuned evaluation
per member, privacy accounting per member (from each member's rule; fixed
cohorts only), attacks and per-client tables on the device. What a
vmapped round cannot do (Poisson cohorts, tables in host memory, members
that reach a target epsilon at different rounds) is refused.
"""

import itertools
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from fedjax_agg import checks
from fedjax_agg import runner
from fedjax_agg.federated import FederatedData
from fedjax_agg.options import RunOptions
from fedjax_agg.runner import CLIENT_LEARNING_RATE
from fedjax_agg.types import Callback, Model

__all__ = ["SweepMember", "grid_points", "member_name", "point_name",
           "run_sweep"]

HParams = dict[str, Any]
Build = Callable[[HParams], Any]  # -> (Aggregator, LocalObjective | None)
SweepMember = runner.Member
"""One member's result (``runner.Member``): ``hparams`` (its grid point),
``seed``, ``history`` (the ``History`` that ``simulation.run`` gives) and
``state`` (its final ``ServerState``)."""


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


def point_name(hparams: HParams) -> str:
  """A grid point's name: ``alpha5_mu0.1`` ("" for no grid)."""
  return "_".join(f"{name}{_number_name(value)}"
                  for name, value in hparams.items())


def member_name(hparams: HParams, seed: int) -> str:
  """A member's name for files: ``alpha5_mu0.1_seed0``."""
  return "_".join(filter(None, (point_name(hparams), f"seed{seed}")))


def run_sweep(
    build: Build,
    grid: Optional[Mapping[str, Sequence[float]]] = None,
    *,
    seeds: Sequence[int] = (0,),
    model: Model,
    data: FederatedData | Sequence[FederatedData],
    test_data: tuple[Any, Any],
    options: Optional[RunOptions] = None,
    callbacks: Sequence[Callback] = (),
    member_callbacks: Optional[Callable[[int], Sequence[Callback]]] = None,
    **fields,
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
    options: the settings every member shares (``options.RunOptions``,
      as ``simulation.run``); ``training.learning_rate`` is the client
      rate of members whose grid has no "learning_rate"; with several
      ``execution.devices`` the members are sharded over them (their
      number must be a multiple of the devices'); the rounds never stream;
      checkpoints hold the stacked members' states and rows together (a
      resume refuses another grid, seeds, data or settings, and a larger
      ``num_rounds`` extends the sweep); a ``local_update`` (e.g.
      ``clients.scaffold``) is shared by every member, each keeping its own
      client state (the per-client table gets the member axis), and the
      grid's "learning_rate" reaches it as the round's learning rates;
      privacy is accounted per member (fixed-size cohorts only); systems
      are refused (``config.Systems`` needs each member's own cohort mask;
      run the members one at a time).
    callbacks: as ``simulation.run``'s, handed every member's rows.
    member_callbacks: ``(member_index) -> callbacks`` of one member.
    **fields: ``RunOptions`` fields as keywords (``num_rounds=...``); they
      replace those of ``options``. Any other keyword is refused by name.

  Returns:
    One ``SweepMember`` per member, in the order of ``(grid point, seed)``.
    Each history's ``time_s`` is the wall time of the whole sweep's round.

  Raises:
    ValueError / TypeError: a bad grid, seed or data, a grid value the
      factories reject, or members whose aggregator states differ in shape.
  """
  options = RunOptions.of(options, fields, "run_sweep")
  seeds = list(seeds)
  if not seeds:
    raise ValueError("seeds must be a non-empty list of ints")
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds must be distinct, got {seeds}")
  if isinstance(data, FederatedData):
    data = (data,)
  else:
    data = tuple(data)
    if len(data) != len(seeds):
      raise ValueError(f"data must be one FederatedData or one per seed "
                       f"({len(seeds)}), got {len(data)}")
  points = grid_points(grid)
  for value in (grid or {}).get(CLIENT_LEARNING_RATE, ()):
    checks.check_range(CLIENT_LEARNING_RATE, value, 0, low_open=True)
  num_members = len(points) * len(seeds)
  return runner.execute(runner.Plan(
      model=model, data=data, test_data=test_data, build=build,
      points=points, seeds=seeds, options=options,
      callbacks=[list(callbacks) + list(
          member_callbacks(m) if member_callbacks else ())
                 for m in range(num_members)],
      vmapped=True))
