"""Client-side algorithms: every ``LocalUpdate`` factory, and the
per-client state table they keep.

Every algorithm here is a ``types.LocalUpdate`` for ``simulation.run(...,
local_update=...)``; its state is a pytree with a leading [N] axis (all
clients) carried in ``ServerState.client_state``, so it is jitted with the
round, checkpointed with the run, and vmapped by sweeps. (Malicious
clients wrap any of them: ``attacks.local_update``.)

* ``adct`` (+ ``adct_update``): ADCT's per-client grid search of the
  learning rate and local epochs (client-side tuning;
  ``fedjax_agg.drivers.run_adct`` drives rounds with it). FedACS, which
  selects clients on the server, is an aggregator (``aggregators.fedacs``).

* ``scaffold`` (+ ``scaffold_aggregator``): SCAFFOLD's control variates.
* ``feddyn`` (+ ``aggregators.feddyn``): FedDyn's gradient states.
* ``fedbn``: BatchNorm leaves kept per client.
* ``fedper``: the head (personalisation layers) kept per client.
* ``fedrep``: the head kept per client and trained first, then the body,
  each with the other part fixed.
* ``apfl``: a personal model and its mixing weight per client.
* ``lora_ranks``: LoRA clients of heterogeneous ranks (HetLoRA's
  truncation and rank self-pruning; FLoRA's ranks), for
  ``models.lora`` models.
* ``ditto``: a personal model per client.
* ``personal_accuracies`` / ``finetuned_accuracies``: personalised
  evaluation on each client's held-out split (``simulation.run`` records
  them when ``Evaluation(personalized=...)`` asks).
* The table itself: ``Table``, ``init_table``, ``gather``, ``scatter``;
  ``placement="host"`` keeps it in host memory or a file (``HostRows``)
  for populations too large for the device.
"""

from fedjax_agg.clients._adct import adct
from fedjax_agg.clients._adct import ADCT
from fedjax_agg.clients._adct import ADCTOutput
from fedjax_agg.clients._adct import ADCTState
from fedjax_agg.clients._adct import DEFAULT_GRID
from fedjax_agg.clients._adct import search_mask
from fedjax_agg.clients._adct import select_configs
from fedjax_agg.clients._adct_update import adct_update
from fedjax_agg.clients._apfl import apfl
from fedjax_agg.clients._apfl import APFLState
from fedjax_agg.clients._common import batch_norm_leaf
from fedjax_agg.clients._common import ClientOptions
from fedjax_agg.clients._ditto import ditto
from fedjax_agg.clients._ditto import DittoState
from fedjax_agg.clients._ditto import proximal_objective
from fedjax_agg.clients._evaluation import finetuned_accuracies
from fedjax_agg.clients._evaluation import personal_accuracies
from fedjax_agg.clients._evaluation import summarize
from fedjax_agg.clients._feddyn import dynamic_objective
from fedjax_agg.clients._feddyn import feddyn
from fedjax_agg.clients._feddyn import FedDynClientState
from fedjax_agg.clients._fedbn import fedbn
from fedjax_agg.clients._fedbn import FedBNState
from fedjax_agg.clients._fedper import fedper
from fedjax_agg.clients._fedper import FedPerState
from fedjax_agg.clients._fedrep import fedrep
from fedjax_agg.clients._fedrep import FedRepState
from fedjax_agg.clients._fedrep import train_only
from fedjax_agg.clients._host_table import HostRows
from fedjax_agg.clients._host_table import uses_host_table
from fedjax_agg.clients import _lora_ranks
from fedjax_agg.clients._lora_ranks import lora_ranks
from fedjax_agg.clients._lora_ranks import LoRARanksState
from fedjax_agg.clients._personal import last_dense_layer
from fedjax_agg.clients._scaffold import correction_objective
from fedjax_agg.clients._scaffold import scaffold
from fedjax_agg.clients._scaffold import scaffold_aggregator
from fedjax_agg.clients._scaffold import ScaffoldState
from fedjax_agg.clients._table import gather
from fedjax_agg.clients._table import init_table
from fedjax_agg.clients._table import scatter
from fedjax_agg.clients._table import Table
from fedjax_agg.registry import Capabilities
from fedjax_agg.registry import Registry

__all__ = [
    "ADCT", "ADCTOutput", "ADCTState", "APFLState", "ClientOptions",
    "DEFAULT_GRID", "DittoState", "FedBNState", "FedDynClientState",
    "FedPerState", "FedRepState", "HostRows", "LoRARanksState", "REGISTRY",
    "ScaffoldState", "Table", "adct", "adct_update", "apfl", "batch_norm_leaf",
    "correction_objective", "ditto", "dynamic_objective", "fedbn", "feddyn",
    "fedper", "fedrep", "finetuned_accuracies", "gather", "init_table",
    "last_dense_layer", "lora_ranks", "personal_accuracies",
    "proximal_objective",
    "scaffold", "scaffold_aggregator", "scatter", "search_mask",
    "select_configs", "summarize", "train_only", "uses_host_table",
]

REGISTRY = Registry("client", {
    "scaffold": scaffold,
    "fedbn": fedbn,
    "ditto": ditto,
    "feddyn": feddyn,
    "fedper": fedper,
    "fedrep": fedrep,
    "apfl": apfl,
    "lora_ranks": lora_ranks,
}, context=("model", "training"), capabilities={
    # What each client side needs and implies (registry.Capabilities).
    "feddyn": Capabilities(pairs_with=("feddyn", "alpha"),
                           own_objective=True),
    "scaffold": Capabilities(own_objective=True),
    **{name: Capabilities(personal=True)
       for name in ("fedbn", "ditto", "fedper", "fedrep")},
    "apfl": Capabilities(personal=True, own_objective=True),
    "lora_ranks": Capabilities(
        adapters="only", check_arguments=_lora_ranks.check_arguments),
})
"""The stateful client sides a config may name (``AlgorithmSpec.client``):
name -> factory, called with the run's model and training (the context
arguments) and the config's ``client_args``; each declares what it needs
(``REGISTRY.capabilities(name)``: the rule it pairs with, whether it keeps
personal models, sets its own objective, is for LoRA adapters, and its
arguments' checks)."""
