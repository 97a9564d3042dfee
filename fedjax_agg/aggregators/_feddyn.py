"""FedDyn's server step: the mean of the clients' models, corrected by h.

Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning
Based on Dynamic Regularization", ICLR 2021 (Algorithm 1).

Round t, from the global model theta^{t-1}, over the round's real
participants P_t (mask 1) of the N clients of the federation, with the
models theta_k^t they trained (``clients.feddyn``'s local objective):

  Eq. (c): h^t = h^{t-1} - alpha (1/N) sum_{k in P_t} (theta_k^t -
           theta^{t-1}),                                     h^0 = 0;
  Eq. (d): theta^t = (1/|P_t|) sum_{k in P_t} theta_k^t - (1/alpha) h^t.

(Eqs. (a) and (b), the local objective and the gradient state, are the
client side's.) h is the server's running estimate of the mean of the
clients' gradient states: h^t = (1/N) sum_{k=1}^N grad_k^t whenever the
two sides share alpha and N.

Interpretation choices:

* Eq. (c) sums the updates theta_k^t - theta^{t-1} (the paper's typesetting
  puts the parenthesis around the whole sum; the updates are what its
  derivation and reference code use).
* |P_t| counts the rows with mask > 0: padding rows, and clients the round
  excluded as non-finite (handed over with mask 0), are not participants.
  N is the federation size the rule was built for (``num_clients``), not
  the cohort size.
* A cohort with no real participant leaves theta and h unchanged (the mean
  of Eq. (d) is undefined there).
* BatchNorm statistics (the ``batch_stats`` collection) have no gradient,
  so no h: they take the uniform mean of the participants' statistics.
  Their leaves of h stay 0.
* ``alpha`` must equal the client side's (``clients.feddyn``): the paper
  has one alpha for both.

Memory: a sum over clients, so it has a streaming form (the running sums
of theta_k^t - theta^{t-1} and of the participant count).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg import tree_math
from fedjax_agg.types import Aggregator, Params, StreamingForm

__all__ = ["FedDynState", "feddyn"]


class FedDynState(NamedTuple):
  """FedDyn's server state.

  Attributes:
    h: h^{t-1}, shaped like the model (0 on BatchNorm statistics).
  """
  h: Params


@run_context.derived_from_run(num_clients="num_clients",
                              alpha="client_side:feddyn_alpha")
def feddyn(alpha: float = 0.01, *, num_clients: int) -> Aggregator:
  """FedDyn aggregator (the server step of Algorithm 1, Eqs. (c)-(d)).

  Args:
    alpha: alpha > 0, the dynamic regularisation's weight (the client
      side's ``alpha``).
    num_clients: N, the federation size (the 1/N of Eq. (c)); client ids
      are in [0, N).

  Returns:
    An ``Aggregator`` with a streaming form; pair it with
    ``clients.feddyn``. Metrics: "h_norm" [] (||h^t||).
  """
  checks.check_range("alpha", alpha, 0, low_open=True)
  checks.check_int("num_clients", num_clients, 1)

  def init(global_params):
    return FedDynState(jax.tree.map(jnp.zeros_like, global_params))

  def finalize(global_params, sums, info, state):
    """Eqs. (c)-(d) from the sum over P_t of the updates and |P_t|."""
    trainable = tree_math.select_leaves(
        global_params, lambda path: not tree_math.is_statistic(path))
    mean_update = tree_math.mean_from_sums(sums)

    # ``t`` is a static Python bool per leaf: statistics' leaves of h are
    # never written and stay 0.
    def new_h(h, summed, t):
      if not t:
        return h
      # Eq. (c)
      return h - summed * (alpha / num_clients)

    # sums.weighted is the plain sum over P_t (every raw weight 1): Eq. (c)
    # divides it by the federation's N, not by |P_t|.
    h = jax.tree.map(new_h, state.h, sums.weighted, trainable)

    def new_param(w, u, h_leaf, t):
      mean = w + u  # (1/|P_t|) sum_k theta_k^t
      # Eq. (d); statistics: the uniform mean alone.
      return (mean - h_leaf / alpha if t else mean).astype(w.dtype)

    new_global = jax.tree.map(new_param, global_params, mean_update, h,
                              trainable)
    new_global = tree_math.keep_if_no_clients(info.mask, new_global,
                                              global_params)
    h = tree_math.keep_if_no_clients(info.mask, h, state.h)
    return new_global, FedDynState(h), {"h_norm": tree_math.tree_norm(h)}

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        num_clients=num_clients, uses_num_examples=False)
    updates = tree_math.client_updates(client_params, global_params,
                                       info.mask)
    # What the streaming form's sums hold (``tree_math.client_sums``).
    real = info.mask > 0
    sums = tree_math.MaskedSums(
        tree_math.sum_over_clients(updates),
        jnp.sum(jnp.where(real, 1.0, 0.0)), None,
        jnp.sum(jnp.where(real, info.mask, 0.0)))
    return finalize(global_params, sums, info, state)

  def client_stats(global_params, client_params, info_k):
    return tree_math.client_sums(
        tree_math.tree_sub(client_params, global_params), info_k.mask)

  return Aggregator(init, aggregate, StreamingForm(client_stats, finalize))
