"""Ways of splitting a pooled training set over clients, as the papers do.

Every function maps labels (plus a seed and its parameters) to
``list[np.ndarray]``: for each client, the int64 indices of its examples in
the pooled training arrays. They are pure and seeded: the same arguments give
the same indices, and no index is given to two clients. Examples left out by
a recipe (e.g. the remainder that does not fill a shard) belong to no client.

Arguments are checked before anything is drawn: counts must be integers
(``num_clients`` at most the number of examples, which the message says
when it is exceeded), rates such as ``alpha`` finite and positive; a bad
value raises ``ValueError`` (``TypeError`` for a non-number) naming the
argument.

Every recipe is in ``REGISTRY`` under the name ``NAMES`` lists;
``REGISTRY.build("shards", labels=y, num_clients=100)`` calls
``shards(y, num_clients=100)``. Every client a recipe returns holds at
least one example (``dirichlet`` refuses ``min_size=0``); ``build``
checks it and raises ``ValueError`` naming the recipe and the empty
clients, should a recipe ever break that promise.

``FederatedData.from_partition(x, y, client_indices)`` turns the result into
per-client data; ``summary`` and ``plot_heatmap`` describe it.
"""

from fedjax_agg.partitions._recipes import classes_per_client
from fedjax_agg.partitions._recipes import ClientIndices
from fedjax_agg.partitions._skewed import clustered_equal
from fedjax_agg.partitions._skewed import clustered_non_equal
from fedjax_agg.partitions._recipes import dirichlet
from fedjax_agg.partitions._recipes import dirichlet_per_client
from fedjax_agg.partitions._recipes import iid
from fedjax_agg.partitions._recipes import mixed_iid
from fedjax_agg.partitions._skewed import pareto
from fedjax_agg.partitions._recipes import shards
from fedjax_agg.partitions._recipes import shards_non_equal
from fedjax_agg.partitions._skewed import unbalanced
from fedjax_agg.partitions._report import heatmap_figure
from fedjax_agg.partitions._report import label_histogram
from fedjax_agg.partitions._report import plot_heatmap
from fedjax_agg.partitions._report import summary
from fedjax_agg.registry import Registry

__all__ = [
    "ALL_NAMES", "NAMES", "NATURAL", "REGISTRY", "ClientIndices",
    "classes_per_client",
    "clustered_equal", "clustered_non_equal", "dirichlet",
    "dirichlet_per_client", "heatmap_figure", "iid", "label_histogram",
    "mixed_iid", "pareto", "plot_heatmap", "shards", "shards_non_equal",
    "summary", "unbalanced",
]



class _PartitionRegistry(Registry):
  """A ``Registry`` whose ``build`` refuses a partition with an empty
  client (which could not train and breaks ``from_partition`` later)."""

  def build(self, name: str, **kwargs) -> ClientIndices:
    parts = super().build(name, **kwargs)
    empty = [i for i, part in enumerate(parts) if len(part) == 0]
    if empty:
      raise ValueError(
          f"partition {name!r} left {len(empty)} client(s) without any "
          f"example (client ids {empty[:10]}"
          f"{' ...' if len(empty) > 10 else ''}); every client needs at "
          "least one")
    return parts


REGISTRY = _PartitionRegistry("partition", {
    "iid": iid,
    "shards": shards,
    "shards_non_equal": shards_non_equal,
    "classes_per_client": classes_per_client,
    "mixed_iid": mixed_iid,
    "dirichlet": dirichlet,
    "dirichlet_per_client": dirichlet_per_client,
    "unbalanced": unbalanced,
    "pareto": pareto,
    "clustered_equal": clustered_equal,
    "clustered_non_equal": clustered_non_equal,
})
"""The partition recipes by name: name -> ``recipe(labels, num_clients, seed,
...) -> ClientIndices``; ``build`` refuses a partition that leaves a client
without examples."""
NAMES = REGISTRY.names
"""The names of the registered partition recipes."""
NATURAL = "natural"
"""A config's partition of a natural federation (``data.FEDERATIONS``): its
own clients, all of them or ``num_clients`` drawn with the seed."""
ALL_NAMES = tuple(NAMES) + (NATURAL,)
"""Every name a config's ``partition.name`` may take."""
