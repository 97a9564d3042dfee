"""Attacks as a data-side and an update-side piece, and their composition.

An ``Attack`` acts on the malicious rows of a round only (the rows picked by
an ``Adversaries`` rule, see ``_adversaries.py``), inside the jitted round:

* ``data(data, cohort) -> data``: the ``FederatedData`` the cohort trains
  on (data poisoning, e.g. ``label_flip``); it must leave the examples of
  the honest clients as they are;
* ``update(global_params, client_params, cohort) -> client_params``: the
  [K, ...] models the cohort sends after training (model poisoning, e.g.
  ``sign_flip``); only the malicious rows of its output are used, the
  honest rows keep their trained models.

``compose(a, b)`` applies ``a`` then ``b`` on both sides. ``per_client``
lifts an update written for ONE client to the cohort form.
"""

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg.types import Params, PRNGKey, StackedParams

__all__ = ["Attack", "Cohort", "compose", "per_client", "select_rows"]


class Cohort(NamedTuple):
  """What an attack knows about the round's cohort.

  Attributes:
    client_ids: [K] int32 ids.
    mask: [K] float32, 1 for a real participant, 0 for a padding row.
    malicious: [K] bool, True for the malicious rows (real rows only).
    round: [] int32, 1-based round number.
    key: the attack's PRNG key for this round (independent of the key
      that shuffles the clients' data).
  """
  client_ids: jax.Array
  mask: jax.Array
  malicious: jax.Array
  round: jax.Array
  key: PRNGKey

  @property
  def honest(self) -> jax.Array:
    """[K] bool, the real rows that are not malicious."""
    return (self.mask > 0) & ~self.malicious


class Attack(NamedTuple):
  """What malicious clients do (module docstring); either side may be None.

  Attributes:
    data: ``data(data, cohort) -> data`` or None.
    update: ``update(global_params, client_params, cohort) ->
      client_params`` ([K, ...] in and out) or None.
    num_classes: C when the data side writes labels for exactly C classes
      (``label_flip`` with a permutation or ``num_classes``), else None.
      The wrapper (``with_attack`` given the model) refuses a model whose
      outputs are not C wide, which would otherwise train on labels the
      model does not have, or map its other classes wrongly.
    max_label: the largest label the data side writes (a backdoor's
      target), else None; the wrapper given the model refuses a model with
      no output for it.
  """
  data: Optional[Callable[[Any, Cohort], Any]] = None
  update: Optional[Callable[[Params, StackedParams, Cohort],
                            StackedParams]] = None
  num_classes: Optional[int] = None
  max_label: Optional[int] = None


def select_rows(rows: jax.Array, stacked_true: StackedParams,
                stacked_false: StackedParams) -> StackedParams:
  """Row k of ``stacked_true`` where ``rows[k]``, else of ``stacked_false``."""
  def leaf(a, b):
    return jnp.where(rows.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
  return jax.tree.map(leaf, stacked_true, stacked_false)


def per_client(fn: Callable[[Params, Params, PRNGKey], Params]
               ) -> Callable[[Params, StackedParams, Cohort], StackedParams]:
  """An attack's ``update`` from ``fn(global_params, params, key) ->
  params`` written for one client; client k's key is
  ``fold_in(cohort.key, client_ids[k])``, so its draws depend neither on
  its row nor on the other clients."""
  def update(global_params, client_params, cohort: Cohort):
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
        cohort.key, cohort.client_ids)
    return jax.vmap(fn, in_axes=(None, 0, 0))(global_params, client_params,
                                              keys)
  return update


def _with_key(cohort: Cohort, index: int) -> Cohort:
  return cohort._replace(key=jax.random.fold_in(cohort.key, index))


def compose(first: Attack, second: Attack) -> Attack:
  """``first`` then ``second``, on the data side and on the update side.

  The two pieces draw from independent keys. On the update side
  ``second`` sees the models ``first`` made the malicious rows send (and
  the trained ones of the honest rows).
  """
  for name, attack in (("first", first), ("second", second)):
    if not isinstance(attack, Attack):
      raise TypeError(f"{name} must be an Attack, got "
                      f"{type(attack).__name__}")

  def data(data, cohort):
    data = first.data(data, _with_key(cohort, 0))
    return second.data(data, _with_key(cohort, 1))

  def update(global_params, client_params, cohort):
    attacked = first.update(global_params, client_params,
                            _with_key(cohort, 0))
    # ``first`` may rewrite every row; only its malicious rows are kept, so
    # ``second`` sees the honest rows' trained models, as the contract says.
    attacked = select_rows(cohort.malicious, attacked, client_params)
    return second.update(global_params, attacked, _with_key(cohort, 1))

  def either(first_side, second_side, both):
    # With one side missing the other runs as it would alone (same key), so
    # composing with an empty side changes no draw.
    if first_side is None or second_side is None:
      return first_side or second_side
    return both

  if None not in (first.num_classes, second.num_classes) and (
      first.num_classes != second.num_classes):
    raise ValueError(f"first is written for num_classes="
                     f"{first.num_classes}, second for "
                     f"{second.num_classes}")
  labels = [a.max_label for a in (first, second) if a.max_label is not None]
  return Attack(data=either(first.data, second.data, data),
                update=either(first.update, second.update, update),
                num_classes=(first.num_classes if first.num_classes
                             is not None else second.num_classes),
                max_label=max(labels) if labels else None)
