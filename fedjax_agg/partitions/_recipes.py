"""The partition recipes: labels -> per-client example indices."""

from typing import Optional, Sequence

import numpy as np

from fedjax_agg.checks import check_range

ClientIndices = list[np.ndarray]
"""A partition: per client, the indices of its examples (one int array per
client)."""


# ----------------------------------------------------------------- helpers


def checked_labels(labels) -> np.ndarray:
  """[M] int64 labels, or ValueError unless a non-empty 1-D int array."""
  labels = np.asarray(labels)
  if labels.ndim != 1 or labels.size == 0:
    raise ValueError(f"labels must be a non-empty 1-D array, got shape "
                     f"{labels.shape}")
  if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
    raise ValueError("labels must be non-negative integers")
  return labels.astype(np.int64)


def _integer(name: str, value, low: int = 1) -> int:
  """``value`` as an int >= ``low``; TypeError or ValueError naming it.

  Integral floats (``10.0``) are accepted; bools, strings and arrays are
  not numbers here (TypeError); NaN, infinities, fractions and values
  below ``low`` are ValueErrors.
  """
  check_range(name, value, low)
  if np.ndim(value) != 0:
    raise TypeError(f"{name} must be an integer, got {value!r}")
  if not float(value).is_integer():
    raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
  return int(value)


def _positive(name: str, value) -> float:
  """``value`` as a finite float > 0; TypeError or ValueError naming it."""
  check_range(name, value, 0, np.inf, low_open=True, high_open=True)
  if np.ndim(value) != 0:
    raise TypeError(f"{name} must be a number, got {value!r}")
  return float(value)


def _num_clients(num_clients, labels: np.ndarray) -> int:
  """N as an int, refused when there are fewer examples than clients."""
  num_clients = _integer("num_clients", num_clients)
  if num_clients > labels.size:
    raise ValueError(f"num_clients={num_clients} is larger than the "
                     f"{labels.size} examples available")
  return num_clients


def _rng(seed, *extra: int) -> np.random.Generator:
  """The generator of ``seed`` (an int >= 0), or of ``[seed, *extra]``."""
  seed = _integer("seed", seed, 0)
  # [seed, *extra] seeds a stream independent of seed's own: a recipe's
  # second draw (shards' owners) leaves its first (the shards) unchanged.
  return np.random.default_rng([seed, *extra] if extra else seed)


def _shuffled_by_class(labels: np.ndarray, rng: np.random.Generator,
                       num_classes: int) -> list[np.ndarray]:
  """For each class, its example indices in a random order."""
  order = rng.permutation(labels.size)
  by_class = [[] for _ in range(num_classes)]
  # Shuffle, then a stable sort by label: within a class the order is the
  # shuffle's, so it depends on the seed and not on the data's order.
  sorted_order = order[np.argsort(labels[order], kind="stable")]
  # Class c occupies [bounds[c], bounds[c + 1]); an absent class gets an
  # empty range.
  bounds = np.searchsorted(labels[sorted_order], np.arange(num_classes + 1))
  for c in range(num_classes):
    by_class[c] = sorted_order[bounds[c]:bounds[c + 1]]
  return by_class


def checked_num_classes(labels: np.ndarray,
                        num_classes: Optional[int]) -> int:
  """C: ``num_classes`` checked against ``labels``, default max + 1."""
  if num_classes is None:
    return int(labels.max()) + 1
  num_classes = _integer("num_classes", num_classes)
  if labels.max() >= num_classes:
    raise ValueError(f"labels hold class {labels.max()} but num_classes is "
                     f"{num_classes}")
  return num_classes


def _finish(parts: Sequence[np.ndarray]) -> ClientIndices:
  # Sorted: a client's examples are in data order whatever order they were
  # dealt in; changing this order changes every client's batches, and so
  # every recorded history.
  return [np.sort(np.asarray(p, np.int64)) for p in parts]


# -------------------------------------------------------- label-blind splits


def iid(labels, num_clients: int, seed: int = 0,
        samples_per_client: Optional[int] = None) -> ClientIndices:
  """IID split: equal-size clients drawn uniformly without replacement.

  FedAvg (McMahan et al., AISTATS 2017) "IID": the data are shuffled and
  cut into ``num_clients`` equal parts (600 MNIST images each for 100
  clients); FedNNNN's "IID - B" and FedLayerWise's IID clients.

  Args:
    labels: [M] int labels of the pooled training set (only its size is used).
    num_clients: N.
    seed: seed of the shuffle.
    samples_per_client: examples per client; default ``M // N`` (the
      ``M mod N`` remainder is left out so that every client has equal size).

  Returns:
    N index arrays, each of length ``samples_per_client``.
  """
  labels = checked_labels(labels)
  num_clients = _num_clients(num_clients, labels)
  if samples_per_client is None:
    samples_per_client = labels.size // num_clients
  samples_per_client = _integer("samples_per_client", samples_per_client)
  if samples_per_client * num_clients > labels.size:
    raise ValueError(
        f"samples_per_client={samples_per_client} x num_clients="
        f"{num_clients} exceeds the {labels.size} examples")
  order = _rng(seed).permutation(labels.size)
  used = order[:samples_per_client * num_clients]
  return _finish(used.reshape(num_clients, samples_per_client))


# -------------------------------------------------------------- label skew


def shards(labels, num_clients: int, seed: int = 0,
           shards_per_client: int = 2) -> ClientIndices:
  """FedAvg's pathological non-IID split: sorted shards, equal sizes.

  McMahan et al. (AISTATS 2017): sort the data by label, cut it into
  ``shards_per_client * N`` shards of equal size and give each client
  ``shards_per_client`` shards at random. With 2 shards per client this is
  FedDRL §5.1 "Equal" and FedLap's non-IID split (200 shards of 300 MNIST
  images for 100 clients). Within a class the order is random (seeded), so
  which examples form a shard depends on the seed. A shard can straddle a
  class boundary when class sizes are not multiples of the shard size, so a
  client holds at most ``2 * shards_per_client`` labels (exactly
  ``shards_per_client`` or fewer on class-balanced data whose class size is
  a multiple of the shard size, e.g. Fashion-MNIST with N = 100).

  Args:
    labels: [M] int labels.
    num_clients: N.
    seed: seed of the within-class order and of the shard assignment.
    shards_per_client: shards each client receives.

  Returns:
    N index arrays of equal length ``shards_per_client * (M // num_shards)``.
  """
  labels = checked_labels(labels)
  num_clients = _num_clients(num_clients, labels)
  shards_per_client = _integer("shards_per_client", shards_per_client)
  num_shards = shards_per_client * num_clients
  # Two streams of one seed: which examples form the shards, and who owns
  # which shard.
  shard_list = _sorted_shards(labels, num_shards, _rng(seed))
  rng = _rng(seed, 1)
  owner_of_shard = rng.permutation(num_shards)
  return _finish([
      np.concatenate([shard_list[s] for s in
                      owner_of_shard[i * shards_per_client:
                                     (i + 1) * shards_per_client]])
      for i in range(num_clients)])


def shards_non_equal(labels, num_clients: int, seed: int = 0,
                     shards_per_client_mean: int = 10,
                     min_shards: int = 6, max_shards: int = 14
                     ) -> ClientIndices:
  """FedAvg's "non-equal" sorted-shard split (FedDRL §5.1 "Non-equal").

  The data are sorted by label and cut into ``10 N`` shards; each client
  receives a random number of shards in [6, 14]. The counts are drawn
  uniformly and then repaired (one shard at a time, from or to random
  clients still inside the range) until they sum to exactly ``10 N``, so
  every shard is used and every count stays in [min_shards, max_shards].

  Args:
    labels: [M] int labels.
    num_clients: N.
    seed: seed.
    shards_per_client_mean: shards per client on average (``num_shards /
      N``); 10 in the paper.
    min_shards: fewest shards a client receives (6 in the paper).
    max_shards: most shards a client receives (14 in the paper).

  Returns:
    N index arrays whose lengths are multiples of the shard size.
  """
  labels = checked_labels(labels)
  num_clients = _num_clients(num_clients, labels)
  mean = _integer("shards_per_client_mean", shards_per_client_mean)
  min_shards = _integer("min_shards", min_shards)
  max_shards = _integer("max_shards", max_shards)
  if not min_shards <= mean <= max_shards:
    raise ValueError(
        f"need min_shards <= shards_per_client_mean <= max_shards, got "
        f"{min_shards}, {mean}, {max_shards}")
  num_shards = mean * num_clients
  rng = _rng(seed)
  shard_list = _sorted_shards(labels, num_shards, rng)
  counts = rng.integers(min_shards, max_shards + 1, size=num_clients)
  # Repaired one shard at a time, only on clients still inside [min, max],
  # so every count stays in range; mean lies in [min, max], so N * mean is
  # reachable and the loop ends.
  while counts.sum() != num_shards:
    if counts.sum() > num_shards:
      client = rng.choice(np.flatnonzero(counts > min_shards))
      counts[client] -= 1
    else:
      client = rng.choice(np.flatnonzero(counts < max_shards))
      counts[client] += 1
  order = rng.permutation(num_shards)
  bounds = np.concatenate([[0], np.cumsum(counts)])
  return _finish([
      np.concatenate([shard_list[s] for s in order[bounds[i]:bounds[i + 1]]])
      for i in range(num_clients)])


def _sorted_shards(labels: np.ndarray, num_shards: int,
                   rng: np.random.Generator) -> list[np.ndarray]:
  """Sorts by label (random order within a class), cuts equal shards.

  The ``M mod num_shards`` examples that do not fill a shard are chosen at
  random (not from the last class) and left out.
  """
  shard_size = labels.size // num_shards
  if shard_size < 1:
    raise ValueError(f"{num_shards} shards need at least {num_shards} "
                     f"examples, got {labels.size}")
  # The examples left out are a random subset, taken before sorting:
  # cutting the sorted array's tail would drop from the last class only.
  order = rng.permutation(labels.size)[:shard_size * num_shards]
  order = order[np.argsort(labels[order], kind="stable")]
  return list(order.reshape(num_shards, shard_size))


def _rotating_classes(num_clients: int, num_classes: int, k: int,
                      rng: np.random.Generator) -> np.ndarray:
  """[N, k] distinct class ids per client, each class held equally often.

  Clients are taken in blocks of ``num_classes``; block b draws a fresh
  random permutation ``perm`` of the classes and its j-th client holds
  ``perm[j], perm[j + 1], ..., perm[j + k - 1]`` (indices mod C). Every
  full block holds each class exactly k times, so with C | N every class is
  split over ``k N / C`` clients, while the class pairs still vary from
  block to block.
  """
  if not 1 <= k <= num_classes:
    raise ValueError(f"classes per client must be in [1, {num_classes}], "
                     f"got {k}")
  assignment = np.empty((num_clients, k), np.int64)
  for start in range(0, num_clients, num_classes):
    perm = rng.permutation(num_classes)
    for j in range(min(num_classes, num_clients - start)):
      assignment[start + j] = perm[(j + np.arange(k)) % num_classes]
  return assignment


def _split_by_weights(indices: np.ndarray, weights) -> list[np.ndarray]:
  """Cuts ``indices`` into consecutive parts with sizes ~ ``weights``."""
  weights = np.asarray(weights, np.float64)
  # Floors of the cumulative shares: consecutive parts that cover every
  # index exactly once, whatever the rounding.
  cuts = np.floor(np.cumsum(weights)[:-1] / weights.sum() * indices.size)
  return np.split(indices, cuts.astype(int))


def _gather(num_clients: int, pieces) -> ClientIndices:
  """Concatenates (client, index array) pieces per client."""
  parts = [[] for _ in range(num_clients)]
  for client, piece in pieces:
    parts[client].append(piece)
  return _finish([np.concatenate(p) if p else np.zeros(0, np.int64)
                  for p in parts])


def classes_per_client(labels, num_clients: int, seed: int = 0,
                       k: int = 2, num_classes: Optional[int] = None
                       ) -> ClientIndices:
  """"#C = k" label skew: every client holds exactly k classes.

  k = 1 is ADCT's non-IID setting ("each client is configured to have only
  one class of data"); k = 2 is FedNNNN's non-IID ("clients have images of
  only 2 classes") and the usual #C=2 of NIID-Bench (Li et al., ICDE 2022).
  Classes are dealt to clients by rotating through random permutations
  (see ``_rotating_classes``) so that each class has as equal a number of
  holders as N allows; every class's examples are then split equally over
  its holders. With balanced classes and C | N all clients have equal size
  (FedNNNN's "B" condition). Classes no client holds (N k < C) are unused.

  Args:
    labels: [M] int labels.
    num_clients: N.
    seed: seed.
    k: classes per client, 1 <= k <= C.
    num_classes: C; default ``max(labels) + 1``.

  Returns:
    N index arrays; client i holds exactly the classes it was dealt.
  """
  labels = checked_labels(labels)
  num_clients = _num_clients(num_clients, labels)
  k = _integer("k", k)
  num_classes = checked_num_classes(labels, num_classes)
  rng = _rng(seed)
  assignment = _rotating_classes(num_clients, num_classes, k, rng)
  by_class = _shuffled_by_class(labels, rng, num_classes)
  pieces = []
  for c in range(num_classes):
    holders = np.flatnonzero((assignment == c).any(axis=1))
    if holders.size > by_class[c].size:
      raise ValueError(f"class {c} has {by_class[c].size} examples for "
                       f"{holders.size} clients; lower num_clients or k")
    if holders.size:
      pieces += zip(holders, np.array_split(by_class[c], holders.size),
                    strict=True)
  return _gather(num_clients, pieces)


def mixed_iid(labels, num_clients: Optional[int] = None, seed: int = 0, *,
              num_iid: int, num_noniid: Optional[int] = None,
              samples_per_client: int = 600, noniid_classes: int = 2,
              num_classes: Optional[int] = None) -> ClientIndices:
  """FedLayerWise's "5IID+5nonIID" and "2IID+8nonIID" splits.

  FedLayerWise (§IV) trains 10 clients with 600 examples each, some IID and
  the others non-IID, following FedAdp (Wu & Wang, IEEE TCCN 2021). Clients
  ``0 .. num_iid - 1`` are IID: each draws ``samples_per_client`` examples
  uniformly at random without replacement from the whole training set.
  The remaining clients are non-IID: each holds ``noniid_classes`` classes
  (dealt as in ``classes_per_client``) with ``samples_per_client`` examples
  split equally over them, drawn from what the IID clients left.

  The paper does not state how many classes a non-IID client holds; we
  default to 2, the pathological non-IID split of FedAvg that FedAdp's
  experiments build on and the class count FedLap and FedNNNN use, which
  keeps every class present somewhere in the 2IID+8nonIID federation of 10
  clients (8 clients x 2 classes cover the 10 classes); ``noniid_classes=1``
  gives the most skewed variant.

  Args:
    labels: [M] int labels.
    num_clients: N = num_iid + num_noniid (either may be left out).
    seed: seed.
    num_iid: number of IID clients.
    num_noniid: number of non-IID clients; default ``N - num_iid``.
    samples_per_client: examples per client (600 in the paper).
    noniid_classes: classes per non-IID client.
    num_classes: C; default ``max(labels) + 1``.

  Returns:
    N index arrays of length ``samples_per_client``: IID clients first.
  """
  labels = checked_labels(labels)
  num_iid = _integer("num_iid", num_iid, 0)
  if num_noniid is None:
    if num_clients is None:
      raise ValueError("give num_clients or num_noniid")
    num_noniid = _integer("num_clients", num_clients) - num_iid
    if num_noniid < 0:
      raise ValueError(f"num_iid={num_iid} exceeds num_clients="
                       f"{num_clients}")
  num_noniid = _integer("num_noniid", num_noniid, 0)
  if num_clients is not None and (
      _integer("num_clients", num_clients) != num_iid + num_noniid):
    raise ValueError(f"num_clients={num_clients} != num_iid={num_iid} + "
                     f"num_noniid={num_noniid}")
  _num_clients(num_iid + num_noniid, labels)
  n = _integer("samples_per_client", samples_per_client)
  k = _integer("noniid_classes", noniid_classes)
  num_classes = checked_num_classes(labels, num_classes)
  if (num_iid + num_noniid) * n > labels.size:
    raise ValueError(f"{num_iid + num_noniid} clients x {n} examples exceed "
                     f"the {labels.size} examples")
  rng = _rng(seed)
  order = rng.permutation(labels.size)
  parts = list(order[:num_iid * n].reshape(num_iid, n))
  rest = order[num_iid * n:]
  # What the IID clients left, sorted by class (stable: still shuffled
  # within a class), so each class's unused examples are one contiguous
  # range that the non-IID clients take from in turn (``taken``).
  rest = rest[np.argsort(labels[rest], kind="stable")]
  bounds = np.searchsorted(labels[rest], np.arange(num_classes + 1))
  taken = np.zeros(num_classes, np.int64)
  assignment = _rotating_classes(num_noniid, num_classes, k, rng)
  for classes in assignment:
    # n over k classes: quotas differ by at most one and sum to n.
    quotas = [len(q) for q in np.array_split(np.arange(n), k)]
    client = []
    for c, quota in zip(classes, quotas, strict=True):
      start = bounds[c] + taken[c]
      if start + quota > bounds[c + 1]:
        raise ValueError(f"class {c} runs out of examples for the non-IID "
                         f"clients; lower samples_per_client or num_noniid")
      client.append(rest[start:start + quota])
      taken[c] += quota
    parts.append(np.concatenate(client))
  return _finish(parts)


def dirichlet(labels, num_clients: int, seed: int = 0, alpha: float = 0.5,
              min_size: int = 10, balance: bool = True,
              max_tries: int = 1000,
              num_classes: Optional[int] = None) -> ClientIndices:
  """Label skew by a Dirichlet draw *per class over clients* (p_k ~ Dir_N).

  The NIID-Bench recipe (Li et al., ICDE 2022; also Flower Datasets'
  ``DirichletPartitioner``): for every class c, draw proportions
  ``p ~ Dir(alpha 1_N)`` over the N clients and cut the class's shuffled
  examples at those proportions. With ``balance=True`` (NIID-Bench's
  default) a client that already holds ``M / N`` examples gets proportion 0
  for the next classes. The whole draw is repeated until every client has
  at least ``min_size`` examples. Smaller alpha gives more skew; client
  sizes vary. Not to be confused with ``dirichlet_per_client``.

  Args:
    labels: [M] int labels.
    num_clients: N.
    seed: seed.
    alpha: concentration (> 0).
    min_size: smallest acceptable client size, >= 1 (a client without
      examples cannot train; 0 is refused).
    balance: cap clients at M / N while dealing classes (see above).
    max_tries: redraws before giving up.
    num_classes: C; default ``max(labels) + 1``.

  Returns:
    N index arrays covering every example once.

  Raises:
    ValueError: ``min_size`` below 1, or not reached within ``max_tries``
      draws.
  """
  labels = checked_labels(labels)
  num_clients = _num_clients(num_clients, labels)
  alpha = _positive("alpha", alpha)
  min_size = _integer("min_size", min_size, 1)
  num_classes = checked_num_classes(labels, num_classes)
  if min_size * num_clients > labels.size:
    raise ValueError(f"min_size={min_size} x num_clients={num_clients} "
                     f"exceeds the {labels.size} examples")
  rng = _rng(seed)
  # A redraw continues the same stream rather than reseeding, so the result
  # is still a function of the seed alone.
  for _ in range(_integer("max_tries", max_tries)):
    by_class = _shuffled_by_class(labels, rng, num_classes)
    sizes = np.zeros(num_clients, np.int64)
    pieces = []
    for c in range(num_classes):
      p = rng.dirichlet(np.full(num_clients, alpha))
      if balance:
        # NIID-Bench's balancing: a client already at M / N gets no share of the
        # later classes.
        p = p * (sizes < labels.size / num_clients)
      split = _split_by_weights(by_class[c], p)
      sizes += [len(s) for s in split]
      pieces += enumerate(split)
    if sizes.min() >= min_size:
      return _gather(num_clients, pieces)
  raise ValueError(f"no draw gave every client min_size={min_size} examples "
                   f"in {max_tries} tries; raise alpha or lower min_size")


def dirichlet_per_client(labels, num_clients: int, seed: int = 0,
                         alpha: float = 0.5,
                         samples_per_client: Optional[int] = None,
                         num_classes: Optional[int] = None) -> ClientIndices:
  """Label skew by a Dirichlet draw *per client over classes* (q_i ~ Dir_C).

  Hsu, Qi & Brown (2019), "Measuring the effects of non-identical data
  distribution": every client i draws class proportions
  ``q_i ~ Dir(alpha p)``, with p the class distribution of the pooled data,
  and then ``samples_per_client`` examples with those proportions, without
  replacement. When a class runs out, the client's remaining draws are
  re-spread over its classes that still have examples (its ``q_i``
  renormalised), so all clients have equal size. alpha -> infinity is IID,
  alpha -> 0 one class per client. Not to be confused with ``dirichlet``.

  Args:
    labels: [M] int labels.
    num_clients: N.
    seed: seed.
    alpha: concentration (> 0).
    samples_per_client: examples per client; default ``M // N``.
    num_classes: C; default ``max(labels) + 1``.

  Returns:
    N index arrays of length ``samples_per_client``.
  """
  labels = checked_labels(labels)
  num_clients = _num_clients(num_clients, labels)
  alpha = _positive("alpha", alpha)
  num_classes = checked_num_classes(labels, num_classes)
  n = labels.size // num_clients if samples_per_client is None else (
      _integer("samples_per_client", samples_per_client))
  if n * num_clients > labels.size or n < 1:
    raise ValueError(f"samples_per_client={n} x num_clients={num_clients} "
                     f"does not fit the {labels.size} examples")
  rng = _rng(seed)
  by_class = _shuffled_by_class(labels, rng, num_classes)
  available = np.array([c.size for c in by_class])
  prior = available / available.sum()
  taken = np.zeros(num_classes, np.int64)
  parts = []
  for _ in range(num_clients):
    # A class absent from the pool has prior 0, and Dirichlet parameters must
    # be positive.
    q = rng.dirichlet(np.maximum(alpha * prior, 1e-12))
    counts = np.zeros(num_classes, np.int64)
    while counts.sum() < n:
      room = available - taken - counts
      weights = q * (room > 0)
      if weights.sum() <= 0:  # q is ~0 on every class with room left.
        weights = (room > 0).astype(np.float64)
      draw = rng.multinomial(n - counts.sum(), weights / weights.sum())
      # Draws past a class's room are clipped; the shortfall is drawn again
      # over the classes that still have room.
      counts += np.minimum(draw, room)
    parts.append(np.concatenate([
        by_class[c][taken[c]:taken[c] + counts[c]]
        for c in range(num_classes)]))
    taken += counts
  return _finish(parts)
