"""FL rounds with ADCT clients: the round driver with ADCT's local update.

``run_adct`` is ``simulation.run`` with ``clients.adct_update``
as the local update and, when client accuracy is measured on held-out
data, the data's ``validation`` split cut here (``validation.holdout_split``).
Every option of ``simulation.run`` (sampler, devices, evaluation schedule,
checkpoints, callbacks) applies, and the history has the same columns plus,
per round and client, the chosen ``adct_learning_rate``,
``adct_local_epochs``, ``adct_searched`` and ``adct_accuracy``.
"""

import dataclasses
from typing import Any, NamedTuple, Optional, Sequence

from fedjax_agg import simulation
from fedjax_agg import validation
from fedjax_agg.clients import ADCT
from fedjax_agg.clients import ADCTState
from fedjax_agg.clients import adct_update
from fedjax_agg.federated import FederatedData
from fedjax_agg.history import History
from fedjax_agg.options import RunOptions
from fedjax_agg.rounds import ServerState
from fedjax_agg.types import Aggregator, Model

__all__ = ["ADCTMeasure", "ADCTRunResult", "MEASURE_ON", "run_adct"]

MEASURE_ON = ("validation", "train", "server")
"""The places ``ADCTMeasure.on`` may name for measuring client accuracy."""


@dataclasses.dataclass(frozen=True, eq=False)
class ADCTMeasure:
  """Where ADCT clients measure their accuracy.

  Attributes:
    on: "validation" (a held-out ``validation_fraction`` of each client's
      examples, split with ``split_seed``, not used for training), "train"
      (its training data) or "server": ``server_validation``, one (x, y)
      set held by the server (e.g. class-balanced,
      ``validation.balanced_indices``) on which every client's candidates
      are measured.
    validation_fraction: with ``on="validation"``.
    split_seed: with ``on="validation"``.
    server_validation: the server's (x, y), exactly with ``on="server"``.
  """
  on: str = "validation"
  validation_fraction: float = 0.2
  split_seed: int = 0
  server_validation: Optional[tuple[Any, Any]] = None

  def __post_init__(self):
    if self.on not in MEASURE_ON:
      raise ValueError(
          f"measure.on must be one of {MEASURE_ON}, got {self.on!r}")
    if (self.server_validation is None) == (self.on == "server"):
      raise ValueError("measure.server_validation: give it exactly when "
                       f"measure.on='server' (on={self.on!r})")

  def data(self, data: FederatedData) -> FederatedData:
    """``data`` with the validation split the clients measure on."""
    if self.on == "validation":
      train, held_out = validation.holdout_split(
          data, self.validation_fraction, self.split_seed)
      return train.with_validation(held_out)
    if self.on == "server":
      return data.with_validation(validation.shared_split(
          self.server_validation, data.num_clients))
    return data

  def record(self) -> dict:
    """The measurement settings (``measure_on``, ``validation_fraction``,
    ``split_seed``) that ``run_adct`` adds to the run's config."""
    return {"measure_on": self.on,
            "validation_fraction": self.validation_fraction,
            "split_seed": self.split_seed}


class ADCTRunResult(NamedTuple):
  """What ``run_adct`` returns.

  Attributes:
    history: the run's ``History`` (the ``simulation.run`` columns plus the
      per-client ADCT choices).
    state: the final ``ServerState``.
    adct_state: the ADCT clients' per-client state after the last round
      (``state.client_state``).
  """
  history: History
  state: ServerState
  adct_state: ADCTState


def run_adct(model: Model, data: FederatedData, test_data: tuple[Any, Any],
             aggregator: Aggregator, tuner: ADCT,
             options: Optional[RunOptions] = None, *,
             measure: ADCTMeasure = ADCTMeasure(), seed: int = 0,
             callbacks: Sequence[Any] = (), **fields) -> ADCTRunResult:
  """Runs ``options.num_rounds`` rounds of FL with ADCT clients.

  Args:
    model, data, test_data, aggregator, options, seed, callbacks,
      **fields: as in ``simulation.run`` (``options.local_update`` is
      ADCT's own and may not be given).
    tuner: the ADCT client side (``clients.adct(model, ...)``).
    measure: where client accuracy is measured (``ADCTMeasure``).

  Returns:
    ``ADCTRunResult(history, state, adct_state)``.
  """
  options = RunOptions.of(options, fields, "run_adct")
  if not isinstance(measure, ADCTMeasure):
    raise TypeError(f"measure must be an ADCTMeasure, got "
                    f"{type(measure).__name__}")
  if options.local_update is not None:
    raise ValueError("run_adct: options.local_update is ADCT's own "
                     "(clients.adct_update(tuner)); leave it None")
  # The caller's own config keys come last: they win over the measurement's.
  record = {**measure.record(), "grid": tuner.grid, **(options.config or {})}
  result = simulation.run(
      model, measure.data(data), test_data, aggregator, options.replace(
          local_update=adct_update(tuner), config=record),
      seed=seed, callbacks=callbacks)
  return ADCTRunResult(result.history, result.state,
                       result.state.client_state)
