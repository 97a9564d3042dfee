"""Label flipping, a data-poisoning attack.

Malicious clients train on their own examples with labels mapped through a
permutation π of the classes (default π(y) = C − 1 − y, which maps every
class to another one when C is even), as in Tolpegin, Truex, Gursoy, Liu,
"Data Poisoning Attacks Against Federated Learning Systems", ESORICS 2020.

Inside the round the cohort trains on a copy of the pooled labels in which
the examples of the malicious clients (their first ``num_examples`` index
entries; never those of padding rows) hold π(y); the inputs and every other
label are shared untouched. Where clients share pooled examples (an
overlapping partition), an example held by a malicious and an honest client
of the same round is flipped for both (the recipes of
``fedjax_agg.partitions`` give no example to two clients). The
``validation`` split is left clean.

Classes. A permutation (or an explicit ``num_classes``) is written for C
classes; the returned ``Attack`` says so (``Attack.num_classes``) and
``attacks.local_update`` (or ``with_attack`` given ``model``) refuses, when
the round is traced, a model whose outputs are not C wide: [1, 0] on a
10-class model would send classes 2 .. 9 to class 0, and 12 entries would
create labels 10 and 11 the model does not have.
"""

from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg.attacks._attack import Attack
from fedjax_agg.attacks._attack import Cohort
from fedjax_agg.federated import FederatedData

__all__ = ["label_flip"]


def label_flip(permutation: Optional[Sequence[int]] = None, *,
               num_classes: Optional[int] = None) -> Attack:
  """Malicious clients train on labels π(y).

  Args:
    permutation: π as a sequence, ``permutation[c]`` the label that class c
      becomes (distinct ints 0 .. C−1, C = ``len(permutation)`` the
      model's number of classes); None: π(y) = C − 1 − y.
    num_classes: C for the default map; None: 1 + the largest pooled label
      (computed inside the round). With ``permutation`` it must be
      ``len(permutation)`` when given.

  Returns:
    An ``Attack`` with a data side only; its ``num_classes`` is C when
    ``permutation`` or ``num_classes`` is given (checked against the
    model's outputs by ``attacks.local_update``), else None.

  Raises:
    TypeError: ``permutation`` is not a non-empty sequence of ints.
    ValueError: ``permutation`` is not a permutation of 0 .. len − 1, or
      ``num_classes`` is not ``len(permutation)``.
  """
  if num_classes is not None:
    checks.check_int("num_classes", num_classes, 1)
    num_classes = int(num_classes)
  table = None
  if permutation is not None:
    table = np.asarray(permutation)
    if table.ndim != 1 or table.size == 0 or table.dtype.kind not in "iu":
      raise TypeError(f"permutation must be a non-empty sequence of ints, "
                      f"got {permutation!r}")
    if not np.array_equal(np.sort(table), np.arange(table.size)):
      raise ValueError(f"permutation must be a permutation of 0 .. "
                       f"{table.size - 1}, got {permutation!r}")
    if num_classes is not None and num_classes != table.size:
      raise ValueError(f"num_classes={num_classes} must equal "
                       f"len(permutation)={table.size}")
    num_classes = int(table.size)
    table = jnp.asarray(table, jnp.int32)

  def flip(labels, all_labels):
    if table is not None:
      return table[labels]
    # Without a given C the largest pooled label decides, over every client's
    # labels, so that all malicious clients flip with the same map.
    classes = (jnp.max(all_labels) + 1 if num_classes is None
               else num_classes)
    return (classes - 1 - labels).astype(labels.dtype)

  def poison(data: FederatedData, cohort: Cohort) -> FederatedData:
    y = data.y
    indices = data.client_indices[cohort.client_ids]  # [K, L]
    counts = data.num_examples[cohort.client_ids]
    # Index rows are padded with 0 past n_k: that entry is example 0,
    # someone else's, and must not be flipped.
    held = jnp.arange(indices.shape[1])[None, :] < counts[:, None]
    write = cohort.malicious[:, None] & held
    # Rows that must not write are sent out of bounds and dropped.
    targets = jnp.where(write, indices, y.shape[0]).reshape(-1)
    labels = y[indices.reshape(-1)]
    return data._replace(y=y.at[targets].set(flip(labels, y), mode="drop"))

  return Attack(data=poison, num_classes=num_classes)
