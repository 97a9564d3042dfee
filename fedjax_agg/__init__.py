"""fedjax_agg: federated learning simulation and aggregation rules in JAX.

Modules by layer (each imports only from the layers below it):

* contracts and shared math: ``fedjax_agg.types``, ``fedjax_agg.config``,
  ``fedjax_agg.checks``, ``fedjax_agg.tree_math``,
  ``fedjax_agg.update_stats``, ``fedjax_agg.registry``,
  ``fedjax_agg.manifest`` (what a run wrote), ``fedjax_agg.jsonio``;
* rules: ``fedjax_agg.aggregators``, ``fedjax_agg.objectives``,
  ``fedjax_agg.clients`` (every client-side algorithm, ADCT's tuning
  included), ``fedjax_agg.attacks``, ``fedjax_agg.privacy``, and
  ``fedjax_agg.testing`` (the conformance checks of a rule);
* models: ``fedjax_agg.models`` (``fedjax_agg.models.networks``,
  ``fedjax_agg.models.layers``);
* data: ``fedjax_agg.data``, ``fedjax_agg.partitions``,
  ``fedjax_agg.federated``, ``fedjax_agg.validation``;
* local training and rounds: ``fedjax_agg.engine``, ``fedjax_agg.rounds``,
  ``fedjax_agg.evaluation``, ``fedjax_agg.history``,
  ``fedjax_agg.sampling``, ``fedjax_agg.stragglers``,
  ``fedjax_agg.distributed``;
* systems: ``fedjax_agg.systems``, ``fedjax_agg.compression``,
  ``fedjax_agg.clock``, ``fedjax_agg.fedbuff``, ``fedjax_agg.secagg``;
* drivers: ``fedjax_agg.options``, ``fedjax_agg.loop`` (the one round
  loop), ``fedjax_agg.runner``, ``fedjax_agg.round_forms``,
  ``fedjax_agg.simulation`` (``run``), ``fedjax_agg.sweep``,
  ``fedjax_agg.drivers`` (``fedjax_agg.drivers.adct``,
  ``fedjax_agg.drivers.feddrl_two_stage``), ``fedjax_agg.spec``,
  ``fedjax_agg.experiment``, ``fedjax_agg.checkpoint`` (a run's
  checkpoints and a network's saved variables),
  ``fedjax_agg.fingerprint``, ``fedjax_agg.locks``,
  ``fedjax_agg.plotting``, ``fedjax_agg.report`` (finished runs compared)
  and the command line, ``fedjax_agg.cli``.

.. include:: ../README.md
   :end-before: ## Performance
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
