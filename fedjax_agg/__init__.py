"""fedjax_agg: federated learning simulation and aggregation rules in JAX.

Modules by layer: each imports only from its own layer and the layers
above it in this list, and no two modules import each other, function-
local imports included (``tests/test_layers.py`` checks this list against
the import graph, with no exception):

* contracts and shared math: ``fedjax_agg.types``, ``fedjax_agg.checks``,
  ``fedjax_agg.tree_math``, ``fedjax_agg.update_stats``,
  ``fedjax_agg.registry``, ``fedjax_agg.deprecation`` (names that
  moved), ``fedjax_agg.declared`` (a setting's default,
  flags and check, declared once), ``fedjax_agg.manifest`` (what a run
  wrote),
  ``fedjax_agg.jsonio``, ``fedjax_agg.locks``, ``fedjax_agg.fingerprint``,
  ``fedjax_agg.run_context``, ``fedjax_agg.sampling``,
  ``fedjax_agg.stragglers``, ``fedjax_agg.secagg``,
  ``fedjax_agg.systems`` (the clients' clock: speeds, availability,
  rounds planned) and ``fedjax_agg.testing`` (the conformance checks of a
  rule);
* models and data: ``fedjax_agg.models`` (``fedjax_agg.models.networks``,
  ``fedjax_agg.models.layers``, ``fedjax_agg.models.lora`` and
  ``fedjax_agg.models._lora_targets``, which layers it adapts),
  ``fedjax_agg.data``, ``fedjax_agg.partitions``,
  ``fedjax_agg.federated``, ``fedjax_agg.validation``,
  ``fedjax_agg.evaluation``;
* configuration and local training: ``fedjax_agg.config``,
  ``fedjax_agg.objectives``, ``fedjax_agg.privacy``,
  ``fedjax_agg.distributed``, ``fedjax_agg.chunking`` (a cohort cut into
  chunks), ``fedjax_agg.engine`` (the local trainer);
* server rules: ``fedjax_agg.aggregators``;
* rounds: ``fedjax_agg.rounds``, ``fedjax_agg.compression``;
* client sides: ``fedjax_agg.clients`` (every client-side algorithm,
  ADCT's tuning included, on the engine's trainer) and
  ``fedjax_agg.attacks``;
* systems: ``fedjax_agg.fedbuff``, ``fedjax_agg.clock`` (a run's systems
  objects, built once);
* drivers: ``fedjax_agg.history``, ``fedjax_agg.checkpoint`` (a run's
  checkpoints and a network's saved variables), ``fedjax_agg.options``,
  ``fedjax_agg.loop`` (the one round loop), ``fedjax_agg.accounting``,
  ``fedjax_agg.round_forms``, ``fedjax_agg.runner``,
  ``fedjax_agg.simulation`` (``run``), ``fedjax_agg.sweep``,
  ``fedjax_agg.drivers`` (``fedjax_agg.drivers.adct``,
  ``fedjax_agg.drivers.feddrl_two_stage``), ``fedjax_agg.plotting``,
  ``fedjax_agg.spec``, ``fedjax_agg.experiment``, ``fedjax_agg.report``
  (finished runs compared) and the command line, ``fedjax_agg.cli``
  (and the package's ``__main__``, which runs it).

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
