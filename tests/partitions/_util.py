"""Shared inputs of the partition tests: label vectors and the checks every
partition must pass.
"""

import numpy as np


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


LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 60))
