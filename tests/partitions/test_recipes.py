"""The label-based recipes (IID, shards, classes per client, mixed IID,
Dirichlet): each recipe's defining property, reproducibility,
disjointness, and its arguments refused by name.
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


def test_iid_equal_sizes_and_near_uniform_labels():
  parts = partitions.iid(BALANCED, 10, seed=3)
  assert [len(p) for p in parts] == [600] * 10
  _assert_disjoint(parts, BALANCED.size)
  for p in parts:
    hist = np.bincount(BALANCED[p], minlength=10)
    assert hist.min() > 30 and hist.max() < 95  # 60 expected per class.


def test_iid_samples_per_client_and_bad_sizes():
  parts = partitions.iid(BALANCED, 4, seed=0, samples_per_client=7)
  assert [len(p) for p in parts] == [7] * 4
  with pytest.raises(ValueError, match="samples_per_client"):
    partitions.iid(BALANCED, 10, samples_per_client=700)
  with pytest.raises(ValueError, match="num_clients"):
    partitions.iid(BALANCED, 0)
  with pytest.raises(ValueError, match="labels"):
    partitions.iid(np.zeros((3, 2), int), 2)


@pytest.mark.parametrize("labels", [BALANCED, UNEQUAL])
def test_shards_two_per_client(labels):
  parts = partitions.shards(labels, 10, seed=0)
  shard_size = labels.size // 20
  assert [len(p) for p in parts] == [2 * shard_size] * 10
  _assert_disjoint(parts, labels.size)
  if labels is BALANCED:  # Shards never straddle classes here.
    assert max(_num_labels(parts, labels)) <= 2
  else:  # A shard spans at most two classes.
    assert max(_num_labels(parts, labels)) <= 4
  # Each shard is a run of the label-sorted data: contiguous label values.
  for p in parts:
    assert len(np.unique(labels[p])) <= 4


def test_shards_non_equal_counts_in_range_and_all_used():
  parts = partitions.shards_non_equal(BALANCED, 20, seed=5)
  shard_size = BALANCED.size // 200
  counts = np.array([len(p) for p in parts]) // shard_size
  assert all(len(p) % shard_size == 0 for p in parts)
  assert counts.min() >= 6 and counts.max() <= 14 and counts.sum() == 200
  assert len(set(counts.tolist())) > 1
  _assert_disjoint(parts, BALANCED.size)


@pytest.mark.parametrize("fn", [partitions.iid, partitions.shards,
                                partitions.shards_non_equal])
def test_same_seed_same_indices(fn):
  a = fn(UNEQUAL, 10, seed=7)
  b = fn(UNEQUAL, 10, seed=7)
  c = fn(UNEQUAL, 10, seed=8)
  assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_classes_per_client_exactly_k_labels(k):
  parts = partitions.classes_per_client(BALANCED, 10, seed=0, k=k)
  assert _num_labels(parts, BALANCED) == [k] * 10
  _assert_disjoint(parts, BALANCED.size)
  # Every class is split over exactly k clients: sizes are equal and all
  # examples are used.
  assert [len(p) for p in parts] == [600] * 10
  hist = partitions.label_histogram(parts, BALANCED)
  np.testing.assert_array_equal((hist > 0).sum(axis=0), [k] * 10)


def test_classes_per_client_one_class_each_is_adct():
  parts = partitions.classes_per_client(UNEQUAL, 10, seed=2, k=1)
  classes = [int(np.unique(UNEQUAL[p])[0]) for p in parts]
  assert sorted(classes) == list(range(10))
  assert sum(len(p) for p in parts) == UNEQUAL.size


@pytest.mark.parametrize("num_iid,noniid_classes", [(5, 2), (2, 2), (2, 1)])
def test_mixed_iid(num_iid, noniid_classes):
  labels = np.random.default_rng(4).permutation(np.repeat(np.arange(10),
                                                          6000))
  parts = partitions.mixed_iid(labels, 10, seed=1, num_iid=num_iid,
                               noniid_classes=noniid_classes)
  assert [len(p) for p in parts] == [600] * 10
  _assert_disjoint(parts, labels.size)
  hist = partitions.label_histogram(parts, labels, 10)
  # IID clients: near-uniform histograms (multinomial 600 x 1/10: sd ~7.3).
  assert hist[:num_iid].min() >= 30 and hist[:num_iid].max() <= 90
  chi2 = ((hist[:num_iid] - 60) ** 2 / 60).sum(axis=1)
  assert (chi2 < 30).all()  # df = 9; P(chi2 > 30) ~ 4e-4.
  assert (hist[num_iid:] > 0).sum(axis=1).tolist() == (
      [noniid_classes] * (10 - num_iid))
  assert (hist[num_iid:].max(axis=1) == 600 // noniid_classes).all()


def test_mixed_iid_counts_must_agree():
  with pytest.raises(ValueError, match="num_clients"):
    partitions.mixed_iid(BALANCED, 10, num_iid=2, num_noniid=5)
  parts = partitions.mixed_iid(BALANCED, None, num_iid=1, num_noniid=2,
                               samples_per_client=30)
  assert len(parts) == 3


def _mean_max_share(parts, labels):
  hist = partitions.label_histogram(parts, labels, 10).astype(float)
  return (hist.max(axis=1) / hist.sum(axis=1)).mean()


@pytest.mark.parametrize("fn", [partitions.dirichlet,
                                partitions.dirichlet_per_client])
def test_dirichlet_smaller_alpha_more_skew(fn):
  skew = {alpha: np.mean([_mean_max_share(fn(BALANCED, 20, seed=s,
                                             alpha=alpha), BALANCED)
                          for s in range(3)])
          for alpha in (0.05, 0.5, 100.0)}
  assert skew[0.05] > skew[0.5] > skew[100.0]
  assert skew[100.0] < 0.2  # Nearly IID: the top class holds ~1/10.


def test_dirichlet_per_class_uses_all_and_respects_min_size():
  parts = partitions.dirichlet(BALANCED, 20, seed=0, alpha=0.3, min_size=50)
  _assert_disjoint(parts, BALANCED.size)
  assert sum(len(p) for p in parts) == BALANCED.size
  assert min(len(p) for p in parts) >= 50
  with pytest.raises(ValueError, match="min_size"):
    partitions.dirichlet(BALANCED, 20, alpha=0.01, min_size=290, max_tries=3)


def test_dirichlet_per_client_equal_sizes():
  parts = partitions.dirichlet_per_client(BALANCED, 12, seed=0, alpha=0.2,
                                          samples_per_client=400)
  assert [len(p) for p in parts] == [400] * 12
  _assert_disjoint(parts, BALANCED.size)


@pytest.mark.parametrize("name", ["dirichlet", "dirichlet_per_client"])
@pytest.mark.parametrize("alpha", [math.nan, math.inf, -math.inf, 0.0, -1.0])
def test_bad_alpha_is_a_value_error_naming_it(name, alpha):
  with pytest.raises(ValueError, match="alpha"):
    partitions.REGISTRY.build(name, labels=LABELS, num_clients=5,
                              alpha=alpha)


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
