"""FL rounds with ADCT clients: the round driver with ADCT's local update.

``run_adct`` is ``simulation.run`` with ``clients.adct_update``
as the local update and, when client accuracy is measured on held-out
data, the data's ``validation`` split cut here (``validation.holdout_split``).
Every option of ``simulation.run`` (sampler, devices, evaluation schedule,
checkpoints, callbacks) applies, and the history has the same columns plus,
per round and client, the chosen ``adct_learning_rate``,
``adct_local_epochs``, ``adct_searched`` and ``adct_accuracy``.
"""

from typing import Any, NamedTuple, Optional, Sequence

from fedjax_agg import simulation
from fedjax_agg import validation
from fedjax_agg.clients import ADCT
from fedjax_agg.clients import ADCTState
from fedjax_agg.clients import adct_update
from fedjax_agg.config import Checkpointing, Evaluation, Execution
from fedjax_agg.federated import FederatedData
from fedjax_agg.history import History
from fedjax_agg.rounds import ServerState
from fedjax_agg.types import Aggregator, Model, Params

__all__ = ["ADCTRunResult", "MEASURE_ON", "run_adct"]

MEASURE_ON = ("validation", "train", "server")


class ADCTRunResult(NamedTuple):
  history: History
  state: ServerState
  adct_state: ADCTState


def run_adct(model: Model, data: FederatedData, test_data: tuple[Any, Any],
             aggregator: Aggregator, tuner: ADCT, *, num_rounds: int,
             participation: float = 1.0, measure_on: str = "validation",
             validation_fraction: float = 0.2, split_seed: int = 0,
             seed: int = 0, init_params: Optional[Params] = None,
             execution: Execution = Execution(),
             evaluation: Evaluation = Evaluation(),
             checkpointing: Optional[Checkpointing] = None,
             callbacks: Sequence[Any] = (),
             config: Optional[dict] = None,
             server_validation: Optional[tuple[Any, Any]] = None
             ) -> ADCTRunResult:
  """Runs ``num_rounds`` rounds of FL with ADCT clients.

  Args:
    model, data, test_data, aggregator, num_rounds, participation, seed,
      init_params, execution, evaluation, checkpointing, callbacks, config:
      as in ``simulation.run``.
    tuner: the ADCT client side (``clients.adct(model, ...)``).
    measure_on: where client accuracy is measured: "validation" (a held-out
      ``validation_fraction`` of each client's examples, split with
      ``split_seed``, not used for training), "train" (its training data)
      or "server": ``server_validation``, one (x, y) set held by the
      server (e.g. class-balanced, ``validation.balanced_indices``) on
      which every client's candidates are measured.
    server_validation: the server's (x, y), with ``measure_on="server"``.

  Returns:
    ``ADCTRunResult(history, state, adct_state)``.
  """
  if measure_on not in MEASURE_ON:
    raise ValueError(
        f"measure_on must be one of {MEASURE_ON}, got {measure_on!r}")
  if (server_validation is None) == (measure_on == "server"):
    raise ValueError("server_validation: give it exactly when "
                     f"measure_on='server' (measure_on={measure_on!r})")
  if measure_on == "validation":
    train, held_out = validation.holdout_split(data, validation_fraction,
                                               split_seed)
    data = train.with_validation(held_out)
  elif measure_on == "server":
    data = data.with_validation(validation.shared_split(
        server_validation, data.num_clients))
  run_config = {"measure_on": measure_on,
                "validation_fraction": validation_fraction,
                "split_seed": split_seed, "grid": tuner.grid}
  run_config.update(config or {})
  result = simulation.run(
      model, data, test_data, aggregator, num_rounds=num_rounds,
      participation=participation, execution=execution,
      evaluation=evaluation, local_update=adct_update(tuner), seed=seed,
      init_params=init_params, checkpointing=checkpointing,
      callbacks=callbacks, config=run_config)
  return ADCTRunResult(result.history, result.state,
                       result.state.client_state)
