"""Where a client's accuracy is measured: held-out splits and accuracies.

``holdout_split`` cuts every client's example list into a training part and
a validation part (seeded); both are ``FederatedData`` over the same pooled
arrays, so nothing is copied. ``client_accuracies`` evaluates one model per
row of a cohort on that row's client's examples, all rows in one call.
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg.federated import FederatedData
from fedjax_agg.types import Model, Params

__all__ = ["balanced_indices", "client_accuracies", "holdout_split",
           "shared_split"]


def _pack(rows: list[np.ndarray]) -> tuple[jax.Array, jax.Array]:
  counts = np.array([len(r) for r in rows], np.int32)
  # Ragged rows become one fixed-shape [N, max] table (jit needs static shapes);
  # the zero padding is a valid index, and ``counts`` says how much of each row
  # is real.
  table = np.zeros((len(rows), counts.max()), np.int32)
  for i, r in enumerate(rows):
    table[i, :len(r)] = r
  return jnp.asarray(table), jnp.asarray(counts)


def holdout_split(data: FederatedData, fraction: float = 0.2, seed: int = 0
                  ) -> tuple[FederatedData, FederatedData]:
  """Splits each client's examples into training and validation parts.

  Client i keeps ``n_val = round(fraction * n_i)`` examples apart, clipped to
  [1, n_i - 1], drawn uniformly from its examples with a generator seeded by
  ``(seed, i)`` (so a client's split does not depend on the others).

  Args:
    data: the federated data; every client needs at least 2 examples.
    fraction: share of each client's examples held out, in (0, 1).
    seed: seed of the split.

  Returns:
    ``(train_data, validation_data)`` over the same pooled ``x``/``y``.
  """
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
  counts = np.asarray(data.num_examples)
  if counts.min() < 2:
    raise ValueError(
        "holdout_split needs at least 2 examples per client in data; clients "
        f"{np.flatnonzero(counts < 2).tolist()[:10]} have fewer")
  indices = np.asarray(data.client_indices)
  train_rows, val_rows = [], []
  for i, n in enumerate(counts):
    # Seeded by (seed, i): a client's split depends on its own examples only,
    # never on how many draws the clients before it used.
    rng = np.random.default_rng([seed, i])
    own = indices[i, :n][rng.permutation(n)]
    # Half rounds up (numpy's round goes to even), and both parts keep at least
    # one example.
    n_val = int(np.clip(np.floor(fraction * n + 0.5), 1, n - 1))
    # Sorted back into pooled order: the permutation decides only which examples
    # are held out, not the order they are read in.
    val_rows.append(np.sort(own[:n_val]))
    train_rows.append(np.sort(own[n_val:]))
  train = FederatedData(data.x, data.y, *_pack(train_rows))
  validation = FederatedData(data.x, data.y, *_pack(val_rows))
  return train, validation


def balanced_indices(labels, per_class: int, seed: int = 0) -> np.ndarray:
  """``per_class`` examples of every class, drawn without replacement
  (seeded), sorted. -> [C * per_class] indices into ``labels``."""
  labels = np.asarray(labels)
  if per_class < 1:
    raise ValueError(f"per_class must be >= 1, got {per_class!r}")
  rng = np.random.default_rng(seed)
  picked = []
  for label in np.unique(labels):
    members = np.flatnonzero(labels == label)
    if len(members) < per_class:
      raise ValueError(f"per_class={per_class}: class {label} has only "
                       f"{len(members)} examples")
    picked.append(rng.choice(members, per_class, replace=False))
  return np.sort(np.concatenate(picked))


def shared_split(examples: tuple, num_clients: int) -> FederatedData:
  """One (x, y) set as every client's split: ``FederatedData`` over those
  arrays whose N index rows all list every example (e.g. a validation set
  held by the server, the same for all clients)."""
  x, y = examples
  count = len(y)
  if count < 1 or len(x) != count:
    raise ValueError(f"examples must be a non-empty (x, y) of equal "
                     f"lengths, got {len(x)} and {count}")
  return FederatedData(
      jnp.asarray(x), jnp.asarray(y, jnp.int32),
      jnp.broadcast_to(jnp.arange(count, dtype=jnp.int32),
                       (num_clients, count)),
      jnp.full((num_clients,), count, jnp.int32))


def client_accuracies(model: Model, stacked_params: Params,
                      data: FederatedData, client_ids: jax.Array,
                      batch_size: int = 256,
                      rows_per_step: Optional[int] = None) -> jax.Array:
  """Accuracy of model row r on client ``client_ids[r]``'s examples.

  Args:
    model: the network.
    stacked_params: [R, ...] one model per row.
    data: whose examples to use (e.g. the validation part of a split).
    client_ids: [R] client of each row (rows may repeat a client).
    batch_size: examples per forward pass.
    rows_per_step: rows evaluated side by side (vmap width); all when None.

  Returns:
    [R] float32 fraction of correctly classified examples.
  """
  width = data.max_examples
  num_batches = -(-width // batch_size)
  positions = jnp.arange(num_batches * batch_size).reshape(num_batches, -1)

  def one(args):
    params, client = args
    count = data.num_examples[client]
    # Padded to whole batches with index 0 (a valid example); ``pos < count``
    # below keeps padded positions out of the hits.
    indices = jnp.pad(data.client_indices[client],
                      (0, num_batches * batch_size - width))
    indices = indices.reshape(num_batches, -1)

    def correct(batch):
      idx, pos = batch
      logits, _ = model.apply(params, data.x[idx], False)
      hits = (jnp.argmax(logits, -1) == data.y[idx]) & (pos < count)
      return jnp.sum(hits)

    # A sequential map over batches: memory holds one batch of activations per
    # row, whatever the client's size.
    hits = jax.lax.map(correct, (indices, positions))
    # A client with no examples gives 0, not 0/0.
    return jnp.sum(hits) / jnp.maximum(count, 1).astype(jnp.float32)

  # ``batch_size`` vmaps that many rows per step of the map: the width trades
  # memory for speed.
  return jax.lax.map(one, (stacked_params, client_ids),
                     batch_size=rows_per_step or client_ids.shape[0])
