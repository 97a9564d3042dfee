"""The one round loop: layering, plug-in local updates, non-finite policy."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

from fedjax_agg import aggregators
from fedjax_agg import distributed
from fedjax_agg import engine
from fedjax_agg import federated
from fedjax_agg import history as history_lib
from fedjax_agg import rounds
from fedjax_agg import simulation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.config import NonFinite
from fedjax_agg.types import LocalUpdate
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

TRAINING = LocalTraining(batch_size=3, learning_rate=0.2)
QUIET = Execution(clients_per_step=2, progress=False)


def test_rules_import_nothing_from_the_round_or_the_drivers():
  code = ("import sys, fedjax_agg.aggregators, fedjax_agg.objectives, "
          "fedjax_agg.clients\n"
          "up = {'fedjax_agg.simulation', 'fedjax_agg.sweep', "
          "'fedjax_agg.rounds', 'fedjax_agg.drivers', "
          "'fedjax_agg.experiment'} & set(sys.modules)\n"
          "assert not up, up\n"
          "import fedjax_agg.aggregators as a\n"
          "assert a.fedopt.__module__.endswith('_fedopt')\n"
          "assert callable(a.scale_by_reddi) and a.FedAdpState\n")
  subprocess.run([sys.executable, "-c", code], check=True)


def _poisoned_data(client: int):
  """tiny_data with one NaN pixel in ``client``'s first example; the
  clean arrays as test data."""
  _, x, y, parts = tiny_data()
  poisoned = np.array(x)
  poisoned[parts[client][0], 0] = np.nan
  return federated.from_partition(poisoned, y, parts), (x, y)


@pytest.mark.parametrize("name", ["fedavg", "fedadp", "fednnnn", "fedadam"])
def test_nan_client_is_excluded_like_a_masked_client(name):
  data, _ = _poisoned_data(client=1)
  model = tiny_model()
  params = model.init(jax.random.key(0))
  rule = aggregators.get(name, num_clients=data.num_clients)
  round_fn = rounds.make_round_fn(model, rule, TRAINING, execution=QUIET)
  state = rounds.init_state(params, rule, seed=2)
  cohort = jnp.array([0, 1, 2, 3])
  got, out = round_fn(state, data, cohort, jnp.ones(4))
  assert list(np.asarray(out.finite)) == [True, False, True, True]
  # The same round with client 1 masked out (it then trains no step).
  want, _ = round_fn(state, data, cohort, jnp.array([1.0, 0.0, 1.0, 1.0]))
  for a, b in zip(jax.tree.leaves((got.params, got.aggregator_state)),
                  jax.tree.leaves((want.params, want.aggregator_state)),
                  strict=True):
    if jnp.issubdtype(a.dtype, jnp.inexact):
      assert np.all(np.isfinite(a))
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_run_counts_raises_or_propagates_nonfinite_clients():
  data, test = _poisoned_data(client=1)
  model = tiny_model()
  kwargs = dict(num_rounds=2, participation=1.0, training=TRAINING,
                execution=QUIET, seed=0)
  result = simulation.run(model, data, test, aggregators.fedavg(), **kwargs)
  assert [row["nonfinite_clients"] for row in result.history.rows[1:]] == [
      1, 1]
  assert all(np.isfinite(leaf).all()
             for leaf in jax.tree.leaves(result.state.params))
  with pytest.raises(simulation.NonFiniteError, match=r"round 1.*\[1\]"):
    simulation.run(model, data, test, aggregators.fedavg(),
                   nonfinite=NonFinite(clients="raise"), **kwargs)
  # Propagated, the NaN reaches the global model: the run stops, naming
  # the round, instead of reporting numbers of a NaN model.
  with pytest.raises(simulation.NonFiniteError, match="round 1"):
    simulation.run(model, data, test, aggregators.fedavg(),
                   nonfinite=NonFinite(clients="propagate"), **kwargs)
  recorded = simulation.run(
      model, data, test, aggregators.fedavg(),
      nonfinite=NonFinite(clients="propagate", model="record"), **kwargs)
  assert np.isnan(recorded.history.rows[-1]["test_loss"])


def test_a_local_update_plugs_into_the_round():
  """A stateful local update: counts each client's participations."""
  data, x, y, _ = tiny_data()
  model = tiny_model()
  trainer = engine.make_local_trainer(model, TRAINING, clients_per_step=2)

  def update(counts, global_params, data, ids, mask, lrs, steps, round_num,
             key):
    del round_num
    local = trainer(global_params, data, ids, lrs, steps, key)
    counts = counts.at[ids].add(mask.astype(jnp.int32))
    return local, counts, {"participations": counts[ids]}

  counting = LocalUpdate(lambda n: jnp.zeros((n,), jnp.int32), update)
  kwargs = dict(num_rounds=3, participation=0.6, training=TRAINING,
                execution=QUIET, seed=5)
  plugged = simulation.run(model, data, (x, y), aggregators.fedavg(),
                           local_update=counting, **kwargs)
  plain = simulation.run(model, data, (x, y), aggregators.fedavg(), **kwargs)
  ids = np.concatenate([r["client_ids"] for r in plain.history.client_rows])
  np.testing.assert_array_equal(plugged.state.client_state,
                                np.bincount(ids, minlength=5))
  # Two different XLA programs (the trainer jitted inside the update vs
  # fused into the round) may round differently: float32 tolerance. At
  # rtol 1e-6 this failed on its own (1.5e-6 on one parameter) while it
  # passed inside the whole suite.
  for a, b in zip(jax.tree.leaves(plugged.state.params),
                  jax.tree.leaves(plain.state.params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert "participations" in plugged.history.client_rows[0]


def test_labels_outside_the_model_outputs_are_refused():
  data, x, y, _ = tiny_data()
  with pytest.raises(ValueError, match=r"test_data.*labels outside \[0, 3\)"):
    simulation.run(tiny_model(), data, (x, np.full_like(y, 7)),
                   aggregators.fedavg(), num_rounds=1, execution=QUIET)


def test_bad_configuration_values_are_named():
  for kwargs, name in (({"epochs": 0}, "epochs"),
                       ({"learning_rate": float("nan")}, "learning_rate"),
                       ({"batch_size": "16"}, "batch_size"),
                       ({"compute_losses": "yes"}, "compute_losses")):
    with pytest.raises((TypeError, ValueError), match=name):
      LocalTraining(**kwargs)
  with pytest.raises(ValueError, match="chunk_loop"):
    Execution(chunk_loop="loop")
  with pytest.raises(ValueError, match="clients"):
    NonFinite(clients="drop")
  with pytest.raises(ValueError, match="seed"):
    simulation.seed_keys(-1)


def test_callbacks_write_the_history_as_the_run_goes(tmp_path):
  data, x, y, _ = tiny_data()

  class Dies:
    def __call__(self, row, client):
      if row["round"] == 2:
        raise KeyboardInterrupt  # the run dies after round 2's row

  writer = history_lib.HistoryWriter(str(tmp_path / "run"), {"seed": 0})
  board = history_lib.TensorBoardWriter(str(tmp_path / "tb"))
  with pytest.raises(KeyboardInterrupt):
    simulation.run(tiny_model(), data, (x, y), aggregators.fedavg(),
                   num_rounds=4, training=TRAINING, execution=QUIET,
                   callbacks=[writer, board, Dies()])
  board.close()
  frame = pd.read_csv(tmp_path / "run" / "history.csv")
  assert list(frame["round"]) == [0, 1, 2]
  with open(tmp_path / "run" / "history.json") as f:
    saved = json.load(f)  # strict JSON
  assert [row["round"] for row in saved["rows"]] == [0, 1, 2]
  assert len(saved["clients"]) == 2
  events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
  assert events and b"test_accuracy" in events[0].read_bytes()


def test_the_loop_closes_callbacks_so_a_sparse_writer_keeps_every_row(
    tmp_path):
  data, x, y, _ = tiny_data()
  writer = history_lib.HistoryWriter(str(tmp_path / "run"), every=3)
  simulation.run(tiny_model(), data, (x, y), aggregators.fedavg(),
                 num_rounds=4, training=TRAINING, execution=QUIET,
                 callbacks=[writer])
  # Rewrites at rounds 0 and 3; round 4 is written when the loop closes.
  frame = pd.read_csv(tmp_path / "run" / "history.csv")
  assert list(frame["round"]) == [0, 1, 2, 3, 4]


def test_use_all_cores_gives_one_device_per_core_in_a_fresh_process(
    monkeypatch):
  code = ("from fedjax_agg import distributed\n"
          "n = distributed.use_all_cores()\n"
          "import jax\n"
          "assert n == distributed.available_cores() == len(jax.devices()),"
          " (n, jax.devices())\n")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  subprocess.run([sys.executable, "-c", code], check=True, env={
      **env, "JAX_PLATFORMS": "cpu"})
  # Too late in this process: a warning, and the devices JAX runs with.
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  started = len(jax.devices("cpu"))
  if started != distributed.available_cores():
    with pytest.warns(UserWarning, match="already started"):
      assert distributed.use_all_cores() == started
  else:
    assert distributed.use_all_cores() == started
