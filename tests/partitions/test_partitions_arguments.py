"""Partition recipes refuse bad arguments by name; the recipe registry."""

import math
import re

import numpy as np
import pytest

from fedjax_agg import partitions

LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 60))
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


@pytest.mark.parametrize("name", ["dirichlet", "dirichlet_per_client"])
@pytest.mark.parametrize("alpha", [math.nan, math.inf, -math.inf, 0.0, -1.0])
def test_bad_alpha_is_a_value_error_naming_it(name, alpha):
  with pytest.raises(ValueError, match="alpha"):
    partitions.REGISTRY.build(name, labels=LABELS, num_clients=5,
                              alpha=alpha)


@pytest.mark.parametrize("name", ["unbalanced", "pareto",
                                  "clustered_non_equal"])
@pytest.mark.parametrize("exponent", [math.nan, math.inf, 0])
def test_bad_exponent_is_a_value_error_naming_it(name, exponent):
  with pytest.raises(ValueError, match="exponent"):
    partitions.REGISTRY.build(name, labels=LABELS, num_clients=5,
                              exponent=exponent)


@pytest.mark.parametrize("delta", [math.nan, math.inf, 0.0, 1.5])
def test_bad_delta_is_a_value_error_naming_it(delta):
  with pytest.raises(ValueError, match="delta"):
    partitions.clustered_equal(LABELS, 5, delta=delta)


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


def test_integral_floats_and_numpy_integers_still_count():
  a = partitions.iid(LABELS, 5.0, seed=np.int64(2), samples_per_client=10.0)
  b = partitions.iid(LABELS, 5, seed=2, samples_per_client=10)
  assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_mixed_iid_more_iid_clients_than_clients():
  with pytest.raises(ValueError, match="num_iid=6 exceeds num_clients=5"):
    partitions.mixed_iid(LABELS, 5, num_iid=6)


def test_dirichlet_refuses_min_size_zero_that_would_leave_clients_empty():
  # alpha = 0.01 over 50 clients leaves 28 of them without any example
  # when min_size=0 is let through; it is refused before any draw.
  for build in (
      lambda: partitions.dirichlet(LABELS, 50, alpha=0.01, min_size=0),
      lambda: partitions.REGISTRY.build("dirichlet", labels=LABELS,
                                        num_clients=50, alpha=0.01,
                                        min_size=0)):
    with pytest.raises(ValueError, match=r"^min_size must be "
                       r">= 1, got 0$"):
      build()
  # min_size=1 either gives every client an example or says it cannot.
  parts = partitions.dirichlet(LABELS, 50, alpha=0.5, min_size=1)
  assert min(len(p) for p in parts) >= 1
  with pytest.raises(ValueError, match="no draw gave every client "
                     "min_size=1 examples in 5 tries"):
    partitions.dirichlet(LABELS, 50, alpha=0.01, min_size=1, max_tries=5)


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
