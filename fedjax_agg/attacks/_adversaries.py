"""Which clients of a round are malicious: a fixed set, or a draw per round.

``fixed`` draws a set of malicious client ids once (seeded) and keeps it for
the whole run, the usual threat model of Byzantine-robust FL (Blanchard et
al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
Descent", NeurIPS 2017): a client that is malicious is malicious whenever it
is sampled. ``per_round`` instead makes floor(fraction * m) of each round's
m real participants malicious, drawn from the round's key, so that every
round holds the same proportion of attackers whatever the sampling.

Padding rows (mask 0) are never malicious.
"""

import math
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg import tree_math

__all__ = ["Adversaries", "fixed", "per_round"]


class Adversaries(NamedTuple):
  """A rule choosing the malicious rows of a round's cohort.

  Attributes:
    select: ``select(client_ids, mask, key) -> [K] bool``: True for the
      malicious rows (only real ones, mask 1); ``key`` is the round's
      attack key.
    table: for a fixed set, the [N] bool table of malicious client ids;
      None for a per-round draw.
  """
  select: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
  table: Optional[jax.Array] = None


def fixed(num_clients: int, fraction: Optional[float] = None, *,
          count: Optional[int] = None, ids: Optional[Sequence[int]] = None,
          seed: int = 0) -> Adversaries:
  """A fixed set of malicious clients, drawn once.

  Give exactly one of ``fraction``, ``count`` or ``ids``.

  Args:
    num_clients: N, the federation size.
    fraction: in [0, 1): floor(fraction * N) clients drawn uniformly
      without replacement (seeded by ``seed``).
    count: the number of clients to draw, in [0, N].
    ids: the malicious client ids themselves (distinct, in [0, N)).
    seed: seeds the draw.

  Returns:
    ``Adversaries`` whose ``table`` is the [N] bool set.
  """
  checks.check_int("num_clients", num_clients, 1)
  given = [name for name, value in
           (("fraction", fraction), ("count", count), ("ids", ids))
           if value is not None]
  if len(given) != 1:
    raise ValueError(f"fixed: give exactly one of fraction, count or ids, "
                     f"got {given or 'none'}")
  if ids is not None:
    chosen = np.asarray(ids)
    if chosen.ndim != 1 or (chosen.size and chosen.dtype.kind not in "iu"):
      raise TypeError(f"ids must be a sequence of ints, got {ids!r}")
    if chosen.size and (chosen.min() < 0 or chosen.max() >= num_clients
                        or np.unique(chosen).size != chosen.size):
      raise ValueError(f"ids must be distinct client ids in [0, "
                       f"num_clients={num_clients}), got {ids!r}")
    chosen = chosen.astype(np.int32)
  else:
    if fraction is not None:
      checks.check_range("fraction", fraction, 0, 1, high_open=True)
      count = math.floor(fraction * num_clients)
    checks.check_int("count", count, 0, num_clients)
    checks.check_int("seed", seed)
    # Drawn once, when the rule is built: the set is a constant of the run,
    # not of a round's key.
    chosen = jax.random.permutation(jax.random.key(seed), num_clients)[:count]
  table = jnp.zeros((num_clients,), bool).at[chosen].set(True)

  def select(client_ids, mask, key):
    del key
    # An id outside [0, N) reads as honest instead of wrapping onto another
    # client's entry.
    return tree_math.gather_clients(table, client_ids, False) & (mask > 0)

  return Adversaries(select, table)


def per_round(fraction: float) -> Adversaries:
  """floor(fraction * m) of each round's m real participants, at random.

  The malicious rows are drawn uniformly without replacement among the real
  rows from the round's key (the same round key draws the same rows).

  Args:
    fraction: in [0, 1).
  """
  checks.check_range("fraction", fraction, 0, 1, high_open=True)

  def select(client_ids, mask, key):
    real = mask > 0
    size = client_ids.shape[0]
    # floor(fraction * m) for every possible m, exactly (in float64 here
    # rather than float32 under jit, where 0.7 * 10 may floor to 6).
    counts = jnp.asarray([math.floor(fraction * m) for m in range(size + 1)],
                         jnp.int32)
    count = counts[jnp.sum(real)]
    # Padding draws 2, above any uniform in [0, 1), so it ranks after every
    # real row; argsort of argsort turns the draws into ranks.
    draws = jnp.where(real, jax.random.uniform(key, (size,)), 2.0)
    rank = jnp.argsort(jnp.argsort(draws))
    return real & (rank < count)

  return Adversaries(select)
