"""Held-out splits of each client's data, and the clients' accuracies on
them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import federated
from fedjax_agg import validation
from tests.clients._util import learnable_data
from tests.clients._util import np_accuracy
from tests.clients._util import rows_of
from tests.test_engine import tiny_model


def test_holdout_split_and_client_accuracies():
  data, x, y = learnable_data()
  train, val = validation.holdout_split(data, 0.3, seed=4)
  again, _ = validation.holdout_split(data, 0.3, seed=4)
  np.testing.assert_array_equal(train.client_indices, again.client_indices)
  for own, tr, va in zip(rows_of(data), rows_of(train), rows_of(val),
                         strict=True):
    assert len(va) == int(np.floor(0.3 * len(own) + 0.5))
    assert not set(tr) & set(va)
    np.testing.assert_array_equal(np.sort(np.concatenate([tr, va])),
                                  np.sort(own))
  # A client's split depends on its index and examples, not on the others.
  parts = rows_of(data)
  changed = federated.from_partition(x, y, [parts[0][:5]] + parts[1:])
  _, val_changed = validation.holdout_split(changed, 0.3, seed=4)
  for i in range(1, 5):
    np.testing.assert_array_equal(rows_of(val_changed)[i], rows_of(val)[i])
  model = tiny_model()
  stacked = jax.vmap(model.init)(jax.random.split(jax.random.key(1), 5))
  ids = jnp.array([3, 0, 4, 2, 2])
  got = validation.client_accuracies(model, stacked, val, ids, batch_size=2,
                                     rows_per_step=2)
  for r, cid in enumerate(np.asarray(ids)):
    params = jax.tree.map(lambda a, r=r: a[r], stacked)
    np.testing.assert_allclose(
        got[r], np_accuracy(model, params, x, y, rows_of(val)[cid]),
        rtol=1e-6)
  with pytest.raises(ValueError, match="fraction"):
    validation.holdout_split(data, 1.0)
