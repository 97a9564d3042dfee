"""The partition registry and tables over every recipe: reproducible and
disjoint, never an empty client, arguments refused by name.
"""

import math
import re

import numpy as np
import pytest

from fedjax_agg import partitions
from tests.partitions._util import _assert_disjoint
from tests.partitions._util import LABELS
from tests.partitions._util import UNEQUAL

ALL = [
    (partitions.classes_per_client, {"k": 2}),
    (partitions.mixed_iid, {"num_iid": 3, "samples_per_client": 200}),
    (partitions.dirichlet, {"alpha": 0.5}),
    (partitions.dirichlet_per_client, {"alpha": 0.5}),
    (partitions.unbalanced, {}),
    (partitions.pareto, {}),
    (partitions.clustered_equal, {"delta": 0.4}),
    (partitions.clustered_non_equal, {"delta": 0.4}),
]


@pytest.mark.parametrize("fn,kwargs", ALL)
def test_every_partition_reproducible_and_disjoint(fn, kwargs):
  a = fn(UNEQUAL, num_clients=10, seed=11, **kwargs)
  b = fn(UNEQUAL, num_clients=10, seed=11, **kwargs)
  c = fn(UNEQUAL, num_clients=10, seed=12, **kwargs)
  assert len(a) == 10
  assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
  _assert_disjoint(a, UNEQUAL.size)


TINY = np.arange(10) % 5  # 10 examples.

# Arguments every recipe needs besides labels, num_clients and seed.
EXTRA = {"mixed_iid": {"num_iid": 1, "samples_per_client": 1}}


def test_names_and_registry():
  assert partitions.NAMES == (
      "iid", "shards", "shards_non_equal", "classes_per_client",
      "mixed_iid", "dirichlet", "dirichlet_per_client", "unbalanced",
      "pareto", "clustered_equal", "clustered_non_equal")
  assert tuple(partitions.REGISTRY) == partitions.NAMES
  for name in partitions.NAMES:
    assert partitions.REGISTRY[name] is getattr(partitions, name)
  built = partitions.REGISTRY.build("shards", labels=LABELS, num_clients=5,
                                    seed=3)
  direct = partitions.shards(LABELS, 5, seed=3)
  assert all(np.array_equal(a, b) for a, b in zip(built, direct, strict=True))
  assert partitions.REGISTRY.describe("dirichlet")["alpha"] == 0.5
  with pytest.raises(ValueError, match="partition must be one of"):
    partitions.REGISTRY.factory("round_robin")
  with pytest.raises(TypeError, match="unknown argument"):
    partitions.REGISTRY.build("iid", labels=LABELS, num_clients=2, beta=1)


@pytest.mark.parametrize("name", partitions.NAMES)
def test_more_clients_than_examples_says_so(name):
  with pytest.raises(ValueError, match=r"num_clients=20 is larger than the "
                     r"10 examples available"):
    partitions.REGISTRY.build(name, labels=TINY, num_clients=20,
                              **EXTRA.get(name, {}))


# (recipe, argument, bad value, error): non-numbers are TypeErrors, numbers
# out of range (negative counts, fractions, NaN, inf) ValueErrors.
BAD_ARGUMENTS = [
    ("iid", "num_clients", "10", TypeError),
    ("iid", "seed", "0", TypeError),
    ("iid", "samples_per_client", "7", TypeError),
    ("iid", "num_clients", True, TypeError),
    ("iid", "num_clients", None, TypeError),
    ("shards", "shards_per_client", "two", TypeError),
    ("classes_per_client", "k", "2", TypeError),
    ("dirichlet", "alpha", "0.5", TypeError),
    ("dirichlet", "alpha", None, TypeError),
    ("dirichlet_per_client", "alpha", "abc", TypeError),
    ("unbalanced", "exponent", "1.5", TypeError),
    ("clustered_equal", "delta", "0.4", TypeError),
    ("mixed_iid", "num_iid", "1", TypeError),
    ("iid", "num_clients", -3, ValueError),
    ("iid", "num_clients", 2.5, ValueError),
    ("iid", "num_clients", math.nan, ValueError),
    ("iid", "num_clients", math.inf, ValueError),
    ("iid", "seed", -1, ValueError),
    ("iid", "samples_per_client", -5, ValueError),
    ("shards", "shards_per_client", 0, ValueError),
    ("shards_non_equal", "min_shards", -6, ValueError),
    ("classes_per_client", "k", -1, ValueError),
    ("classes_per_client", "num_classes", 0, ValueError),
    ("mixed_iid", "num_iid", -1, ValueError),
    ("mixed_iid", "samples_per_client", 0, ValueError),
    ("dirichlet", "min_size", -1, ValueError),
    ("dirichlet", "min_size", 0, ValueError),
    ("dirichlet", "max_tries", 0, ValueError),
    ("unbalanced", "min_size", -10, ValueError),
    ("unbalanced", "classes_per_client", 0, ValueError),
    ("clustered_equal", "labels_per_client", -2, ValueError),
]


@pytest.mark.parametrize("name,argument,value,error", BAD_ARGUMENTS)
def test_bad_arguments_raise_naming_the_argument(name, argument, value,
                                                 error):
  kwargs = {"labels": LABELS, "num_clients": 5, **EXTRA.get(name, {}),
            argument: value}
  with pytest.raises(error, match=argument):
    partitions.REGISTRY.build(name, **kwargs)


@pytest.mark.parametrize("name", partitions.NAMES)
def test_no_recipe_returns_an_empty_client(name):
  parts = partitions.REGISTRY.build(name, labels=LABELS, num_clients=5,
                                    **EXTRA.get(name, {}))
  assert len(parts) == 5 and min(len(p) for p in parts) >= 1


def test_registry_refuses_a_partition_with_empty_clients():
  def leaky(labels, num_clients, seed=0):
    del seed
    parts = [np.arange(i, labels.size, num_clients)
             for i in range(num_clients)]
    parts[1] = parts[3] = np.zeros(0, np.int64)
    return parts

  registry = type(partitions.REGISTRY)("partition", {"leaky": leaky})
  with pytest.raises(ValueError, match=re.escape(
      "partition 'leaky' left 2 client(s) without any example (client ids "
      "[1, 3])")):
    registry.build("leaky", labels=LABELS, num_clients=5)
