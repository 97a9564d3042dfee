"""Partition recipes that skew client sizes (power-law: ``unbalanced``,
``pareto``) or group clients into clusters of label distributions
(FedDRL's ``clustered_equal`` / ``clustered_non_equal``)."""

from typing import Optional

import numpy as np

from fedjax_agg.checks import check_range
from fedjax_agg.partitions._recipes import ClientIndices
from fedjax_agg.partitions._recipes import _finish
from fedjax_agg.partitions._recipes import _gather
from fedjax_agg.partitions._recipes import _integer
from fedjax_agg.partitions._recipes import _num_clients
from fedjax_agg.partitions._recipes import _positive
from fedjax_agg.partitions._recipes import _rng
from fedjax_agg.partitions._recipes import _rotating_classes
from fedjax_agg.partitions._recipes import _shuffled_by_class
from fedjax_agg.partitions._recipes import _split_by_weights
from fedjax_agg.partitions._recipes import checked_labels
from fedjax_agg.partitions._recipes import checked_num_classes

# --------------------------------------------------------- quantity skew


def _power_law_weights(num_clients: int, exponent: float,
                       rng: np.random.Generator) -> np.ndarray:
  # Classic Pareto(x_m = 1, a = exponent): P(W > w) = w^-a for w >= 1.
  return 1.0 + rng.pareto(_positive("exponent", exponent), num_clients)


def unbalanced(labels, num_clients: int, seed: int = 0,
               classes_per_client: Optional[int] = None,
               exponent: float = 1.5, min_size: int = 10,
               num_classes: Optional[int] = None) -> ClientIndices:
  """Power-law client sizes with any label rule (FedNNNN "UB").

  FedNNNN: "the dataset sizes of the clients follows a power-law
  distribution, where a small number of clients hold most of the training
  images". Every client draws a weight ``w_i ~ Pareto(exponent)``
  (``P(w > t) = t^-exponent``, t >= 1) and its size is proportional to it:

  * ``classes_per_client=None`` (IID labels, "IID - UB"): each client gets
    ``min_size`` examples plus a share of the rest proportional to ``w_i``,
    drawn uniformly at random; every example is used.
  * ``classes_per_client=k`` ("non-IID - UB"): classes are dealt as in
    ``classes_per_client`` and every class's examples are split over its
    holders in proportion to their weights (each holder gets at least
    ``ceil(min_size / k)`` of each of its classes).

  Args:
    labels: [M] int labels.
    num_clients: N.
    seed: seed.
    classes_per_client: None for IID labels, else k classes per client.
    exponent: Pareto tail exponent (smaller = more skewed sizes).
    min_size: smallest client size.
    num_classes: C; default ``max(labels) + 1``.

  Returns:
    N index arrays of power-law sizes.
  """
  labels = checked_labels(labels)
  num_clients = _num_clients(num_clients, labels)
  min_size = _integer("min_size", min_size)
  num_classes = checked_num_classes(labels, num_classes)
  rng = _rng(seed)
  weights = _power_law_weights(num_clients, exponent, rng)
  if classes_per_client is None:
    if min_size * num_clients > labels.size:
      raise ValueError(f"min_size={min_size} x num_clients={num_clients} "
                       f"exceeds the {labels.size} examples")
    order = rng.permutation(labels.size)
    # Every client's min_size examples first; only the rest is dealt by
    # weight, so no client falls below min_size however small its weight.
    floor_part = order[:min_size * num_clients].reshape(num_clients, min_size)
    extra = _split_by_weights(order[min_size * num_clients:], weights)
    return _finish([np.concatenate([f, e])
                    for f, e in zip(floor_part, extra, strict=True)])
  k = _integer("classes_per_client", classes_per_client)
  assignment = _rotating_classes(num_clients, num_classes, k, rng)
  by_class = _shuffled_by_class(labels, rng, num_classes)
  # ceil(min_size / k) of each of k classes: at least min_size in all.
  per_class_min = -(-min_size // k)
  pieces = []
  for c in range(num_classes):
    holders = np.flatnonzero((assignment == c).any(axis=1))
    if not holders.size:
      continue
    if holders.size * per_class_min > by_class[c].size:
      raise ValueError(f"class {c} has {by_class[c].size} examples, too few "
                       f"for {holders.size} clients with min_size="
                       f"{min_size}")
    floor_part = by_class[c][:holders.size * per_class_min].reshape(
        holders.size, per_class_min)
    extra = _split_by_weights(by_class[c][holders.size * per_class_min:],
                              weights[holders])
    pieces += zip(holders, [np.concatenate([f, e]) for f, e in
                            zip(floor_part, extra, strict=True)],
                  strict=True)
  return _gather(num_clients, pieces)


def pareto(labels, num_clients: int, seed: int = 0,
           classes_per_client: int = 2, exponent: float = 1.5,
           min_size: int = 10,
           num_classes: Optional[int] = None) -> ClientIndices:
  """FedDRL's "Pareto" (PA): k labels per client, power-law sample counts.

  FedDRL §4.1.1: "the number of samples of a label among clients following
  a power law", 2 labels per client for (Fashion-)MNIST and 20 for
  CIFAR-100; the recipe of FedProx (Li et al., MLSys 2020) and Li et al.
  (ICLR 2020): "each device contains samples of only two digits and the
  number of samples per device follows a power law". This is
  ``unbalanced(..., classes_per_client=k)``: see there for the draw.
  """
  return unbalanced(labels, num_clients, seed, classes_per_client, exponent,
                    min_size, num_classes)


# ----------------------------------------------------------- cluster skew


def _clustered(labels, num_clients, delta, seed, labels_per_client,
               weights_fn, num_classes) -> ClientIndices:
  labels = checked_labels(labels)
  num_clients = _num_clients(num_clients, labels)
  k = _integer("labels_per_client", labels_per_client)
  num_classes = checked_num_classes(labels, num_classes)
  check_range("delta", delta, 0, 1, low_open=True)
  main = int(round(delta * num_clients))
  if main < 1:
    raise ValueError(f"delta * num_clients = {delta * num_clients} gives an "
                     f"empty main group")
  num_clusters = num_classes // k
  others = num_clients - main
  if others and num_clusters < 2:
    raise ValueError(f"{num_classes} classes make {num_clusters} label "
                     f"cluster(s) of {k}; need 2 or more")
  rng = _rng(seed)
  # The classes past num_clusters * k (C not a multiple of k) belong to no
  # cluster and are left unused.
  clusters = rng.permutation(num_classes)[:num_clusters * k].reshape(
      num_clusters, k)
  group = np.zeros(num_clients, np.int64)
  if others:
    # Round-robin over the other clusters; cluster 0 is the main group's
    # alone.
    group[main:] = 1 + np.arange(others) % min(others, num_clusters - 1)
  weights = weights_fn(num_clients, rng)
  by_class = _shuffled_by_class(labels, rng, num_classes)
  # Largest per-label count scale that every group's labels can supply.
  scale = min(
      min(by_class[c].size for c in clusters[g]) / weights[group == g].sum()
      for g in np.unique(group))
  per_label = np.floor(scale * weights).astype(np.int64)
  if per_label.min() < 1:
    raise ValueError("a client would get no examples; lower num_clients or "
                     "raise the exponent")
  # Clients take consecutive slices of each class's shuffled examples, so
  # no example is given twice.
  taken = np.zeros(num_classes, np.int64)
  parts = []
  for client in range(num_clients):
    client_parts = []
    for c in clusters[group[client]]:
      client_parts.append(by_class[c][taken[c]:taken[c] + per_label[client]])
      taken[c] += per_label[client]
    parts.append(np.concatenate(client_parts))
  return _finish(parts)


def clustered_equal(labels, num_clients: int, seed: int = 0,
                    delta: float = 0.6, labels_per_client: int = 2,
                    num_classes: Optional[int] = None) -> ClientIndices:
  """FedDRL's cluster skew, "Clustered-Equal" (CE).

  FedDRL §4.1.1: clients form groups; "a main group with delta x N clients"
  is much larger than the others, every client has two labels, and all
  clients have the same number of samples. We read "groups of clients
  owning the data classes belong to the same clusters" as: the classes are
  cut at random into disjoint label clusters of ``labels_per_client``
  classes; every member of a group holds exactly its group's cluster.
  Clients ``0 .. round(delta N) - 1`` form the main group (cluster 0); the
  other clients are dealt round-robin to groups 1, 2, ... (one per
  remaining cluster, at most ``C / labels_per_client - 1`` groups). Every
  client gets the same number of examples of each of its labels: the
  largest number the most crowded cluster (usually the main one) can
  supply, so the main group's labels dominate the federation as the paper
  intends, and examples beyond that are left out.

  Args:
    labels: [M] int labels.
    num_clients: N.
    seed: seed.
    delta: fraction of clients in the main group, in (0, 1] (0.6 in the
      paper's Table 3; 0.2 to 0.6 in its Fig. 8).
    labels_per_client: labels per client and per cluster (2 in the paper).
    num_classes: C; default ``max(labels) + 1``.

  Returns:
    N index arrays of equal length.
  """
  return _clustered(labels, num_clients, delta, seed, labels_per_client,
                    lambda n, rng: np.ones(n), num_classes)


def clustered_non_equal(labels, num_clients: int, seed: int = 0,
                        delta: float = 0.6, labels_per_client: int = 2,
                        exponent: float = 1.5,
                        num_classes: Optional[int] = None) -> ClientIndices:
  """FedDRL's "Clustered-Non-Equal" (CN): CE with power-law client sizes.

  As ``clustered_equal``, but client i's per-label count is proportional to
  a weight ``w_i ~ Pareto(exponent)`` (see ``unbalanced``), scaled as large
  as every group's labels can supply.
  """
  return _clustered(labels, num_clients, delta, seed, labels_per_client,
                    lambda n, rng: _power_law_weights(n, exponent, rng),
                    num_classes)
