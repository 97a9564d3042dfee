"""FedSGD: one full-batch gradient step per client, averaged by the server.

McMahan, Moore, Ramage, Hampson, y Arcas, "Communication-Efficient Learning
of Deep Networks from Decentralized Data", AISTATS 2017 (Sec. 2, the
FedSGD baseline).

Each selected client k computes g_k = grad F_k(w_t), the gradient of its
mean loss over all its n_k examples, and the server steps

  w_{t+1} = w_t - eta sum_k (n_k / n) g_k,      n = sum_k n_k,

the gradient of the mean loss over the union of the cohort's data.

As a configuration of this library: every client runs ONE local step with
a batch holding all its examples (batch size = the federation's largest
client, one epoch) at client learning rate 1, so its model is
w_t - g_k; FedAvg's example-weighted mean of those models is
w_t - sum_k p_k g_k, whose pseudo-gradient sum_k p_k g_k a server SGD
step of rate eta applies. The local objective stays the task loss; a
config gives the same run with ``train.batch_size`` = the largest client,
``local_epochs`` 1, ``learning_rate`` 1 and the ``fedavgm`` rule with
``momentum`` 0 and ``server_learning_rate`` eta. A run whose largest
client holds more examples than the batch (``RunContext.max_examples``
above ``batch_size``) refuses the rule before its first round: that
client would take several local steps.
"""

from typing import NamedTuple

import numpy as np
import optax

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg.aggregators._fedopt import fedavgm
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import Aggregator

__all__ = ["FedSGD", "fedsgd"]


class FedSGD(NamedTuple):
  """FedSGD's two halves, for ``simulation.run(..., aggregator,
  training=...)``."""
  aggregator: Aggregator
  training: LocalTraining


def _largest_client(num_examples) -> int:
  """The largest of the client sizes ``num_examples``, checked."""
  sizes = np.asarray(num_examples)
  if (sizes.size == 0 or sizes.ndim > 1
      or sizes.dtype.kind not in "iuf"):
    raise ValueError(f"num_examples must be the client sizes ([N] "
                     f"integers >= 1) or the largest one, got "
                     f"{num_examples!r}")
  sizes = sizes.astype(np.float64)
  bad = ~np.isfinite(sizes) | (sizes < 1) | (sizes != np.floor(sizes))
  if bad.any():
    where = f" at index {np.flatnonzero(bad)[0]}" if sizes.ndim else ""
    raise ValueError(f"num_examples must hold client sizes, finite "
                     f"integers >= 1, got {float(sizes[bad][0])}{where}")
  return int(sizes.max())


def _check_whole_clients(rule, context, arguments) -> None:
  """A client's one step must see all its examples: B >= the largest."""
  del rule, arguments
  # Outside a run the context knows neither size: nothing to compare.
  if context.batch_size is None or context.max_examples is None:
    return
  if context.batch_size < context.max_examples:
    raise ValueError(
        f"num_examples: FedSGD's batch must hold a whole client (one "
        f"full-batch gradient step each), but the run's batch_size="
        f"{context.batch_size} is below its largest client's "
        f"{context.max_examples} examples, which would take several local "
        f"steps; build fedsgd from the run's data.num_examples")


@run_context.derived_from_run(_check_whole_clients)
def _server_step(learning_rate: float) -> Aggregator:
  """The server's half: FedAvg's weighted mean of w_t - g_k as a
  pseudo-gradient, one SGD step of rate eta (no momentum)."""
  return fedavgm(server_learning_rate=learning_rate, momentum=0.0)


def fedsgd(num_examples, learning_rate: float = 0.1) -> FedSGD:
  """FedSGD as a rule and the clients' local training.

  Args:
    num_examples: the federation's client sizes ([N], e.g.
      ``data.num_examples``) or the largest of them, finite integers >= 1:
      every batch holds a whole client. A run whose largest client holds
      more examples than the batch is refused before its first round
      (its clients would take several local steps).
    learning_rate: eta > 0, the server's step on the averaged gradient.

  Returns:
    ``FedSGD(aggregator, training)``.
  """
  checks.check_range("learning_rate", learning_rate, 0, low_open=True)
  largest = _largest_client(num_examples)
  # Client rate 1 makes each trained model w_t - g_k; eta is the
  # server's alone.
  training = LocalTraining(epochs=1, batch_size=largest, learning_rate=1.0,
                           optimizer=optax.sgd)
  return FedSGD(_server_step(learning_rate), training)
