"""FedDRL's experience buffer: a fixed-capacity ring with TD-rank sampling.

Nguyen et al., FedDRL, ICPP 2022, §3.4.1 and Algorithm 1 lines 1-4.

The buffer holds transitions (s, a, r, s') in arrays of fixed capacity C with
a write pointer and a size, so it lives in a jitted, vmappable state. While
it is filling, the valid entries are rows [0, size); once full, new rows
overwrite the oldest (the pointer wraps) and every row is valid.

Algorithm 1 gives every experience a priority |delta| (its temporal
difference), sorts the buffer by descending priority and samples "the
higher the priority, the likelier". We sample by rank: the experience of
rank r (1 = highest priority) is drawn with probability proportional to
r ** -exponent (exponent 0 is uniform sampling), with replacement.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_agg import checks

__all__ = ["ReplayBuffer", "Transition", "add", "add_many", "gather", "init",
    "merge", "rank_probabilities", "rows_of_draws", "sample_indices"]


class Transition(NamedTuple):
  """One (or a batch of) experience(s); leading axes are batch axes.

  Attributes:
    state: [..., S] s_t.
    action: [..., A] a_t.
    reward: [...] r_t.
    next_state: [..., S] s_{t+1}.
  """
  state: jax.Array
  action: jax.Array
  reward: jax.Array
  next_state: jax.Array


class ReplayBuffer(NamedTuple):
  """Transitions in rows [0, size) of capacity-C arrays.

  Attributes:
    data: a ``Transition`` with leading axis [C].
    write_index: [] int32, the row the next transition goes to.
    size: [] int32, number of valid rows (at most C).
  """
  data: Transition
  write_index: jax.Array
  size: jax.Array

  @property
  def capacity(self) -> int:
    # The last axis, so that a stack of workers' buffers [M, C] also reports
    # its per-worker capacity.
    return self.data.reward.shape[-1]


def init(capacity: int, state_dim: int, action_dim: int) -> ReplayBuffer:
  """An empty buffer of ``capacity`` rows."""
  checks.check_int("capacity", capacity, 1)
  zeros = lambda *shape: jnp.zeros(shape, jnp.float32)
  return ReplayBuffer(
      data=Transition(zeros(capacity, state_dim), zeros(capacity, action_dim),
                      zeros(capacity), zeros(capacity, state_dim)),
      write_index=jnp.zeros((), jnp.int32), size=jnp.zeros((), jnp.int32))


def add_many(buffer: ReplayBuffer, transitions: Transition,
             valid: jax.Array) -> ReplayBuffer:
  """Appends the valid rows of ``transitions`` [M, ...] in order.

  Equivalent to adding the rows where ``valid`` [M] is true one by one: the
  pointer wraps and, when more than C rows come, only the last C survive.
  """
  capacity = buffer.capacity
  valid = valid.astype(bool)
  position = jnp.cumsum(valid.astype(jnp.int32)) - 1  # among the valid rows
  count = jnp.sum(valid.astype(jnp.int32))
  # Rows overwritten within this call are dropped, so targets are unique:
  # XLA leaves unspecified which of several updates to one scatter index
  # wins, and "the last C survive" would not hold.
  keep = valid & (position >= count - capacity)
  target = jnp.where(keep, (buffer.write_index + position) % capacity,
                     capacity)  # out of bounds: dropped
  data = jax.tree.map(lambda old, new: old.at[target].set(new, mode="drop"),
                      buffer.data, transitions)
  return ReplayBuffer(
      data=data,
      write_index=((buffer.write_index + count) % capacity).astype(jnp.int32),
      size=jnp.minimum(buffer.size + count, capacity).astype(jnp.int32))


def add(buffer: ReplayBuffer, transition: Transition,
        valid=True) -> ReplayBuffer:
  """Appends one transition (unbatched leaves) if ``valid``."""
  return add_many(buffer, jax.tree.map(lambda x: x[None], transition),
                  jnp.reshape(jnp.asarray(valid), (1,)))


def merge(buffers: ReplayBuffer, capacity: int) -> ReplayBuffer:
  """One buffer of ``capacity`` rows from stacked buffers [M, C_w, ...].

  Takes worker 0's valid rows, then worker 1's, ... (the last ``capacity``
  of them if more come).
  """
  num_workers, worker_capacity = buffers.data.reward.shape
  state_dim = buffers.data.state.shape[-1]
  action_dim = buffers.data.action.shape[-1]
  rows = jax.tree.map(
      lambda x: x.reshape((num_workers * worker_capacity,) + x.shape[2:]),
      buffers.data)
  valid = (jnp.arange(worker_capacity)[None, :] < buffers.size[:, None])
  return add_many(init(capacity, state_dim, action_dim), rows,
                  valid.reshape(-1))


def gather(buffer: ReplayBuffer, indices: jax.Array) -> Transition:
  """The transitions at ``indices`` [B]: a ``Transition`` of [B, ...]."""
  return jax.tree.map(lambda x: x[indices], buffer.data)


def rank_probabilities(priorities: jax.Array, size: jax.Array,
                       exponent: float) -> jax.Array:
  """P(row) from its priority rank among the valid rows. [C] -> [C].

  Row of rank r (1 = largest priority among rows [0, size)) gets
  r ** -exponent / sum_{j <= size} j ** -exponent; invalid rows get 0. Ties
  are ranked by row index.
  """
  capacity = priorities.shape[0]
  valid = jnp.arange(capacity) < size
  # Algorithm 1 line 2: sort by descending priority, invalid rows last.
  order = jnp.argsort(jnp.where(valid, -priorities, jnp.inf), stable=True)
  rank = jnp.arange(1, capacity + 1, dtype=jnp.float32)
  # softmax of -exponent log r is r ** -exponent normalised over the valid
  # ranks, without forming large powers; a -inf logit gives exactly 0.
  logits = jnp.where(rank <= size, -exponent * jnp.log(rank), -jnp.inf)
  probs_by_rank = jax.nn.softmax(logits)
  return jnp.zeros((capacity,), jnp.float32).at[order].set(probs_by_rank)


def sample_indices(key, probabilities: jax.Array,
                   batch_size: int) -> jax.Array:
  """``batch_size`` rows drawn with replacement from ``probabilities`` [C].

  ``probabilities`` is ``rank_probabilities(...)``; computing it once per
  call of Algorithm 1 and sampling every batch from it follows the paper
  (priorities are assigned once, then b batches are drawn). Inverse-CDF
  sampling (``rows_of_draws``): O(C + B log C), rows of probability 0 are
  never drawn. -> [B] int32.
  """
  return rows_of_draws(probabilities,
                       jax.random.uniform(key, (batch_size,)))


def rows_of_draws(probabilities: jax.Array, draws: jax.Array) -> jax.Array:
  """The rows that uniform ``draws`` [B] in [0, 1] select by inverse CDF.

  A draw falls in row i's share [cdf[i-1], cdf[i]) of the running total
  (scaled by its last value); a draw at the very end goes to the last row
  of positive probability. No row of probability 0 is returned while one
  has a positive probability. -> [B] int32.
  """
  cdf = jnp.cumsum(probabilities)
  # Scaled by the cdf's own total rather than assuming it sums to 1 after
  # rounding. side="right" maps u in [cdf[i-1], cdf[i]) to row i, an empty
  # interval for a row of probability 0.
  u = draws * cdf[-1]
  indices = jnp.searchsorted(cdf, u, side="right")
  # A draw can reach the running total of the last row of positive
  # probability (a draw of 1, or a cumsum whose last entry, summed in
  # another order, rounds above that row's). searchsorted then returns C or
  # a later row: in a buffer still filling, an empty slot of probability
  # 0. Such a draw belongs to that last row; a draw below its running
  # total already maps to it or to an earlier row, unchanged by the clamp.
  rows = jnp.arange(probabilities.shape[0])
  last = jnp.max(jnp.where(probabilities > 0, rows, 0))
  return jnp.minimum(indices, last).astype(jnp.int32)
