"""Shared inputs of the top-level tests: training and execution settings,
a federation with a NaN example, numpy cosines, DP-FTRL's epsilons from
dp_accounting directly.
"""

import dp_accounting
import numpy as np
from dp_accounting import rdp

from fedjax_agg import federated
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from tests.test_engine import tiny_data


TRAINING = LocalTraining(batch_size=3, learning_rate=0.2)
QUIET = Execution(clients_per_step=2, progress=False)


def _poisoned_data(client: int):
  """tiny_data with one NaN pixel in ``client``'s first example; the
  clean arrays as test data."""
  _, x, y, parts = tiny_data()
  poisoned = np.array(x)
  poisoned[parts[client][0], 0] = np.nan
  return federated.from_partition(poisoned, y, parts), (x, y)


def _np_cosines(a, b):
  return np.sum(a * b, -1) / np.sqrt(np.sum(a * a, -1) * np.sum(b * b, -1))


SPECIAL = dp_accounting.NeighboringRelation.REPLACE_SPECIAL


def _direct_epsilons(z, cohorts, restart_every, delta):
  """epsilon after each round from dp_accounting, trees by hand: each tree
  of T rounds so far whose most frequent client took part k times is a
  SingleEpochTreeAggregationDpEvent(z / k, T)."""
  out = []
  for r in range(1, len(cohorts) + 1):
    length = restart_every or r
    events = []
    for start in range(0, r, length):
      tree = [int(c) for row in cohorts[start:min(start + length, r)]
              for c in row]
      k = max(tree.count(c) for c in set(tree))
      events.append(dp_accounting.SingleEpochTreeAggregationDpEvent(
          z / k, min(start + length, r) - start))
    ledger = rdp.RdpAccountant(neighboring_relation=SPECIAL)
    ledger.compose(dp_accounting.ComposedDpEvent(events))
    out.append(ledger.get_epsilon(delta))
  return np.array(out)
