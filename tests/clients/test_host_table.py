"""The per-client table in host memory or a file: the rounds of the device
table, and what it refuses.
"""

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg.config import Checkpointing
from tests.clients._util import _run_data
from tests.clients._util import close
from tests.clients._util import linear_model
from tests.clients._util import QUIET
from tests.clients._util import RUN_TRAINING


@pytest.mark.parametrize("file_backed", [False, True])
def test_host_table_rounds_equal_device_table_rounds(tmp_path, file_backed):
  data, test = _run_data()
  model = linear_model()
  rule = clients.scaffold_aggregator(1.0)
  path = str(tmp_path / "table.bin") if file_backed else None
  runs = []
  for placement in ("device", "host"):
    update = clients.scaffold(model, RUN_TRAINING, placement=placement,
                              path=path if placement == "host" else None)
    runs.append(simulation.run(
        model, data, test, rule, num_rounds=3, participation=0.5,
        training=RUN_TRAINING, execution=QUIET, local_update=update,
        seed=1))
  device, host = (run.state for run in runs)
  close(host.params, device.params, atol=0)
  store = host.client_state.controls.store
  np.testing.assert_array_equal(store.seen,
                                device.client_state.controls.seen)
  for a, b in zip(store.arrays,
                  jax.tree.leaves(device.client_state.controls.rows),
                  strict=True):
    np.testing.assert_array_equal(a, b)
  assert int(host.client_state.controls.version) == 3


def test_host_table_refuses_checkpoints_sweeps_and_bad_placement(tmp_path):
  data, test = _run_data()
  model = linear_model()
  update = clients.ditto(model, RUN_TRAINING, placement="host")
  with pytest.raises(ValueError, match="host memory"):
    simulation.run(model, data, test, aggregators.fedavg(), num_rounds=1,
                   execution=QUIET, local_update=update,
                   checkpointing=Checkpointing(str(tmp_path / "c"), 1))
  with pytest.raises(ValueError, match="host memory"):
    sweep.run_sweep(lambda h: aggregators.fedavg(), seeds=[0, 1],
                    model=model, data=data, test_data=test, num_rounds=1,
                    execution=QUIET, local_update=update)
  with pytest.raises(ValueError, match="placement"):
    clients.ditto(model, placement="disk")
  with pytest.raises(ValueError, match="path"):
    clients.scaffold(model, placement="device", path="x.bin")
