"""One run: R rounds of one experiment (``run``).

``run`` is the one-member call of the run every entry point executes
(``fedjax_agg.runner``): its round unvmapped, its cohort sharded over the
devices, fixed-size or Poisson cohorts (``config.Privacy``), the
evaluation of the test set, the clients' data and their held-out splits,
and the privacy accounting; ``sweep.run_sweep`` is the S-member call.
Client-side algorithms such as ADCT are ``run`` with another
``local_update`` (see ``fedjax_agg.rounds``). Seeding, the evaluation
schedule, history rows, the non-finite policy, checkpoints, callbacks and
early stopping are the loop's (``fedjax_agg.loop``).
"""

from typing import Any, NamedTuple, Optional, Sequence

from fedjax_agg import rounds
from fedjax_agg import runner
from fedjax_agg.federated import FederatedData
from fedjax_agg.history import History
from fedjax_agg.types import Callback
from fedjax_agg.options import RunOptions
from fedjax_agg.types import Aggregator, Model

__all__ = ["RunResult", "run"]


class RunResult(NamedTuple):
  """What ``run`` returns.

  Attributes:
    history: the run's ``History`` (one row per round, row 0 the initial
      model, plus the per-round client arrays).
    state: the final ``rounds.ServerState`` (global params, aggregator and
      client state, round counter, key).
  """
  history: History
  state: rounds.ServerState


def run(
    model: Model,
    data: FederatedData,
    test_data: tuple[Any, Any],
    aggregator: Aggregator,
    options: Optional[RunOptions] = None,
    *,
    seed: int = 0,
    callbacks: Sequence[Callback] = (),
    **fields,
) -> RunResult:
  """Runs ``options.num_rounds`` rounds of federated training.

  Args:
    model: the network and its task loss (``types.Model``).
    data: the federated training data (with a ``validation`` split when the
      local update reads one).
    test_data: (x, y) test arrays for the global model; labels must lie in
      [0, C) for the model's C outputs (C is also the number of classes of
      the macro-F1).
    aggregator: the server rule.
    options: the run's settings (``options.RunOptions``: rounds,
      participation, training, execution, evaluation, non-finite policy,
      local update, initial params, checkpoints, privacy, systems, recorded
      config). With several devices each round's clients are sharded over
      them, params and data replicated.
    seed: seeds the model init, the cohorts and the shuffles.
    callbacks: called with each history row (``fedjax_agg.loop``).
    **fields: ``RunOptions`` fields given as keywords (e.g.
      ``num_rounds=50, participation=0.1``); they replace those of
      ``options``. Any other keyword is refused by name.

  Returns:
    ``RunResult(history, final_state)``.

  Raises:
    NonFiniteError: per ``options.nonfinite``.
    checkpoint.CheckpointError: a checkpoint of another run or data.
  """
  options = RunOptions.of(options, fields, "run")
  plan = runner.Plan(
      model=model, data=(data,), test_data=test_data,
      build=lambda hparams: aggregator, options=options,
      callbacks=(tuple(callbacks),), seeds=(seed,))
  member, = runner.execute(plan)
  return RunResult(member.history, member.state)
