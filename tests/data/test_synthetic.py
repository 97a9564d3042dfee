"""FedProx's Synthetic(alpha, beta): shapes, splits, labels, the feature
covariance and the heterogeneity alpha and beta control.
"""

import numpy as np
import pytest

from fedjax_agg import data


def test_synthetic_shapes_split_and_labels():
  fed = data.synthetic(1.0, 1.0, num_clients=30, seed=3)
  ds = fed.dataset
  assert ds.train_x.shape[1:] == (60,) and ds.input_shape == (60,)
  assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int32
  assert len(fed.train_indices) == len(fed.test_indices) == 30
  for parts, n in ((fed.train_indices, len(ds.train_y)),
                   (fed.test_indices, len(ds.test_y))):
    flat = np.concatenate(parts)
    np.testing.assert_array_equal(np.sort(flat), np.arange(n))
  sizes = np.array([len(a) + len(b) for a, b in zip(
      fed.train_indices, fed.test_indices, strict=True)])
  assert sizes.min() >= 50 and sizes.max() > 5 * sizes.min()  # Heavy tail.
  train_share = np.array([len(a) for a in fed.train_indices]) / sizes
  np.testing.assert_allclose(train_share, 0.8, atol=0.02)
  # y = argmax(W_k x + b_k) on every device (float32 rounding aside).
  for k, rows in enumerate(fed.train_indices):
    logits = (ds.train_x[rows].astype(np.float64) @ fed.weights[k]
              + fed.biases[k])
    chosen = logits[np.arange(len(rows)), ds.train_y[rows]]
    np.testing.assert_allclose(chosen, logits.max(axis=1), atol=1e-4)
  again = data.synthetic(1.0, 1.0, num_clients=30, seed=3)
  np.testing.assert_array_equal(again.dataset.train_x, ds.train_x)


def test_synthetic_feature_covariance():
  fed = data.synthetic(0.5, 0.5, num_clients=1, seed=0, min_size=40000,
                       size_log_sigma=1e-9)
  x = np.concatenate([fed.dataset.train_x, fed.dataset.test_x])
  np.testing.assert_allclose(x.mean(0), fed.means[0], atol=0.02)
  np.testing.assert_allclose(x.var(0), np.arange(1, 61) ** -1.2, rtol=0.05)


def test_synthetic_alpha_beta_control_heterogeneity():
  def spreads(alpha, beta):
    fed = data.synthetic(alpha, beta, num_clients=300, seed=1,
                         size_log_mean=0.0, size_log_sigma=1e-9, min_size=5)
    # Per-device averages of W_k and v_k scatter with sd ~alpha, ~beta.
    return (fed.weights.mean(axis=(1, 2)).std(), fed.means.mean(axis=1).std())
  w_low, v_low = spreads(0.0, 0.0)
  w_high, v_high = spreads(2.0, 2.0)
  assert w_low < 0.1 and v_low < 0.3
  np.testing.assert_allclose([w_high, v_high], [2.0, 2.0], rtol=0.15)
  iid = data.synthetic(num_clients=4, iid=True, seed=0)
  assert np.ptp(iid.weights, axis=0).max() == 0.0
  assert np.ptp(iid.means, axis=0).max() == 0.0
  with pytest.raises(ValueError, match="alpha"):
    data.synthetic(alpha=-1.0)


@pytest.mark.parametrize("train_fraction,min_size,counts,needed", [
    (0.05, 2, "0 training and 2 test", 11),
    (0.2, 2, "0 training and 2 test", 3),
    (0.8, 2, "2 training and 0 test", 3),
    (0.95, 10, "10 training and 0 test", 11),
])
def test_a_split_leaving_a_device_without_train_or_test_rows_is_refused(
    train_fraction, min_size, counts, needed):
  with pytest.raises(ValueError, match=f"train_fraction {train_fraction} of "
                     f"min_size {min_size} examples gives a device {counts} "
                     f"examples.*raise min_size to {needed} or more"):
    data.synthetic(num_clients=3, train_fraction=train_fraction,
                   min_size=min_size)
  # The size the message names works: every device gets both.
  fed = data.synthetic(num_clients=40, train_fraction=train_fraction,
                       min_size=needed, size_log_mean=0.0, seed=2)
  assert min(len(rows) for rows in fed.train_indices) >= 1
  assert min(len(rows) for rows in fed.test_indices) >= 1
  assert min(len(a) + len(b) for a, b in zip(
      fed.train_indices, fed.test_indices, strict=True)) == needed


@pytest.mark.parametrize("train_fraction", [5e-324, 1e-12, 1 - 2 ** -53])
def test_a_share_too_small_for_any_practical_size_is_refused(
    train_fraction):
  # No size is searched for without bound: the message still names both.
  with pytest.raises(ValueError, match="train_fraction .* of min_size 50 "
                     "examples gives a device"):
    data.synthetic(num_clients=3, train_fraction=train_fraction)


def test_the_smallest_devices_of_an_accepted_split_have_both_sides():
  # 0.8 of 3 rounds to 2 training, 1 test: the edge that is accepted.
  fed = data.synthetic(num_clients=200, train_fraction=0.8, min_size=3,
                       size_log_mean=0.0, size_log_sigma=1.0, seed=0)
  sizes = [len(a) + len(b) for a, b in zip(fed.train_indices,
                                            fed.test_indices, strict=True)]
  assert min(sizes) == 3
  assert min(len(rows) for rows in fed.train_indices) >= 1
  assert min(len(rows) for rows in fed.test_indices) >= 1
