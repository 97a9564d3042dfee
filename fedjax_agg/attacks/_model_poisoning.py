"""Model poisoning written for one client: Δ_k = w_k − g is replaced.

g is the global model the round broadcast, w_k the model malicious client k
trained. Each factory gives an ``Attack`` whose update side acts on every
inexact leaf of the params tree. Integer leaves (a step counter) cannot
take a scaled or noisy value and are sent as in the model the formula
starts from: as trained (from w_k) by ``sign_flip``, ``scale_update`` and
``nonfinite``, as received (from g) by ``gaussian`` and ``free_rider``,
whose models are built from g alone:

* ``sign_flip(scale)``: g − scale · Δ_k, the reversed (and possibly
  lengthened) update, a standard Byzantine baseline;
* ``scale_update(factor)``: g + factor · Δ_k, model replacement / boosting
  (Bagdasaryan, Veit, Hua, Estrin, Shmatikov, "How To Backdoor Federated
  Learning", AISTATS 2020, with factor = N / η; Bhagoji, Chakraborty,
  Mittal, Calo, "Analyzing Federated Learning through an Adversarial Lens",
  ICML 2019, explicit boosting);
* ``gaussian(stddev)``: g + ε, ε ~ N(0, stddev² I), fresh noise per client
  and per round (the Gaussian Byzantine worker of the robust-aggregation
  literature);
* ``free_rider()``: g, a client that trains nothing and sends the model it
  received (Fraboni, Vidal, Lorenzi, "Free-rider Attacks on Model
  Aggregation in Federated Learning", AISTATS 2021, plain free riding);
* ``nonfinite(value)``: every coordinate NaN (or ±inf), the crash-faulty
  client the round's non-finite policy must exclude.
"""

import math

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg.attacks._attack import Attack
from fedjax_agg.attacks._attack import per_client

__all__ = ["free_rider", "gaussian", "nonfinite", "scale_update",
           "sign_flip"]


def _on_inexact(fn, *trees):
  """``fn`` on the float leaves of ``trees``; integer leaves of the first
  tree kept as they are."""
  def leaf(first, *rest):
    # An integer leaf cannot take a scaled or noisy value; the first tree's
    # leaf passes through unchanged.
    if not jnp.issubdtype(first.dtype, jnp.inexact):
      return first
    return fn(first, *rest).astype(first.dtype)
  return jax.tree.map(leaf, *trees)


def _scaled_update(factor):
  """g + factor · (w − g), for one client."""
  def attack(global_params, params, key):
    del key
    return _on_inexact(lambda w, g: g + factor * (w - g), params,
                       global_params)
  return Attack(update=per_client(attack))


def sign_flip(scale: float = 1.0) -> Attack:
  """Sends g − scale · Δ_k.

  Args:
    scale: > 0, the length of the reversed update relative to Δ_k.
  """
  checks.check_range("scale", scale, 0, low_open=True)
  return _scaled_update(-scale)


def scale_update(factor: float = 10.0) -> Attack:
  """Sends g + factor · Δ_k (model replacement with factor = N / η).

  Args:
    factor: a finite number (> 1 boosts, < 0 also reverses).
  """
  checks.check_range("factor", factor)
  return _scaled_update(factor)


def gaussian(stddev: float = 1.0) -> Attack:
  """Sends g + ε with ε ~ N(0, stddev² I).

  The noise of client k is drawn from fold_in(attack key, client id), then
  one key per leaf: independent across clients, leaves and rounds.

  Args:
    stddev: >= 0, the noise's standard deviation per coordinate.
  """
  checks.check_range("stddev", stddev, 0)

  def attack(global_params, params, key):
    del params
    leaves, treedef = jax.tree.flatten(global_params)
    # One key per leaf, laid out as a tree so that _on_inexact can pair each
    # leaf with its own key.
    keys = jax.tree.unflatten(treedef,
                              list(jax.random.split(key, len(leaves))))
    return _on_inexact(
        lambda g, k: g + stddev * jax.random.normal(k, g.shape, g.dtype),
        global_params, keys)
  return Attack(update=per_client(attack))


def free_rider() -> Attack:
  """Sends g, the model it received."""
  def attack(global_params, params, key):
    del params, key
    return global_params
  return Attack(update=per_client(attack))


def nonfinite(value: float = math.nan) -> Attack:
  """Sends ``value`` (NaN, inf or -inf) in every coordinate.

  Args:
    value: a non-finite float.
  """
  if (isinstance(value, bool) or not isinstance(value, (int, float))
      or math.isfinite(value)):
    raise ValueError(f"value must be nan, inf or -inf, got {value!r}")

  def attack(global_params, params, key):
    del global_params, key
    return _on_inexact(lambda w: jnp.full_like(w, value), params)
  return Attack(update=per_client(attack))
