"""Markov on/off availability: exponential online and offline sojourns.

Each client alternates between online and offline; a sojourn online lasts
an exponential time of mean ``mean_online_s``, one offline of mean
``mean_offline_s``, all independent (a continuous-time two-state Markov
chain). At t = 0 a client is online with the stationary probability
``p = mean_online_s / (mean_online_s + mean_offline_s)``, so the process is
stationary: at every t each client is online with probability p, and the
long-run online fraction is p.

Randomness by address. Client c's initial state and its j-th sojourn come
from a counter-based generator: a splitmix64-style hash of (key, c, j),
keys from ``np.random.SeedSequence(seed)``. The whole timeline of every
client is thus a fixed function of the seed, generated lazily for the
clients a query names, and no query (its order, its clients, its times)
changes the answer of another.

Lazy generation. Sojourns are summed in blocks of ``BLOCK``: switch
``m * BLOCK`` is the sequential sum of the whole blocks before it, and the
switches inside a block are that plus the block's cumulative sum, always
computed the same way, so a switch time never depends on the path that
reached it. Per client the model caches a cursor (block index and switch
time at its start) at the last queried time; a query at a later time walks
forward from there, vectorised over the queried clients (one pass per block
crossed by the farthest of them); a query before the cursor starts over from
t = 0. Memory: two [N] arrays.
"""

import numpy as np

from fedjax_agg import checks
from fedjax_agg.systems import _common
from fedjax_agg.systems._availability import Availability

__all__ = ["BLOCK", "markov"]

BLOCK = 32

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
  """The splitmix64 finaliser (a bijection of uint64 with good avalanche)."""
  x = (x ^ (x >> np.uint64(30))) * _MIX1
  x = (x ^ (x >> np.uint64(27))) * _MIX2
  return x ^ (x >> np.uint64(31))


def uniform(key: np.uint64, client_ids: np.ndarray,
            index: np.ndarray) -> np.ndarray:
  """Uniform (0, 1) float64 addressed by (key, client id, index).

  ``client_ids`` and ``index`` broadcast against each other.
  """
  # uint64 products wrap modulo 2**64 by design of the hash.
  with np.errstate(over="ignore"):
    clients = np.asarray(client_ids).astype(np.uint64)
    counter = np.asarray(index).astype(np.uint64)
    bits = _mix(_mix(key ^ (clients * _GOLDEN)) + counter * _GOLDEN)
  # The top 53 bits, offset by half a step: never exactly 0 or 1, so the log of
  # a sojourn's uniform is always finite.
  return ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53


class _Markov(Availability):
  """Sojourn j of client c: state ``initial[c] XOR (j odd)``, duration
  ``-mean(state) * log(u(c, j))``; switch j at ``S_j`` with S_0 = 0."""

  def __init__(self, num_clients, mean_online_s, mean_offline_s, seed):
    super().__init__(num_clients)
    self.mean_online_s = float(mean_online_s)
    self.mean_offline_s = float(mean_offline_s)
    # Separate keys for the initial states and the sojourns: both are indexed
    # from 0 and would otherwise reuse the same draws.
    state_key, self._key = np.random.SeedSequence(seed).generate_state(
        2, np.uint64)
    fraction = self.mean_online_s / (self.mean_online_s + self.mean_offline_s)
    self.initial = uniform(state_key, np.arange(num_clients), 0) < fraction
    self._block = np.zeros(num_clients, np.int64)    # cursor: block index
    self._block_start = np.zeros(num_clients)        # S_{block * BLOCK}

  def _durations(self, ids, block):
    """[K, BLOCK] sojourn lengths of the given blocks of the given clients."""
    index = block[:, None] * BLOCK + np.arange(BLOCK)
    online = self.initial[ids][:, None] ^ (index % 2 == 1)
    mean = np.where(online, self.mean_online_s, self.mean_offline_s)
    return -mean * np.log(uniform(self._key, ids[:, None], index))

  def _window(self, ids, t):
    # Fancy indexing copies: the cursors change only where they are written back
    # after the walk.
    block = self._block[ids]
    start = self._block_start[ids]
    restart = t < start
    block[restart] = 0
    start[restart] = 0.0
    sojourn = np.zeros(ids.shape, np.int64)
    next_switch = np.zeros(ids.shape)   # S_{sojourn + 1}, the next switch
    todo = np.arange(ids.shape[0])
    while todo.size:
      ends = start[todo, None] + np.cumsum(
          self._durations(ids[todo], block[todo]), axis=1)
      inside = t[todo] < ends[:, -1]
      done, rest = todo[inside], todo[~inside]
      ends_in = ends[inside]
      # ends[r] = S_{block * BLOCK + r + 1}: r switches of the block are <= t.
      crossed = np.sum(ends_in <= t[done, None], axis=1)
      sojourn[done] = block[done] * BLOCK + crossed
      next_switch[done] = ends_in[np.arange(done.size), crossed]
      block[rest] += 1
      start[rest] = ends[~inside, -1]
      todo = rest
    self._block[ids] = block
    self._block_start[ids] = start
    is_online = self.initial[ids] ^ (sojourn % 2 == 1)
    return is_online, next_switch


def markov(mean_online_s: float, mean_offline_s: float, seed: int, *,
           num_clients: int) -> Availability:
  """Two-state Markov availability (see the module docstring).

  Args:
    mean_online_s: mean length of an online sojourn, seconds (> 0).
    mean_offline_s: mean length of an offline sojourn, seconds (> 0).
    seed: int >= 0.
    num_clients: N.

  Returns:
    An ``Availability``; its long-run online fraction is
    ``mean_online_s / (mean_online_s + mean_offline_s)``.
  """
  _common.check_num_clients(num_clients)
  _common.check_seed(seed)
  checks.check_range("mean_online_s", mean_online_s, 0, low_open=True)
  checks.check_range("mean_offline_s", mean_offline_s, 0, low_open=True)
  return _Markov(num_clients, mean_online_s, mean_offline_s, seed)
