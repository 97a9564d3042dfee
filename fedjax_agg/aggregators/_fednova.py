"""FedNova: normalised averaging over heterogeneous numbers of local steps.

Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency
Problem in Heterogeneous Federated Optimization", NeurIPS 2020 (Sec. 4,
FedNova; the normalisers of local momentum and of the proximal term are
its examples of the general update).

Client i runs tau_i local steps from x; its cumulative update is
x_i - x = -eta G_i a_i, a_i the (non-negative) weights its local solver
puts on its tau_i gradients. FedNova averages the *normalised* updates and
rescales them by one effective number of steps:

  Eq. (a): d_i = (x_i - x) / ||a_i||_1            (the normalised update)
  Eq. (b): tau_eff = sum_i p_i ||a_i||_1
  Eq. (c): x+ = x + tau_eff sum_i p_i d_i,        p_i = n_i / sum_j n_j

over the round's real participants. ||a_i||_1 by local solver (tau = tau_i,
eta the client learning rate):

  plain SGD:                 tau
  SGD, momentum rho:         (tau - rho (1 - rho^tau) / (1 - rho)) / (1 - rho)
  proximal term mu (FedProx): (1 - (1 - eta mu)^tau) / (eta mu)

With every tau_i equal (and one solver), ||a_i||_1 is the same for all i,
tau_eff equals it and Eq. (c) is FedAvg: x+ = sum_i p_i x_i.

The effective number of steps (option ``tau_eff``). In the paper's
general update the weights p_i of the normalised updates decide which
objective the iterates approach; tau_eff only scales the server's step
(the effective number of local steps), so either choice below keeps the
objective consistent, and they differ in the step's length:

  Eq. (b):  tau_eff = sum_i p_i ||a_i||_1   ("normalized", the default)
  Eq. (b'): tau_eff = sum_i p_i tau_i       ("steps")

Eq. (b) is the paper's FedNova: it makes Eq. (c) FedAvg whenever the
clients ran equal solvers for equal steps. Eq. (b') is what the authors'
released code uses when the clients carry a proximal term: with FedProx
||a_i||_1 = (1 - (1 - eta mu)^tau_i) / (eta mu) < tau_i, so (b') takes a
longer server step than (b), the length of tau_i unshrunk steps. With
momentum ||a_i||_1 > tau_i and (b') is the shorter. For plain SGD
(||a_i||_1 = tau_i) the two are the same rule.

Interpretations:
* tau_i is the number of steps client i actually took
  (``info.num_steps``: stragglers, ADCT budgets and padding are counted as
  they ran). A client that took no step has x_i = x and contributes
  d_i = 0 (the 0/0 of Eq. (a) taken as 0) and ||a_i||_1 = 0 to tau_eff.
* The solver's normaliser must be declared here (``momentum``,
  ``proximal_mu``, and the client ``learning_rate`` that runs fill in):
  the rule sees models, not optimisers. The paper gives no normaliser for
  momentum and a proximal term together, so both at once are refused.
* BatchNorm statistics (the ``batch_stats`` collection) are no gradient
  steps: they take the plain weighted mean (FedAvg).
* A cohort with no real participant leaves the model unchanged.

Memory: a sum over clients, so it has a streaming form (the running sums of
n_i d_i, n_i ||a_i||_1 (or n_i tau_i) and n_i). Secure aggregation cannot
run it: those sums grow with the steps taken, which a fixed-point sum
would have to bound before the round.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg import tree_math
from fedjax_agg.aggregators._clipped_sums import summed_client_stats
from fedjax_agg.types import Aggregator, ClientInfo, empty_init, StreamingForm

__all__ = ["FedNovaState", "fednova", "normalizer"]


class FedNovaState(NamedTuple):
  """FedNova keeps no state."""


def normalizer(num_steps, momentum=0.0, proximal_mu=0.0,
               learning_rate=1.0) -> jax.Array:
  """||a_i||_1 of tau_i = ``num_steps`` local steps ([K] or []); the
  hyperparameters may be traced (sweeps)."""
  tau = jnp.asarray(num_steps, jnp.float32)
  rho = jnp.asarray(momentum, jnp.float32)
  # rho = 0 gives tau exactly (0^0 = 1).
  with_momentum = (tau - rho * (1.0 - rho ** tau) / (1.0 - rho)) / (1.0 - rho)
  shrink = jnp.asarray(learning_rate, jnp.float32) * jnp.asarray(
      proximal_mu, jnp.float32)
  # jnp.where evaluates both formulas; ``safe`` keeps the proximal one
  # finite (no 0 / 0) where there is no proximal term.
  safe = jnp.where(shrink > 0, shrink, 1.0)
  proximal = (1.0 - (1.0 - safe) ** tau) / safe
  return jnp.where(shrink > 0, proximal, with_momentum)


# The choices of fednova's tau_eff: Eq. (b) or Eq. (b').
_TAU_EFF = ("normalized", "steps")

_NO_STEPS = ("fednova reads info.num_steps (each client's local steps), "
             "which is None; the rounds fill it in (build ClientInfo with "
             "num_steps when calling the rule directly)")
# Secure aggregation probes a rule's client statistics for their range with
# a ClientInfo that holds no steps: the streaming form's None is that probe.
_NO_SECURE_SUM = (
    "secure aggregation cannot run fednova: its client statistics grow "
    "with the local steps each client took, which the fixed-point sum must "
    "bound before the round (its probe of their range has no steps: "
    "info.num_steps is None). Run fednova without secure aggregation "
    "(Systems.secagg_bits None)")


def _num_steps(info: ClientInfo, missing: str = _NO_STEPS) -> jax.Array:
  if info.num_steps is None:
    raise ValueError(missing)
  return info.num_steps


def _check_local_solver(rule, context, arguments) -> None:
  """FedNova's normaliser is that of SGD (with momentum) or FedProx."""
  del rule, arguments
  if context.momentum is None:
    raise ValueError(
        "fednova: the clients' optimizer is not SGD (or its momentum cannot "
        "be told); FedNova normalises SGD's steps: use "
        "config.client_optimizer('sgd', momentum=...)")
  if context.proximal_mu is None:
    raise ValueError(
        "fednova: the clients' local objective is neither the plain loss "
        "nor FedProx's (objectives.fedprox), whose steps FedNova normalises")


@run_context.derived_from_run(_check_local_solver,
                              learning_rate="learning_rate",
                              momentum="momentum",
                              proximal_mu="proximal_mu")
def fednova(momentum: float = 0.0, proximal_mu: float = 0.0, *,
            learning_rate: float = 1.0,
            tau_eff: str = "normalized") -> Aggregator:
  """FedNova aggregator (normalised averaging, Eqs. (a)-(c)).

  Args:
    momentum: rho in [0, 1), the clients' SGD momentum (``LocalTraining``
      with ``client_optimizer("sgd", momentum=rho)``).
    proximal_mu: mu >= 0 of the clients' FedProx term (``objective``
      fedprox with that mu); not together with ``momentum``.
    learning_rate: eta > 0, the client learning rate (runs fill it in);
      read only for ``proximal_mu`` > 0.
    tau_eff: the effective number of steps (module docstring): "normalized"
      (Eq. (b), the paper's sum_i p_i ||a_i||_1) or "steps" (Eq. (b'),
      sum_i p_i tau_i, the authors' code with a proximal term).

  Returns:
    An ``Aggregator`` with a streaming form; it reads ``info.num_steps``.
    Metrics: "tau_eff" [] (Eq. (b) or (b')), "client_weights" [K] (p_i)
    and "update_weights" [K] (tau_eff p_i / ||a_i||_1, the weight of
    x_i - x in x+ - x; 0 for a client without steps).
  """
  checks.check_choice("tau_eff", tau_eff, _TAU_EFF)
  checks.check_range("momentum", momentum, 0, 1, high_open=True)
  checks.check_range("proximal_mu", proximal_mu, 0)
  checks.check_range("learning_rate", learning_rate, 0, low_open=True)
  concrete = not any(checks.is_traced(v) for v in (momentum, proximal_mu,
                                                    learning_rate))
  if concrete and momentum > 0 and proximal_mu > 0:
    raise ValueError(
        "fednova: momentum and proximal_mu cannot both be > 0 (the paper "
        f"gives no normaliser for the two together), got momentum="
        f"{momentum}, proximal_mu={proximal_mu}")
  if concrete and proximal_mu > 0 and learning_rate * proximal_mu >= 1:
    raise ValueError(
        f"fednova: learning_rate * proximal_mu must be < 1 (the proximal "
        f"step contracts), got {learning_rate} * {proximal_mu}")

  def norms(info, missing=_NO_STEPS):
    a = normalizer(_num_steps(info, missing), momentum, proximal_mu,
                   learning_rate)
    return jnp.where(info.mask > 0, a, 0.0)

  def step(global_params, mean_normalized, mean_update, effective_steps):
    """Eq. (c) (statistics: the mean update)."""
    statistics = tree_math.select_leaves(global_params,
                                         tree_math.is_statistic)
    return jax.tree.map(
        lambda g, d, u, s: g + (u if s else
                                effective_steps.astype(d.dtype) * d),
        global_params, mean_normalized, mean_update, statistics)

  init = empty_init(FedNovaState)

  def aggregate(global_params, client_params, info, state):
    # First, so that a cohort without steps gets this rule's message rather
    # than check_cohort's shape check failing on None.
    _num_steps(info)
    checks.check_cohort(global_params, client_params, info,
                        fields=("num_steps",))
    return finalize(global_params, summed_client_stats(
        client_stats, global_params, client_params, info), info, state)

  def client_stats(global_params, client_params, info_k):
    # Only secure aggregation's range probe reaches the streaming form
    # without steps (see _NO_SECURE_SUM); the engine always passes them.
    a = norms(info_k, _NO_SECURE_SUM)
    update = tree_math.tree_sub(client_params, global_params)
    # Eq. (a); a client without steps has d_i = 0.
    scale = jnp.where(a > 0, 1.0 / jnp.where(a > 0, a, 1.0), 0.0)
    normalized = jax.tree.map(lambda u: u * scale.astype(u.dtype), update)
    # Eq. (b) sums ||a_i||_1, Eq. (b') the steps tau_i.
    length = a if tau_eff == "normalized" else jnp.where(
        info_k.mask > 0, jnp.asarray(info_k.num_steps, jnp.float32), 0.0)
    # The raw update is summed too: the BatchNorm statistics take its plain
    # mean in ``step``, not the normalised one.
    return tree_math.client_sums((normalized, update, length), info_k.mask,
                                 info_k.num_examples)

  def finalize(global_params, sums, info, state):
    mean_scaled, mean_update, effective_steps = tree_math.mean_from_sums(
        sums)
    new_global = tree_math.keep_if_no_clients(
        info.mask, step(global_params, mean_scaled, mean_update,
                        effective_steps), global_params)
    weights = tree_math.normalize_weights(
        info.num_examples.astype(jnp.float32), info.mask)
    return new_global, state, _metrics(weights, norms(info),
                                       effective_steps)

  return Aggregator(init, aggregate, StreamingForm(client_stats, finalize))


def _metrics(weights, a, effective_steps):
  coefficients = jnp.where(
      a > 0, effective_steps * weights / jnp.where(a > 0, a, 1.0), 0.0)
  return {"tau_eff": effective_steps, "client_weights": weights,
          "update_weights": coefficients}
