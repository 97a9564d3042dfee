"""q-FedAvg: the server step of q-FFL, fair resource allocation.

Li, Sanjabi, Beirami and Smith, "Fair Resource Allocation in Federated
Learning", ICLR 2020 (Algorithm 2, q-FedAvg).

q-FFL minimises f_q(w) = sum_k p_k / (q + 1) F_k^{q+1}(w) (Eq. (2)): a
larger q weights the clients of larger loss more. With F_k = F_k(w^t) the
loss of the incoming global model on client k's data (``info.loss_before``)
and L the Lipschitz estimate of the local gradients, over the m real
participants (mask 1), Algorithm 2 line 7 and line 9:

  Dw_k  = L (w^t - w_k^{t+1})
  D_k   = F_k^q Dw_k
  h_k   = q F_k^{q-1} |Dw_k|^2 + L F_k^q
  w^{t+1} = w^t - sum_k D_k / sum_k h_k

q = 0 gives h_k = L and w^{t+1} = w^t - sum_k L (w^t - w_k) / (m L), the
unweighted mean of the client models (FedAvg with clients sampled in
proportion to n_k, as the paper samples them).

Interpretations:
* L. The paper takes L = 1 / eta, eta the client learning rate: with
  ``lipschitz=None`` (the default) L = 1 / ``learning_rate``, which runs
  fill in with the client learning rate; ``lipschitz`` sets L directly.
* Unweighted: p_k enters through sampling (the paper draws clients with
  probability p_k = n_k / n), so the number of examples is unused.
* Scale. The step is w^{t+1} = w^t + sum_k c_k (w_k - w^t) with
  c_k = F_k^q / (sum_j q F_j^{q-1} L |w_j - w^t|^2 + F_j^q); every power
  is taken relative to the cohort's largest loss M (F^q = M^q (F/M)^q, and
  M^{q-1} cancels), so large q neither overflows nor underflows float32
  (the paper's q = 15 with F_k = 1e-3 would be 1e-45). Hence c_k >= 0 and
  sum_k c_k <= 1: the new model lies between w^t and the clients' models,
  reaching their mean only for q = 0 or zero updates.
* Losses. Rounds with ``nonfinite="exclude"`` (or "raise") already hand a
  client with a non-finite loss over as a padding row (``rounds``; this
  rule sets ``uses_losses``). A real client's loss must be finite and
  >= 0: outside jit a bad one raises ValueError naming
  ``info.loss_before``; under jit (where values cannot be checked) a
  negative loss is raised to ``LOSS_FLOOR``, and a NaN or infinite one
  (only with ``nonfinite="propagate"``) propagates into the model, as a
  non-finite client model would. Losses below ``LOSS_FLOOR`` count as
  ``LOSS_FLOOR`` (F^{q-1} of a zero loss is infinite for q < 1).
* A cohort with no real participant leaves the model unchanged.

Memory: Algorithm 2 is a sum over clients of (D_k, h_k), but the scale
above needs the cohort's largest loss, which one client's statistics
cannot see, so the rule has no streaming form: it needs the stacked
[K, ...] models (the client norms are computed leaf by leaf).
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg import tree_math
from fedjax_agg.types import Aggregator, ClientInfo, empty_init

__all__ = ["LOSS_FLOOR", "QFFLState", "qffl", "qffl_weights"]

# Losses are raised to at least this before their powers are taken.
LOSS_FLOOR = 1e-6


class QFFLState(NamedTuple):
  """q-FedAvg keeps no state."""


def qffl_weights(losses: jax.Array, squared_norms: jax.Array,
                 mask: jax.Array, q, lipschitz) -> jax.Array:
  """c_k of w^{t+1} = w^t + sum_k c_k (w_k - w^t), [K] (0 for padding).

  Args:
    losses: [K] F_k(w^t) (padding rows may hold anything).
    squared_norms: [K] |w_k - w^t|^2 (0 for padding rows).
    mask: [K], 1 for a real participant.
    q, lipschitz: q >= 0 and L > 0.
  """
  real = mask > 0
  losses = jnp.where(real, jnp.maximum(losses, LOSS_FLOOR), 0.0)
  largest = jnp.max(losses)
  # M is 0 only for a cohort without real clients; 1 then keeps the logs
  # below finite (every weight is 0 anyway).
  largest = jnp.where(largest > 0, largest, 1.0)
  # log(F_k / M) <= 0; padding rows get 0 (their terms are dropped below).
  log_ratio = jnp.where(real, jnp.log(jnp.where(real, losses, 1.0))
                        - jnp.log(largest), 0.0)
  # F_k^q / M^{q-1} = M (F_k / M)^q: the D_k and L F_k^q of line 7.
  power = largest * jnp.exp(q * log_ratio)
  # q F_k^{q-1} / M^{q-1} = q (F_k / M)^{q-1}: the first term of h_k. It
  # is 0 for q = 0 (where (F/M)^{-1} need not be finite).
  slope = jnp.where(q > 0, q * jnp.exp((q - 1) * log_ratio), 0.0)
  # |Dw_k|^2 / L = L |w^t - w_k|^2; a zero update adds nothing even where
  # the slope overflowed.
  curvature = jnp.where(squared_norms > 0,
                        slope * lipschitz * squared_norms, 0.0)
  # Line 9, divided by L M^{q-1}: h_k -> curvature_k + power_k.
  total = jnp.sum(jnp.where(real, curvature + power, 0.0))
  return jnp.where(real, power / jnp.where(total > 0, total, 1.0), 0.0)


def check_losses(info: ClientInfo) -> None:
  """Outside jit: the real clients' ``loss_before`` are finite and >= 0."""
  if checks.is_traced(info.mask) or checks.is_traced(info.loss_before):
    return
  losses = np.asarray(info.loss_before)[np.asarray(info.mask) > 0]
  if not np.all(np.isfinite(losses) & (losses >= 0)):
    raise ValueError(
        "info.loss_before must be finite and >= 0 for the real clients "
        f"(mask 1) of q-FedAvg, got {losses.tolist()}")


@run_context.derived_from_run(learning_rate="learning_rate")
def qffl(q: float = 1.0, lipschitz: Optional[float] = None, *,
         learning_rate: float = 1.0) -> Aggregator:
  """q-FedAvg aggregator (the server step of q-FFL).

  Args:
    q: fairness parameter q >= 0 (0: the unweighted mean of the clients).
    lipschitz: L > 0, the Lipschitz estimate; None: 1 / ``learning_rate``
      (the paper's choice).
    learning_rate: eta > 0, the client learning rate (runs fill it in);
      read only when ``lipschitz`` is None.

  Returns:
    An ``Aggregator`` that reads ``info.loss_before`` (``uses_losses``);
    metrics hold "update_weights" [K] (c_k) and "step_fraction" [] (their
    sum, <= 1).
  """
  checks.check_range("q", q, 0)
  checks.check_range("learning_rate", learning_rate, 0, low_open=True)
  if lipschitz is not None:
    checks.check_range("lipschitz", lipschitz, 0, low_open=True)
  lipschitz_value = 1.0 / learning_rate if lipschitz is None else lipschitz

  init = empty_init(QFFLState)

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=False, fields=("loss_before",))
    check_losses(info)
    updates = tree_math.client_updates(client_params, global_params,
                                       info.mask)
    norms = tree_math.client_norms(updates)
    weights = qffl_weights(info.loss_before, jnp.square(norms), info.mask,
                           q, lipschitz_value)
    new_global = tree_math.add_update(
        global_params, tree_math.weighted_sum(updates, weights))
    new_global = tree_math.keep_if_no_clients(info.mask, new_global,
                                              global_params)
    return new_global, state, {"update_weights": weights,
                               "step_fraction": jnp.sum(weights)}

  return Aggregator(init, aggregate, uses_losses=True)
