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
from fedjax_agg.config import (Checkpointing, Evaluation, Execution,
                               LocalTraining, NonFinite, Privacy, Systems)
from fedjax_agg.federated import FederatedData
from fedjax_agg.history import History
# The loop's names, as this module gave them before the loop had its own.
from fedjax_agg.loop import (Callback, Driver, MAX_SEED, NonFiniteError,
                             check_labels, cohort_keys,
                             loop_with_checkpoints, num_classes_of,
                             open_checkpoints, seed_keys)
from fedjax_agg.runner import resolve_privacy
from fedjax_agg.types import Aggregator, Model, Params

__all__ = ["Callback", "Driver", "MAX_SEED", "NonFiniteError", "RunResult",
           "check_labels", "cohort_keys", "loop_with_checkpoints",
           "num_classes_of", "open_checkpoints", "resolve_privacy", "run",
           "seed_keys"]


class RunResult(NamedTuple):
  history: History
  state: rounds.ServerState


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
    systems: Optional[Systems] = None,
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
    systems: the clients' simulated clock and uplink codec
      (``config.Systems``): the ``sim_time_s``, ``uplink_bytes``,
      ``downlink_bytes`` and ``dropped`` columns after every round;
      availability, over-selection and deadlines decide who takes part.

  Returns:
    ``RunResult(history, final_state)``.

  Raises:
    NonFiniteError: per ``nonfinite``.
    checkpoint.CheckpointError: a checkpoint of another run or data.
  """
  plan = runner.Plan(
      model=model, data=(data,), test_data=test_data,
      build=lambda hparams: aggregator, num_rounds=num_rounds,
      participation=participation, training=training, execution=execution,
      evaluation=evaluation, local_update=local_update, nonfinite=nonfinite,
      init_params=init_params, checkpointing=checkpointing,
      callbacks=(tuple(callbacks),), config=config, privacy=privacy,
      systems=systems,
      seeds=(seed,))
  member, = runner.execute(plan)
  return RunResult(member.history, member.state)
