"""FedOpt: a server optimizer applied to the round's pseudo-gradient.

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar and McMahan,
"Adaptive Federated Optimization", ICLR 2021.

The server treats -Delta_t = w_t - aggregate(clients) as a gradient and
steps any optax transformation with it (``with_server_optimizer``); the
aggregate is FedAvg by default, or any other ``Aggregator`` (``base``).

FedAdagrad, FedAdam and FedYogi follow Algorithm 2 of the paper exactly,
with Delta_t = aggregate - w_t:

  m_t = beta1 m_{t-1} + (1 - beta1) Delta_t                     m_{-1} = 0
  v_t = v_{t-1} + Delta_t^2                                    (FedAdagrad)
  v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2                  (FedAdam)
  v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2) (FedYogi)
  w_{t+1} = w_t + eta m_t / (sqrt(v_t) + tau)

with v_{-1} = tau^2 (the algorithm asks v_{-1} >= tau^2) and no bias
correction. ``bias_correction=True`` with ``initial_accumulator=0`` gives
Kingma and Ba's Adam instead (``optax.adam(eta, b1, b2, eps=tau)`` for
FedAdam). FedAvgM is SGD with heavy-ball momentum at the server
(``optax.sgd(eta, momentum)``): m_t = beta m_{t-1} + Delta_t,
w_{t+1} = w_t + eta m_t.

The server step, its empty-cohort rule and its streaming form are
``with_server_optimizer``'s (``_server_optimizer.py``).
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import checks
from fedjax_agg.aggregators._fedavg import fedavg
from fedjax_agg.aggregators._server_optimizer import with_server_optimizer
from fedjax_agg.types import Aggregator

KINDS = ("adagrad", "adam", "yogi")


class ScaleByReddiState(NamedTuple):
  """Moments of Algorithm 2: m and v (trees like the params), step count."""
  m: Any
  v: Any
  count: jax.Array


def scale_by_reddi(kind: str, b1: float, b2: float, tau: float,
                   initial_accumulator: Optional[float] = None,
                   bias_correction: bool = False
                   ) -> optax.GradientTransformation:
  """Algorithm 2's preconditioner, as an optax transformation.

  Given gradient g = -Delta_t it returns m_t / (sqrt(v_t) + tau) (of g; chain
  with ``optax.scale_by_learning_rate`` for the step).

  Args:
    kind: "adagrad", "adam" or "yogi" (the v_t update).
    b1: beta1, first-moment decay.
    b2: beta2, second-moment decay (unused by "adagrad").
    tau: adaptivity tau.
    initial_accumulator: v_{-1}; tau^2 when None.
    bias_correction: divide m and v by (1 - b1^t) and (1 - b2^t) as Adam.
  """
  checks.check_choice("kind", kind, KINDS)
  checks.check_bool("bias_correction", bias_correction)
  for name, value in (("b1", b1), ("b2", b2)):
    checks.check_range(name, value, 0, 1, high_open=True)
  checks.check_range("tau", tau, 0, low_open=True)
  # Algorithm 2 requires v_{-1} >= tau^2; tau^2 is its smallest choice.
  v_init = tau**2 if initial_accumulator is None else initial_accumulator
  if initial_accumulator is not None:
    checks.check_range("initial_accumulator", initial_accumulator, 0)

  def init(params):
    return ScaleByReddiState(
        jax.tree.map(jnp.zeros_like, params),
        jax.tree.map(lambda p: jnp.full_like(p, v_init), params),
        jnp.zeros((), jnp.int32))

  def second_moment(v, g):
    if kind == "adagrad":
      return v + g**2
    if kind == "adam":
      return b2 * v + (1 - b2) * g**2
    return v - (1 - b2) * g**2 * jnp.sign(v - g**2)

  def update(updates, state, params=None):
    del params
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.m, updates)
    v = jax.tree.map(second_moment, state.v, updates)
    count = state.count + 1
    m_hat, v_hat = m, v
    if bias_correction:
      m_hat = optax.tree.bias_correction(m, b1, count)
      v_hat = optax.tree.bias_correction(v, b2, count)
    out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + tau), m_hat, v_hat)
    return out, ScaleByReddiState(m, v, count)

  return optax.GradientTransformation(init, update)


def _reddi(kind, server_learning_rate, b1, b2, tau, base,
           initial_accumulator, bias_correction) -> Aggregator:
  checks.check_range("server_learning_rate", server_learning_rate, 0,
                     low_open=True)
  preconditioner = scale_by_reddi(kind, b1, b2, tau, initial_accumulator,
                                  bias_correction)
  # scale_by_learning_rate multiplies by -eta: a descent step on the
  # gradient -Delta_t is the ascent w + eta m / (sqrt(v) + tau) of Alg. 2.
  step = optax.scale_by_learning_rate(server_learning_rate)
  return fedopt(optax.chain(preconditioner, step), base=base)


def fedopt(transformation: Optional[optax.GradientTransformation] = None, *,
           base: Optional[Aggregator] = None) -> Aggregator:
  """A general server optimizer over ``base`` (default FedAvg).

  Args:
    transformation: optax transformation stepped with the pseudo-gradient;
      ``optax.sgd(1.0)`` (plain FedAvg) when None.
    base: the aggregator giving the target model; ``fedavg()`` when None.
  """
  return with_server_optimizer(base or fedavg(),
                               transformation or optax.sgd(1.0))


def fedavgm(server_learning_rate: float = 1.0, momentum: float = 0.9, *,
            base: Optional[Aggregator] = None) -> Aggregator:
  """FedAvgM: server SGD with heavy-ball momentum (eta, beta)."""
  checks.check_range("server_learning_rate", server_learning_rate, 0,
                     low_open=True)
  checks.check_range("momentum", momentum, 0, 1, high_open=True)
  # A traced momentum (a sweep) keeps the buffer: its value is unknown
  # while building, and every member must share one state structure.
  if not checks.is_traced(momentum) and momentum == 0:
    momentum = None  # plain SGD, no momentum buffer
  return fedopt(optax.sgd(server_learning_rate, momentum=momentum),
                base=base)


def fedadagrad(server_learning_rate: float = 0.1, b1: float = 0.9,
               tau: float = 1e-3, *, base: Optional[Aggregator] = None,
               initial_accumulator: Optional[float] = None,
               bias_correction: bool = False) -> Aggregator:
  """FedAdagrad (Algorithm 2): v_t = v_{t-1} + Delta_t^2.

  Args:
    server_learning_rate: server eta (named apart from the clients'
      learning rate).
    b1: beta1 (first moment).
    tau: adaptivity tau.
    base: the aggregator giving the target model; ``fedavg()`` when None.
    initial_accumulator: v_{-1}; tau^2 when None.
    bias_correction: Adam-style bias correction (not in Algorithm 2).
  """
  return _reddi("adagrad", server_learning_rate, b1, 0.0, tau, base,
                initial_accumulator, bias_correction)


def fedadam(server_learning_rate: float = 0.01, b1: float = 0.9,
            b2: float = 0.99, tau: float = 1e-3, *,
            base: Optional[Aggregator] = None,
            initial_accumulator: Optional[float] = None,
            bias_correction: bool = False) -> Aggregator:
  """FedAdam (Algorithm 2): v_t = beta2 v_{t-1} + (1 - beta2) Delta_t^2.

  Args: as ``fedadagrad``, plus b2 (beta2). ``bias_correction=True,
  initial_accumulator=0.0`` is ``optax.adam(server_learning_rate,
  b1, b2, eps=tau)`` on the pseudo-gradient.
  """
  return _reddi("adam", server_learning_rate, b1, b2, tau, base,
                initial_accumulator, bias_correction)


def fedyogi(server_learning_rate: float = 0.01, b1: float = 0.9,
            b2: float = 0.99, tau: float = 1e-3, *,
            base: Optional[Aggregator] = None,
            initial_accumulator: Optional[float] = None,
            bias_correction: bool = False) -> Aggregator:
  """FedYogi (Algorithm 2): v_t moves towards Delta_t^2 by a signed step.

  v_t = v_{t-1} - (1 - beta2) Delta_t^2 sign(v_{t-1} - Delta_t^2).

  Args: as ``fedadam``.
  """
  return _reddi("yogi", server_learning_rate, b1, b2, tau, base,
                initial_accumulator, bias_correction)
