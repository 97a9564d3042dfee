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
``momentum`` 0 and ``server_learning_rate`` eta.
"""

from typing import NamedTuple

import numpy as np
import optax

from fedjax_agg import checks
from fedjax_agg.aggregators._fedopt import fedavgm
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import Aggregator

__all__ = ["FedSGD", "fedsgd"]


class FedSGD(NamedTuple):
  """FedSGD's two halves, for ``simulation.run(..., aggregator,
  training=...)``."""
  aggregator: Aggregator
  training: LocalTraining


def fedsgd(num_examples, learning_rate: float = 0.1) -> FedSGD:
  """FedSGD as a rule and the clients' local training.

  Args:
    num_examples: the federation's client sizes ([N], e.g.
      ``data.num_examples``) or the largest of them: every batch holds a
      whole client.
    learning_rate: eta > 0, the server's step on the averaged gradient.

  Returns:
    ``FedSGD(aggregator, training)``.
  """
  checks.check_range("learning_rate", learning_rate, 0, low_open=True)
  sizes = np.asarray(num_examples)
  if sizes.size == 0 or not np.issubdtype(sizes.dtype, np.number):
    raise ValueError(f"num_examples must be client sizes or the largest "
                     f"one, got {num_examples!r}")
  largest = int(sizes.max())
  if largest < 1:
    raise ValueError(f"num_examples: the largest client must hold at least "
                     f"one example, got {largest}")
  training = LocalTraining(epochs=1, batch_size=largest, learning_rate=1.0,
                           optimizer=optax.sgd)
  return FedSGD(fedavgm(server_learning_rate=learning_rate, momentum=0.0),
                training)
