"""A federated dataset: pooled arrays on device plus per-client index lists.

No client owns a copy of its images. ``x`` and ``y`` are the pooled training
arrays, placed on device once; client ``i`` holds the examples
``client_indices[i, :num_examples[i]]``. The index rows are padded (with 0,
a valid index that is never read as data because it lies beyond the client's
count) to the size of the largest client.
"""

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["FederatedData", "from_assignment", "from_partition",
    "from_stacked"]

_INT32_MAX = int(np.iinfo(np.int32).max)


class FederatedData(NamedTuple):
  """Pooled examples and per-client index lists.

  Attributes:
    x: [M, ...] pooled inputs.
    y: [M] int32 pooled labels.
    client_indices: [N, L] int32, row i holds client i's indices into x/y,
      padded beyond ``num_examples[i]``.
    num_examples: [N] int32 examples per client (>= 1).
    validation: optional held-out split of every client over the same
      pooled arrays (a ``FederatedData`` whose own ``validation`` is None),
      read by local updates that tune on it (ADCT); see
      ``validation.holdout_split`` and ``with_validation``.
  """
  x: jax.Array
  y: jax.Array
  client_indices: jax.Array
  num_examples: jax.Array
  validation: Optional["FederatedData"] = None

  def with_validation(self, validation: "FederatedData") -> "FederatedData":
    """This data with ``validation`` as its held-out split."""
    if not isinstance(validation, FederatedData):
      raise TypeError(f"validation must be a FederatedData, got "
                      f"{type(validation).__name__}")
    if validation.num_clients != self.num_clients:
      raise ValueError(
          f"validation has {validation.num_clients} clients, the data "
          f"{self.num_clients}")
    return self._replace(validation=validation._replace(validation=None))

  @property
  def num_clients(self) -> int:
    return self.client_indices.shape[0]

  @property
  def max_examples(self) -> int:
    return self.client_indices.shape[1]


def _int32_labels(y: np.ndarray, low: int = 0) -> np.ndarray:
  """``y`` cast to int32, refused where the cast would change a label.

  Checked before the cast: a float label with a fractional part (2.7 would
  become 2), NaN or +-inf, and a label outside [0, 2**31 - 1] (2**32 + 3 as
  int64 would wrap to 3) are refused. Integral floats (3.0) and bools
  convert exactly and are accepted.

  Raises:
    TypeError: ``y`` is not numeric.
    ValueError: a label is not an integer in [0, 2**31 - 1].
  """
  if y.dtype.kind not in "biuf":
    raise TypeError(f"y must hold integer labels, got dtype {y.dtype}")
  if y.size == 0 or y.dtype.kind == "b":
    return y.astype(np.int32)
  if y.dtype.kind == "f":
    bad = ~np.isfinite(y)
    # Non-finite values are flagged first: inf equals its own floor and
    # would pass the integrality test.
    bad[~bad] = y[~bad] != np.floor(y[~bad])
    if bad.any():
      raise ValueError(
          f"y must hold integer labels, got {int(bad.sum())} non-integral "
          f"values (first: {y[bad][:5].tolist()})")
  smallest, high = y.min(), y.max()
  if smallest < low or high > _INT32_MAX:
    raise ValueError(
        f"y must hold labels in [{low}, {_INT32_MAX}] (int32), got values "
        f"in [{smallest}, {high}]")
  return y.astype(np.int32)


def from_partition(x, y, client_indices: Sequence[np.ndarray],
                   device=None) -> FederatedData:
  """Builds a ``FederatedData`` from pooled arrays and a partition.

  Args:
    x: [M, ...] pooled inputs (numpy or jax).
    y: [M] integer labels in [0, 2**31 - 1] (integral floats such as 3.0
      are accepted; fractions, NaN and +-inf are refused, never truncated),
      or [M, T] per-token targets of a sequence task, -1 where padded.
    client_indices: one integer index array per client (as returned by
      ``fedjax_agg.partitions``); every client must hold at least 1 example.
    device: optional device or sharding to place the arrays on.

  Returns:
    The ``FederatedData`` with arrays on device.

  Raises:
    ValueError: mismatched shapes, a label that is not an integer in
      [0, 2**31 - 1] (named ``y``), an empty client or an index out of
      range.
  """
  x = np.asarray(x)
  y = np.asarray(y)
  if x.shape[0] != y.shape[0]:
    raise ValueError(
        f"x and y must have the same number of examples, got {x.shape[0]} "
        f"and {y.shape[0]}")
  if y.ndim not in (1, 2):
    raise ValueError(f"y must be labels [M] or per-token targets [M, T], "
                     f"got shape {y.shape}")
  # Per-token targets mark padded positions with -1 (never scored).
  labels = _int32_labels(y, low=-1 if y.ndim == 2 else 0)
  if len(client_indices) == 0:
    raise ValueError("client_indices must hold at least one client")
  counts = np.array([len(ix) for ix in client_indices], dtype=np.int32)
  # An empty client would divide by a zero count in every per-client mean, and
  # its local training would run on padding alone.
  if counts.min() < 1:
    raise ValueError(
        "every client must hold at least one example; client_indices has "
        f"empty clients {np.flatnonzero(counts == 0).tolist()[:10]}")
  width = int(counts.max())
  padded = np.zeros((len(client_indices), width), dtype=np.int32)
  for i, ix in enumerate(client_indices):
    ix = np.asarray(ix)
    if ix.ndim != 1 or not np.issubdtype(ix.dtype, np.integer):
      raise ValueError(
          f"client_indices[{i}] must be a 1-D integer array, got "
          f"{ix.dtype} {ix.shape}")
    # Refused here, on the host: inside jit an out-of-range gather is
    # clamped silently, and the client would train on the last pooled
    # example instead.
    if ix.size and (ix.min() < 0 or ix.max() >= x.shape[0]):
      raise ValueError(
          f"client_indices[{i}] has indices outside [0, {x.shape[0]})")
    padded[i, :ix.size] = ix
  put = (lambda a: jax.device_put(a, device)) if device else jnp.asarray
  return FederatedData(
      x=put(x), y=put(labels), client_indices=put(padded),
      num_examples=put(counts))


def from_stacked(x, y, num_examples=None, device=None) -> FederatedData:
  """Builds a ``FederatedData`` from per-client stacked arrays.

  Args:
    x: [N, L, ...] inputs, client i's first ``num_examples[i]`` rows real.
    y: [N, L] labels.
    num_examples: [N] counts; all L when None.
    device: optional device or sharding.
  """
  x = np.asarray(x)
  y = np.asarray(y)
  num_clients, width = y.shape
  if num_examples is None:
    num_examples = np.full((num_clients,), width, np.int32)
  num_examples = np.asarray(num_examples)
  indices = [i * width + np.arange(num_examples[i]) for i in
             range(num_clients)]
  return from_partition(x.reshape((-1,) + x.shape[2:]), y.reshape(-1),
                        indices, device)


def from_assignment(x, y, client_of_example, num_clients: int,
                    device=None) -> FederatedData:
  """Builds a ``FederatedData`` from the owner of every pooled example.

  Vectorised (a stable argsort and a bincount, no Python loop and no object
  per client), so populations of millions of clients build in seconds.
  Client ``i`` holds the examples ``j`` with ``client_of_example[j] == i``
  in increasing order of ``j``.

  Args:
    x: [M, ...] pooled inputs (numpy or jax).
    y: [M] integer labels, as in ``from_partition``.
    client_of_example: [M] int, the client owning each example, in
      ``[0, num_clients)``, or -1 for an example no client holds.
    num_clients: N; every client must hold at least 1 example.
    device: optional device or sharding to place the arrays on.

  Returns:
    The ``FederatedData`` with arrays on device; ``client_indices`` is
    [N, L] with L the largest client's size.
  """
  x = np.asarray(x)
  y = np.asarray(y)
  owner = np.asarray(client_of_example)
  if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
    raise ValueError(f"num_clients must be a positive int, got "
                     f"{num_clients!r}")
  if x.shape[0] != y.shape[0] or y.ndim != 1:
    raise ValueError(
        f"x [M, ...] and y [M] must have the same number of examples, got "
        f"shapes {x.shape} and {y.shape}")
  labels = _int32_labels(y)
  if owner.shape != y.shape or not np.issubdtype(owner.dtype, np.integer):
    raise ValueError(
        f"client_of_example must be an integer array of shape {y.shape}, got "
        f"{owner.dtype} {owner.shape}")
  if owner.size and (owner.min() < -1 or owner.max() >= num_clients):
    raise ValueError(
        f"client_of_example must lie in [0, {num_clients}) or be -1, got "
        f"values in [{owner.min()}, {owner.max()}]")
  held = np.flatnonzero(owner >= 0)
  owners = owner[held]
  counts = np.bincount(owners, minlength=num_clients).astype(np.int32)
  if counts.min() < 1:
    empty = np.flatnonzero(counts == 0)
    raise ValueError(
        f"every client must hold at least one example; {empty.size} clients "
        f"hold none (first: {empty[:10].tolist()})")
  order = np.argsort(owners, kind="stable")
  sorted_owners = owners[order]
  # After a stable sort by owner, each client's examples are one contiguous run
  # in increasing j; an example's column is its offset in that run.
  starts = np.cumsum(counts) - counts
  position = np.arange(owners.size) - starts[sorted_owners]
  padded = np.zeros((num_clients, int(counts.max())), np.int32)
  padded[sorted_owners, position] = held[order]
  put = (lambda a: jax.device_put(a, device)) if device else jnp.asarray
  return FederatedData(
      x=put(x), y=put(labels), client_indices=put(padded),
      num_examples=put(counts))
