"""The size- and cluster-skewed recipes (unbalanced, Pareto, clustered):
each recipe's defining property, and its arguments refused by name.
"""

import math

import numpy as np
import pytest

from fedjax_agg import partitions
from tests.partitions._util import _assert_disjoint
from tests.partitions._util import _num_labels
from tests.partitions._util import BALANCED
from tests.partitions._util import LABELS
from tests.partitions._util import UNEQUAL


def test_unbalanced_power_law_sizes():
  labels = np.random.default_rng(5).permutation(np.repeat(np.arange(10),
                                                          2000))
  parts = partitions.unbalanced(labels, 100, seed=0, min_size=20)
  sizes = np.sort([len(p) for p in parts])[::-1]
  _assert_disjoint(parts, labels.size)
  assert sizes.sum() == labels.size and sizes.min() >= 20
  # Heavy tail: the largest 20% of clients hold far more than 20% of data.
  assert sizes[:20].sum() > 0.4 * labels.size
  noniid = partitions.unbalanced(labels, 100, seed=0, classes_per_client=2)
  assert max(_num_labels(noniid, labels)) == 2
  assert min(len(p) for p in noniid) >= 10
  _assert_disjoint(noniid, labels.size)


def test_pareto_two_labels_and_unequal_sizes():
  parts = partitions.pareto(UNEQUAL, 20, seed=0)
  assert _num_labels(parts, UNEQUAL) == [2] * 20
  sizes = [len(p) for p in parts]
  assert max(sizes) > 2 * min(sizes)
  assert sum(sizes) == UNEQUAL.size
  _assert_disjoint(parts, UNEQUAL.size)


@pytest.mark.parametrize("num_clients,delta", [(10, 0.6), (20, 0.2),
                                               (100, 0.6)])
@pytest.mark.parametrize("equal", [True, False])
def test_cluster_skew(num_clients, delta, equal):
  labels = np.random.default_rng(6).permutation(np.repeat(np.arange(10),
                                                          2000))
  fn = partitions.clustered_equal if equal else partitions.clustered_non_equal
  parts = fn(labels, num_clients, seed=0, delta=delta)
  _assert_disjoint(parts, labels.size)
  label_sets = [frozenset(np.unique(labels[p]).tolist()) for p in parts]
  assert all(len(s) == 2 for s in label_sets)
  main = round(delta * num_clients)
  # The main group shares one label pair that no other client holds, and it
  # is the largest group.
  assert len(set(label_sets[:main])) == 1
  assert label_sets[0] not in label_sets[main:]
  groups = {s: label_sets.count(s) for s in label_sets}
  assert groups[label_sets[0]] == max(groups.values())
  # Groups' label sets are disjoint.
  assert len(set().union(*groups)) == 2 * len(groups)
  sizes = np.array([len(p) for p in parts])
  if equal:
    assert len(set(sizes.tolist())) == 1
  else:
    assert sizes.max() > 2 * sizes.min()


def test_cluster_skew_bad_delta():
  with pytest.raises(ValueError, match="delta"):
    partitions.clustered_equal(BALANCED, 10, delta=1.5)
  with pytest.raises(ValueError, match="main group"):
    partitions.clustered_equal(BALANCED, 10, delta=0.01)


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
