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
