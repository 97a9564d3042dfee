"""Partitions: each recipe's defining property, reproducibility and
disjointness."""

import numpy as np
import pytest

from fedjax_agg import partitions

# Class-balanced labels like Fashion-MNIST's (6,000 per class), shuffled.
BALANCED = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 600))
# Unequal class sizes like MNIST's.
UNEQUAL = np.random.default_rng(1).permutation(np.concatenate(
    [np.full(n, c) for c, n in enumerate(
        [592, 674, 596, 613, 584, 542, 592, 626, 585, 595])]))


def _assert_disjoint(parts, num_examples):
  flat = np.concatenate(parts)
  assert flat.dtype == np.int64
  assert len(np.unique(flat)) == flat.size
  assert flat.min() >= 0 and flat.max() < num_examples


def _num_labels(parts, labels):
  return [len(np.unique(labels[p])) for p in parts]


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


def test_summary_table_matches_numpy_counts():
  parts = partitions.shards(UNEQUAL, 5, seed=0)
  table = partitions.summary(parts, UNEQUAL)
  assert list(table.columns[:2]) == ["num_examples", "num_labels"]
  for i, p in enumerate(parts):
    counts = np.bincount(UNEQUAL[p], minlength=10)
    np.testing.assert_array_equal(table.iloc[i, 2:].to_numpy(), counts)
    assert table.loc[i, "num_examples"] == len(p)
    assert table.loc[i, "num_labels"] == (counts > 0).sum()


def test_plot_heatmap_writes_png(tmp_path):
  parts = partitions.clustered_non_equal(BALANCED, 12, seed=0)
  path = partitions.plot_heatmap(parts, BALANCED, str(tmp_path / "h.png"),
                                 title="CN")
  assert path.endswith("h.png")
  assert (tmp_path / "h.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
