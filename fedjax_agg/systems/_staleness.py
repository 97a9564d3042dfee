"""Staleness weights w(s) for an update computed from a model s versions old.

FedAsync (Xie, Koyejo & Gupta, "Asynchronous Federated Optimization",
arXiv:1903.03934, 2019) mixes an update of staleness s = t - tau with
weight alpha * w(s), with one of

* constant: w(s) = 1;
* polynomial: w(s) = (s + 1)^(-a), a >= 0;
* hinge: w(s) = 1 if s <= b, else 1 / (a (s - b) + 1), a, b >= 0.

Each factory returns a function of a staleness array (numpy or JAX, any
shape, integer or float) to float32 weights of the same shape, written in
``jax.numpy`` so that it runs inside ``jax.jit``. Every weight is in (0, 1]
and 1 at s = 0; s must be >= 0 (not checked: it may be traced).
"""

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg.registry import Registry

__all__ = ["STALENESS", "StalenessFn", "constant_staleness",
    "hinge_staleness", "polynomial_staleness"]

StalenessFn = Callable[[jax.Array], jax.Array]
"""A staleness weighting: ``w(staleness) -> weight``, elementwise on an array of
staleness values (float32 weights)."""


def _as_float(staleness) -> jax.Array:
  # Weights are float32 whatever the input: integer versions would make
  # constant_staleness's ones_like an int array.
  return jnp.asarray(staleness).astype(jnp.float32)


def constant_staleness() -> StalenessFn:
  """w(s) = 1: staleness ignored (FedBuff's plain buffered average)."""
  def weight(staleness):
    return jnp.ones_like(_as_float(staleness))
  return weight


def polynomial_staleness(a: float = 0.5) -> StalenessFn:
  """w(s) = (1 + s)^(-a) (FedAsync's polynomial function), a >= 0.

  FedBuff (Nguyen et al., AISTATS 2022) scales updates by 1 / sqrt(1 + s),
  this function with a = 0.5 (the default).
  """
  checks.check_range("a", a, 0)

  def weight(staleness):
    return (1.0 + _as_float(staleness)) ** (-a)
  return weight


def hinge_staleness(a: float = 10.0, b: float = 4.0) -> StalenessFn:
  """w(s) = 1 if s <= b else 1 / (a (s - b) + 1) (FedAsync's hinge).

  a, b >= 0; the defaults are illustrative (full weight up to 4 versions
  old, then a steep decay).
  """
  checks.check_range("a", a, 0)
  checks.check_range("b", b, 0)

  def weight(staleness):
    staleness = _as_float(staleness)
    # The inner maximum keeps the unused branch finite (no inf or NaN
    # reaches where, nor its gradient).
    return jnp.where(staleness <= b, 1.0,
                     1.0 / (a * jnp.maximum(staleness - b, 0.0) + 1.0))
  return weight


STALENESS = Registry("staleness function", {
    "constant": constant_staleness,
    "polynomial": polynomial_staleness,
    "hinge": hinge_staleness,
}, declared_as="staleness")
"""Staleness functions by name: name -> factory of a ``StalenessFn``."""
