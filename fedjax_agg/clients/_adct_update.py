"""ADCT as the round's local update (``types.LocalUpdate``).

The round driver runs ADCT clients like any others: ``adct_update(tuner)``
plugs ADCT's per-client grid search into ``simulation.run(...,
local_update=...)``; its per-client configurations are the client state
carried in the server state, and the accuracies are measured on the data's
``validation`` split when it has one, else on the training data.
"""

from fedjax_agg.clients._adct import ADCT
from fedjax_agg.types import LocalUpdate


def adct_update(tuner: ADCT) -> LocalUpdate:
  """ADCT's client side as a ``LocalUpdate``.

  The update's metrics hold, per client [K], ``adct_learning_rate``,
  ``adct_local_epochs``, ``adct_searched`` and ``adct_accuracy``, and the
  scalars ``adct_mean_accuracy`` and ``adct_num_searching``.
  """
  if not isinstance(tuner, ADCT):
    raise TypeError(f"tuner must be an ADCT (clients.adct(...)), "
                    f"got {type(tuner).__name__}")

  def update(client_state, global_params, data, client_ids, mask,
             learning_rates, num_steps, round_num, key):
    # ADCT picks each client's learning rate and epochs from its grid.
    del learning_rates, num_steps
    eval_data = data if data.validation is None else data.validation
    out, client_state, metrics = tuner.train(
        client_state, global_params, data, eval_data, client_ids, mask,
        round_num, key)
    metrics = {**metrics, "adct_learning_rate": out.learning_rate,
               "adct_local_epochs": out.local_epochs,
               "adct_searched": out.searched, "adct_accuracy": out.accuracy}
    return out.local, client_state, metrics

  return LocalUpdate(init=tuner.init, update=update)
