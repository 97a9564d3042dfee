"""Drivers built on the round loop for particular algorithms.

* ``run_adct``: FL rounds with ADCT clients (``simulation.run`` with ADCT's
  local update and a held-out validation split).
* ``two_stage`` / ``decider``: FedDRL's two-stage training (online workers
  as one vmapped simulation, then the offline main agent).

The generic drivers are ``fedjax_agg.simulation.run`` and
``fedjax_agg.sweep.run_sweep``.
"""

from fedjax_agg.drivers.adct import ADCTMeasure
from fedjax_agg.drivers.adct import ADCTRunResult
from fedjax_agg.drivers.adct import MEASURE_ON
from fedjax_agg.drivers.adct import run_adct
from fedjax_agg.drivers.feddrl_two_stage import decider
from fedjax_agg.drivers.feddrl_two_stage import two_stage
from fedjax_agg.drivers.feddrl_two_stage import TwoStageResult

__all__ = ["ADCTMeasure", "ADCTRunResult", "MEASURE_ON", "TwoStageResult",
           "decider", "run_adct", "two_stage"]
