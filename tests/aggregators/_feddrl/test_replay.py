"""FedDRL's replay buffer: rank probabilities against numpy, ring-buffer
writes, batched adds and merged worker buffers.
"""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fedjax_agg.aggregators._feddrl import replay


@given(priorities=st.lists(st.floats(0, 10), min_size=8, max_size=8),
       size=st.integers(1, 8), exponent=st.sampled_from([0.0, 0.5, 1.0]))
def test_rank_probabilities_match_numpy(priorities, size, exponent):
  priorities = np.asarray(priorities, np.float32)
  probs = np.asarray(replay.rank_probabilities(
      jnp.asarray(priorities), jnp.asarray(size), exponent))
  order = np.argsort(-priorities[:size], kind="stable")
  weights = np.arange(1, size + 1, dtype=np.float64)**-exponent
  expected = np.zeros(8)
  expected[order] = weights / weights.sum()
  np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-7)


def numbered(n, start=0):
  """Transitions whose every field holds its index (to track rows)."""
  idx = np.arange(start, start + n, dtype=np.float32)
  return replay.Transition(
      state=jnp.asarray(np.repeat(idx[:, None], 2, 1)),
      action=jnp.asarray(np.repeat(idx[:, None], 3, 1)),
      reward=jnp.asarray(idx),
      next_state=jnp.asarray(np.repeat(idx[:, None], 2, 1) + 0.5))


def test_ring_buffer_wraps_at_capacity():
  capacity = 5
  buffer = replay.init(capacity, 2, 3)
  add = jax.jit(replay.add)
  rows = numbered(8)
  for i in range(8):
    buffer = add(buffer, jax.tree.map(lambda x, i=i: x[i], rows))
    assert int(buffer.size) == min(i + 1, capacity)
    assert int(buffer.write_index) == (i + 1) % capacity
  # Rows 5, 6, 7 overwrote rows 0, 1, 2: [5, 6, 7, 3, 4].
  np.testing.assert_array_equal(buffer.data.reward, [5, 6, 7, 3, 4])
  np.testing.assert_array_equal(buffer.data.next_state[:, 0],
                                [5.5, 6.5, 7.5, 3.5, 4.5])
  # An invalid transition changes nothing.
  same = add(buffer, jax.tree.map(lambda x: x[0], rows), False)
  for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(buffer), strict=True):
    np.testing.assert_array_equal(a, b)


@given(first=st.lists(st.booleans(), min_size=9, max_size=9),
       second=st.lists(st.booleans(), min_size=9, max_size=9))
def test_add_many_equals_adding_one_by_one(first, second):
  capacity = 4
  buffer = replay.init(capacity, 2, 3)
  rewards, pointer, size = np.zeros(capacity), 0, 0  # numpy reference
  for start, valid in ((0, first), (9, second)):
    rows = numbered(9, start)
    buffer = add_many_jit(buffer, rows, jnp.asarray(valid))
    for i in np.flatnonzero(valid):
      rewards[pointer] = start + i
      pointer, size = (pointer + 1) % capacity, min(size + 1, capacity)
  np.testing.assert_array_equal(buffer.data.reward, rewards)
  np.testing.assert_array_equal(buffer.data.state[:, 0], rewards)
  np.testing.assert_array_equal(buffer.data.next_state[:size, 1],
                                rewards[:size] + 0.5)
  assert int(buffer.write_index) == pointer and int(buffer.size) == size


add_many_jit = jax.jit(replay.add_many)


def test_merge_keeps_every_worker_valid_row():
  workers = []
  for start, count in ((0, 3), (100, 5)):
    buffer = replay.add_many(replay.init(6, 2, 3), numbered(count, start),
                             jnp.ones(count, bool))
    workers.append(buffer)
  stacked = jax.tree.map(lambda *x: jnp.stack(x), *workers)
  merged = replay.merge(stacked, capacity=10)
  assert int(merged.size) == 8 and int(merged.write_index) == 8
  np.testing.assert_array_equal(merged.data.reward[:8],
                                [0, 1, 2, 100, 101, 102, 103, 104])
  small = replay.merge(stacked, capacity=4)  # keeps the last 4
  np.testing.assert_array_equal(np.sort(small.data.reward),
                                [101, 102, 103, 104])


@given(priorities=st.lists(st.floats(0, 10), min_size=8, max_size=8),
       size=st.integers(1, 7), exponent=st.sampled_from([0.0, 1.0, 3.0]))
def test_a_draw_at_the_total_never_returns_an_empty_slot(priorities, size,
                                                         exponent):
  # A buffer still filling: rows >= size are empty (probability 0), the
  # last row among them. A draw of 1 puts u exactly on the running total,
  # where searchsorted returns C; it must land on the last valid row.
  probs = replay.rank_probabilities(jnp.asarray(priorities, jnp.float32),
                                    jnp.asarray(size), exponent)
  edges = np.array([1.0, np.nextafter(np.float32(1), np.float32(0)), 0.0],
                   np.float32)
  inside = np.random.default_rng(size).random(500).astype(np.float32)
  draws = np.concatenate([edges, inside])
  rows = np.asarray(rows_of_draws_jit(probs, jnp.asarray(draws)))
  probs = np.asarray(probs)
  assert np.all(probs[rows] > 0) and np.all(rows < size)
  assert rows[0] == np.flatnonzero(probs > 0).max()
  # Away from the edges of the rows' shares, the draws are numpy's
  # inverse CDF (float64).
  cdf = np.cumsum(probs.astype(np.float64))
  u = draws.astype(np.float64) * cdf[-1]
  clear = np.min(np.abs(u[:, None] - cdf[None, :]), axis=1) > 1e-5
  np.testing.assert_array_equal(
      rows[clear], np.searchsorted(cdf, u[clear], side="right"))


rows_of_draws_jit = jax.jit(replay.rows_of_draws)


def test_sampled_rows_are_valid_rows():
  probs = replay.rank_probabilities(jnp.arange(8.0), jnp.asarray(3), 1.0)
  sample = jax.jit(replay.sample_indices, static_argnums=2)
  for seed in range(20):
    rows = np.asarray(sample(jax.random.key(seed), probs, 256))
    assert np.all(rows < 3)
