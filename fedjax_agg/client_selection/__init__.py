"""Client-side tuning: ADCT's per-client grid search.

* ``adct`` builds ADCT's client side (``ADCT(init, train, grid)``);
  ``adct_update(tuner)`` is it as the round's ``LocalUpdate``, and
  ``fedjax_agg.drivers.run_adct`` drives FL rounds with it.
* FedACS, which selects clients on the server, is a registered aggregator
  (``aggregators.fedacs``); ``fedjax_agg.validation`` holds the per-client
  held-out split and the batched per-client accuracy both use.
"""

from fedjax_agg.client_selection._adct import adct
from fedjax_agg.client_selection._adct import ADCT
from fedjax_agg.client_selection._adct import ADCTOutput
from fedjax_agg.client_selection._adct import ADCTState
from fedjax_agg.client_selection._adct import DEFAULT_GRID
from fedjax_agg.client_selection._adct import search_mask
from fedjax_agg.client_selection._adct import select_configs
from fedjax_agg.client_selection._update import adct_update

__all__ = [
    "ADCT", "ADCTOutput", "ADCTState", "DEFAULT_GRID", "adct", "adct_update",
    "search_mask", "select_configs",
]
