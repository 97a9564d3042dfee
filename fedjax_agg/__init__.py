"""fedjax_agg: federated learning simulation and aggregation rules in JAX.

Packages by layer (each imports only from the layers below it):

* contracts and shared math: ``types``, ``config``, ``checks``,
  ``tree_math``, ``registry``;
* rules: ``aggregators``, ``objectives``, ``clients`` (every client-side
  algorithm, ADCT's tuning included), ``attacks``;
* data: ``data``, ``partitions``, ``federated``, ``validation``;
* local training: ``engine``; one round: ``rounds``;
* drivers: ``simulation`` (the round loop), ``sweep``, ``drivers`` (ADCT,
  FedDRL's two-stage training), ``experiment`` and the CLI.
"""

from fedjax_agg.config import Checkpointing
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.config import NonFinite
from fedjax_agg.types import Aggregator
from fedjax_agg.types import ClientInfo
from fedjax_agg.types import LocalObjective
from fedjax_agg.types import LocalUpdate
from fedjax_agg.types import Model
from fedjax_agg.types import Params
from fedjax_agg.types import PRNGKey
from fedjax_agg.types import StackedParams

__all__ = [
    "Aggregator", "Checkpointing", "ClientInfo", "Evaluation", "Execution",
    "LocalObjective", "LocalTraining", "LocalUpdate", "Model", "NonFinite",
    "PRNGKey", "Params", "StackedParams",
]

__version__ = "0.1.0"
