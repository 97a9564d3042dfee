"""Client-side tuning and selection: ADCT's per-client grid search, FedACS.

* ``adct`` builds ADCT's client side (``ADCT(init, train, grid)``);
  ``rounds.make_round_fn`` / ``rounds.run`` drive FL rounds with it.
* FedACS (``aggregators.fedacs``) is a registered aggregator;
  ``fedjax_agg.validation`` holds the per-client held-out split and the
  batched per-client accuracy both use.
"""

from fedjax_agg.client_selection._adct import adct
from fedjax_agg.client_selection._adct import ADCT
from fedjax_agg.client_selection._adct import ADCTOutput
from fedjax_agg.client_selection._adct import ADCTState
from fedjax_agg.client_selection._adct import DEFAULT_GRID
from fedjax_agg.client_selection._adct import search_mask
from fedjax_agg.client_selection._adct import select_configs
from fedjax_agg.validation import client_accuracies
from fedjax_agg.validation import holdout_split

__all__ = [
    "ADCT", "ADCTOutput", "ADCTState", "DEFAULT_GRID", "adct",
    "client_accuracies", "holdout_split", "search_mask",
    "select_configs",
]
