"""FedMedian: the coordinate-wise median of the client models.

Yin, Chen, Ramchandran and Bartlett, "Byzantine-Robust Distributed Learning:
Towards Optimal Statistical Rates", ICML 2018 (Definition 1, coordinate-wise
median).

w_{t+1}[i] = med{ w^k_{t+1}[i] : k a real participant } for every coordinate
i. With an even number of real clients the median is the mean of the two
middle values. Padded clients (mask 0) are excluded; the number of examples
plays no role (the estimator is unweighted). Because the median commutes
with a common shift, the median of the models equals w_t plus the median of
the updates. A cohort with no real participant leaves the model unchanged.
"""

from typing import NamedTuple

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.types import Aggregator


class FedMedianState(NamedTuple):
  """FedMedian keeps no state."""


def fedmedian() -> Aggregator:
  """Coordinate-wise median aggregator (no hyperparameters).

  Returns:
    An ``Aggregator``; metrics hold "num_real" [], the real clients counted.
  """

  def init(global_params):
    del global_params
    return FedMedianState()

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=False)
    new_global = tree_math.masked_median(client_params, info.mask)
    new_global = tree_math.keep_if_no_clients(info.mask, new_global,
                                              global_params)
    return new_global, state, {"num_real": (info.mask > 0).sum()}

  return Aggregator(init, aggregate)
