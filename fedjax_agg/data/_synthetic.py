"""FedProx's Synthetic(alpha, beta) federation, generated without files."""

from typing import NamedTuple

import numpy as np

from fedjax_agg.checks import check_range
from fedjax_agg.data._sources import Dataset


class SyntheticFederation(NamedTuple):
  """FedProx's Synthetic(alpha, beta): pooled arrays plus the device split.

  Attributes:
    dataset: a ``Dataset`` with [M, 60] features (``input_shape=(60,)``).
    train_indices: per device, its rows of ``dataset.train_x``.
    test_indices: per device, its rows of ``dataset.test_x``.
    weights: [N, 60, 10] float32, each device's W_k (transposed: x @ W_k).
    biases: [N, 10] float32, each device's b_k.
    means: [N, 60] float32, each device's feature mean v_k.
  """
  dataset: Dataset
  train_indices: list
  test_indices: list
  weights: np.ndarray
  biases: np.ndarray
  means: np.ndarray


def _cut(train_fraction: float, size: int) -> int:
  """The training examples of a device of ``size`` examples."""
  return int(round(train_fraction * size))


def _check_split(train_fraction: float, min_size: int) -> None:
  """Refuses a split leaving the smallest device without a training or a
  test example.

  Devices have at least ``min_size`` examples, and both a device's
  training count and its test count grow (by at most one) with its size:
  the smallest device decides for all.
  """
  cut = _cut(train_fraction, min_size)
  if 1 <= cut <= min_size - 1:
    return
  # The smallest min_size that works, for the message: near 0.5 / the
  # smaller share, where round() first gives one example to each side.
  # Searched in a bounded range: for a share near 0 (or float's limits)
  # no practical size works, and 0.5 / share may not even be an int.
  share = min(train_fraction, 1.0 - train_fraction)
  hint = ""
  if share > 1e-9:
    start = max(2, int(0.5 / share))
    for size in range(start, start + 1000):
      if 1 <= _cut(train_fraction, size) <= size - 1:
        hint = f"raise min_size to {size} or more, or "
        break
  raise ValueError(
      f"train_fraction {train_fraction} of min_size {min_size} examples "
      f"gives a device {cut} training and {min_size - cut} test examples; "
      f"every device needs at least one of each: {hint}bring "
      "train_fraction nearer 0.5")


def synthetic(alpha: float = 1.0, beta: float = 1.0, num_clients: int = 30,
              seed: int = 0, iid: bool = False, dim: int = 60,
              num_classes: int = 10, train_fraction: float = 0.8,
              size_log_mean: float = 4.0, size_log_sigma: float = 2.0,
              min_size: int = 50) -> SyntheticFederation:
  """FedProx's Synthetic(alpha, beta) (Li et al., MLSys 2020, §5.1).

  For every device k: ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)``
  (10 x 60), ``b_k ~ N(u_k, 1)``; ``B_k ~ N(0, beta)``, ``v_k[j] ~
  N(B_k, 1)``; features ``x ~ N(v_k, Sigma)`` with diagonal
  ``Sigma_jj = j^-1.2`` (j = 1..60) and labels ``y = argmax(softmax(W_k x +
  b_k))``. alpha makes the devices' models differ, beta their data. As in
  the authors' released generator, the second argument of N(0, alpha) and
  N(0, beta) is the standard deviation, and device sizes follow
  ``floor(LogNormal(4, 2)) + 50`` (the paper's "power law"). ``iid=True``
  is the paper's Synthetic-IID: one W, b ~ N(0, 1) and one v ~ N(0, 1)
  shared by all devices. Each device's examples are split at random into
  ``train_fraction`` for training and the rest for testing (80/20 as in
  FedProx).

  Args:
    alpha: model heterogeneity (>= 0).
    beta: data heterogeneity (>= 0).
    num_clients: number of devices (30 in the paper).
    seed: seed.
    iid: generate Synthetic-IID instead (alpha, beta ignored).
    dim: feature dimension (60).
    num_classes: number of classes (10).
    train_fraction: share of each device's examples used for training.
    size_log_mean: mean of the log device size.
    size_log_sigma: standard deviation of the log device size.
    min_size: added to every device size.

  Returns:
    A ``SyntheticFederation``.

  Raises:
    ValueError: an argument out of range, or ``train_fraction`` of
      ``min_size`` examples rounding to no training or no test example
      (every device has at least one of each).
  """
  for value, name in ((alpha, "alpha"), (beta, "beta")):
    check_range(name, value, 0, np.inf, high_open=True)
  check_range("train_fraction", train_fraction, 0, 1, low_open=True,
              high_open=True)
  if num_clients < 1 or dim < 1 or num_classes < 2 or min_size < 2:
    raise ValueError("need num_clients >= 1, dim >= 1, num_classes >= 2 and "
                     "min_size >= 2")
  _check_split(train_fraction, min_size)
  # One generator drawn in a fixed order: reordering any draw changes every
  # federation generated from a seed.
  rng = np.random.default_rng(seed)
  sizes = (rng.lognormal(size_log_mean, size_log_sigma, num_clients)
           .astype(np.int64) + min_size)
  cov_diag = np.arange(1, dim + 1, dtype=np.float64) ** -1.2
  if iid:
    shared_w = rng.normal(0.0, 1.0, (dim, num_classes))
    shared_b = rng.normal(0.0, 1.0, num_classes)
    shared_v = rng.normal(0.0, 1.0, dim)
  xs, ys, weights, biases, means = [], [], [], [], []
  for k in range(num_clients):
    if iid:
      w, b, v = shared_w, shared_b, shared_v
    else:
      u_k = rng.normal(0.0, alpha)
      b_shift = rng.normal(0.0, beta)
      w = rng.normal(u_k, 1.0, (dim, num_classes))
      b = rng.normal(u_k, 1.0, num_classes)
      v = rng.normal(b_shift, 1.0, dim)
    # Diagonal Sigma: independent features, each scaled by sqrt(Sigma_jj).
    x = v + rng.normal(0.0, 1.0, (sizes[k], dim)) * np.sqrt(cov_diag)
    # argmax of softmax(z) is argmax of z.
    ys.append(np.argmax(x @ w + b, axis=1))
    xs.append(x)
    weights.append(w)
    biases.append(b)
    means.append(v)
  train_parts, test_parts = [], []
  # The train/test permutations are drawn after every device is generated,
  # so the features and labels do not depend on train_fraction.
  for k in range(num_clients):
    order = rng.permutation(sizes[k])
    cut = _cut(train_fraction, sizes[k])
    train_parts.append(order[:cut])
    test_parts.append(order[cut:])

  def pool(parts):
    offsets, start = [], 0
    for part in parts:
      offsets.append(np.arange(start, start + part.size, dtype=np.int64))
      start += part.size
    x = np.concatenate([xs[k][p] for k, p in enumerate(parts)])
    y = np.concatenate([ys[k][p] for k, p in enumerate(parts)])
    return x.astype(np.float32), y.astype(np.int32), offsets

  train_x, train_y, train_indices = pool(train_parts)
  test_x, test_y, test_indices = pool(test_parts)
  name = "synthetic_iid" if iid else f"synthetic_{alpha:g}_{beta:g}"
  dataset = Dataset(
      name=name, train_x=train_x, train_y=train_y, test_x=test_x,
      test_y=test_y, num_classes=num_classes, input_shape=(dim,),
      source="procedural", channel_mean=np.zeros(1, np.float32),
      channel_std=np.ones(1, np.float32))
  return SyntheticFederation(
      dataset, train_indices, test_indices,
      np.stack(weights).astype(np.float32),
      np.stack(biases).astype(np.float32), np.stack(means).astype(np.float32))
