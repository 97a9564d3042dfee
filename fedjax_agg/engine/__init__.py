"""Local training of a whole cohort of clients in one jitted call.

``make_local_trainer`` builds ``train(global_params, data, client_ids,
learning_rates, num_steps, key)``. Every client of the cohort starts from the
same global params and, written for one client and ``jax.vmap``-ed here:

* shuffles its own ``num_examples`` examples with its own key each epoch
  (key = fold_in(fold_in(key, client_id), epoch); the shuffle of a client
  depends neither on its place in the cohort nor on the other clients);
* runs ``num_epochs`` epochs of minibatch steps of ``batch_size``; the last
  partial batch of an epoch is masked (the loss is the mean over its real
  examples), never dropped and never filled with other clients' data (a
  model whose rows are independent, ``ROWS_INDEPENDENT``, trains the
  epoch's last step without the rows that only pad);
* takes at most ``num_steps[k]`` real steps; later steps, and the padded
  steps of clients smaller than the largest one, leave its params and
  optimizer state unchanged. A client therefore ends exactly where training
  it alone would.

Clients are trained ``clients_per_step`` side by side (vmap); the cohort is
cut into chunks of that width, looped over inside the same jitted call, so
the training's memory is bounded by the chunk, not by K.

Two forms share that per-client program:

* ``make_local_trainer`` returns the trained models of the whole cohort,
  stacked [K, ...] (what a rule that needs every client model at once, such
  as the coordinate-wise median, must receive);
* ``make_local_reducer`` returns only a sum over the cohort of a per-client
  statistic (an ``Aggregator``'s ``StreamingForm``), accumulated chunk by
  chunk: no more than a chunk of client models ever exists, so a cohort of
  10,000 clients needs the memory of ``clients_per_step`` of them.
"""

from fedjax_agg import config as _config
from fedjax_agg import deprecation
from fedjax_agg import distributed as _distributed
from fedjax_agg.engine._reducer import LocalSums
from fedjax_agg.engine._reducer import make_local_reducer
from fedjax_agg.engine._trainer import epoch_order
from fedjax_agg.engine._trainer import full_steps
from fedjax_agg.engine._trainer import LocalResult
from fedjax_agg.engine._trainer import make_local_trainer
from fedjax_agg.engine._trainer import ROWS_INDEPENDENT
from fedjax_agg.engine._trainer import rows_finite
from fedjax_agg.engine._trainer import steps_per_epoch

__all__ = ["LocalResult", "LocalSums", "ROWS_INDEPENDENT", "epoch_order",
           "full_steps", "make_local_reducer", "make_local_trainer",
           "rows_finite", "steps_per_epoch"]

# Their homes are the configuration and the device layout; they were
# exported here before.
__getattr__ = deprecation.moved_names(__name__, {
    "OptimizerFactory": ("fedjax_agg.config", _config.OptimizerFactory),
    "default_clients_per_step": ("fedjax_agg.distributed",
                                 _distributed.default_clients_per_step)})
