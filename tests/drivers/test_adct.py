"""FL rounds with ADCT clients (``drivers.run_adct``): the recorded choices
and their reproducibility, accuracies measured on a server validation set.
"""

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import drivers
from fedjax_agg import validation
from fedjax_agg.clients._adct import adct
from fedjax_agg.config import Execution
from tests.clients._util import _tuner
from tests.clients._util import BATCH
from tests.clients._util import GRID
from tests.clients._util import learnable_data
from tests.test_engine import tiny_model


def test_server_validation_measures_every_client_on_the_same_set():
  data, x, y = learnable_data()
  model = tiny_model()
  picked = validation.balanced_indices(y, per_class=4, seed=0)
  assert len(picked) == 4 * len(np.unique(y))
  np.testing.assert_array_equal(np.bincount(np.asarray(y)[picked]), 4)
  server = (np.asarray(x)[picked], np.asarray(y)[picked])
  result = drivers.run_adct(
      model, data, (x, y), aggregators.fedavg(),
      adct(model, grid=GRID, batch_size=BATCH, clients_per_step=8),
      num_rounds=2, participation=0.6,
      measure=drivers.ADCTMeasure("server", server_validation=server),
      execution=Execution(progress=False))
  for row in result.history.client_rows:
    acc = np.asarray(row["adct_accuracy"]) * len(picked)
    np.testing.assert_allclose(acc, np.round(acc), atol=1e-4)
  with pytest.raises(ValueError, match="server_validation"):
    drivers.run_adct(model, data, (x, y), aggregators.fedavg(), _tuner(),
                     num_rounds=1, measure=drivers.ADCTMeasure("server"))
  with pytest.raises(ValueError, match="server_validation"):
    drivers.ADCTMeasure("train", server_validation=server)
  with pytest.raises(ValueError, match="per_class"):
    validation.balanced_indices(y, per_class=10_000)


def test_run_records_choices_and_is_reproducible():
  data, x, y = learnable_data()
  model = tiny_model()
  tuner = _tuner()

  def go(seed):
    return drivers.run_adct(model, data, (x, y), aggregators.fedavg(), tuner,
        num_rounds=2, participation=0.6, seed=seed,
        execution=Execution(progress=False))

  first, second = go(0), go(0)
  assert len(first.history.client_rows) == 2
  for a, b in zip(first.history.client_rows, second.history.client_rows,
                  strict=True):
    for name in ("client_ids", "adct_learning_rate", "adct_local_epochs",
                 "adct_searched", "adct_accuracy"):
      np.testing.assert_array_equal(a[name], b[name])
  row = first.history.client_rows[0]
  assert row["adct_searched"].all()  # nobody has a configuration yet
  # Round 1's target (the mean accuracy before any round) is 0: grid[0].
  np.testing.assert_array_equal(row["adct_learning_rate"],
                                np.float32(GRID[0][0]))
  np.testing.assert_array_equal(row["adct_local_epochs"], GRID[0][1])
  for leaf_a, leaf_b in zip(jax.tree.leaves(first.state.params),
                            jax.tree.leaves(second.state.params), strict=True):
    np.testing.assert_array_equal(leaf_a, leaf_b)
  assert np.isfinite(first.history.column("test_accuracy")).all()
