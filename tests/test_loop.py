"""The one round loop: callbacks that stop a run (early stopping), for one
member and for S vmapped members, with checkpoints."""

import math

import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import loop
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg.config import Checkpointing, Execution
from tests.clients.test_clients import _run_data, linear_model

QUIET = Execution(clients_per_step=2, progress=False)


def _feed(stopper, values):
  """The round at which ``stopper`` first asks to stop (None: never)."""
  for r, value in enumerate(values):
    stopper({"round": r, "test_accuracy": value}, None)
    if stopper.stop_requested:
      return r
  return None


def test_early_stopping_counts_rows_without_improvement():
  assert _feed(loop.EarlyStopping(patience=2),
               [0.1, 0.3, 0.3, 0.29, 0.5]) == 3
  assert _feed(loop.EarlyStopping(patience=2, min_delta=0.05),
               [0.1, 0.3, 0.33, 0.34, 0.5]) == 3
  assert _feed(loop.EarlyStopping(patience=3), [0.1, 0.2, 0.3, 0.4]) is None
  # Lower is better for a loss; NaN never improves.
  assert _feed(loop.EarlyStopping("test_accuracy", mode="min", patience=1),
               [1.0, 0.5, math.nan]) == 2
  # Rows without the metric (rounds not evaluated) are passed over.
  stopper = loop.EarlyStopping(patience=1)
  stopper({"round": 1}, None)
  assert stopper.since_best == 0 and not stopper.stop_requested


@pytest.mark.parametrize("kwargs,error", [
    ({"patience": 0}, ValueError), ({"patience": 1.5}, TypeError),
    ({"mode": "up"}, ValueError), ({"min_delta": -1.0}, ValueError),
    ({"min_delta": math.nan}, ValueError), ({"metric": ""}, TypeError),
])
def test_early_stopping_arguments_are_checked(kwargs, error):
  with pytest.raises(error):
    loop.EarlyStopping(**kwargs)


def _run(num_rounds, callbacks=(), **kwargs):
  data, test = _run_data()
  return simulation.run(linear_model(), data, test, aggregators.fedavg(),
                        num_rounds=num_rounds, participation=0.5,
                        execution=QUIET, seed=1, callbacks=callbacks,
                        **kwargs)


def test_a_run_stops_where_its_callback_asks_and_says_so():
  # min_delta 1: no accuracy can improve by more, so round 1 stops it.
  stopped = _run(5, [loop.EarlyStopping(patience=1, min_delta=1.0)])
  assert [row["round"] for row in stopped.history.rows] == [0, 1]
  assert stopped.history.config["stopped_by"] == "EarlyStopping"
  assert stopped.history.config["stopped_at_round"] == 1
  assert int(stopped.state.round) == 1
  full = _run(5)
  assert "stopped_by" not in full.history.config
  # The stopped run is the prefix of the full one.
  np.testing.assert_allclose(stopped.history.column("test_loss"),
                             full.history.column("test_loss")[:2],
                             rtol=1e-6)


def test_the_stopping_round_is_checkpointed(tmp_path):
  folder = str(tmp_path / "ckpt")
  _run(6, [loop.EarlyStopping(patience=2, min_delta=1.0)],
       checkpointing=Checkpointing(folder, every=5))
  checkpointer = checkpoint.RunCheckpointer(folder, 0, {})
  try:
    assert checkpointer.all_rounds() == [2]
  finally:
    checkpointer.close()


def _sweep(callbacks):
  data, test = _run_data()
  return sweep.run_sweep(
      lambda h: aggregators.fedadp(h["alpha"], num_clients=6),
      {"alpha": [1.0, 4.0]}, seeds=[0], model=linear_model(), data=data,
      test_data=test, num_rounds=4, participation=0.5, execution=QUIET,
      callbacks=callbacks)


def test_a_sweep_stops_when_every_member_asks():
  one = _sweep(lambda m: [loop.EarlyStopping(patience=1, min_delta=1.0)]
               if m == 0 else [])
  assert all(len(member.history.rows) == 5 for member in one)
  both = _sweep(lambda m: [loop.EarlyStopping(patience=1, min_delta=1.0)])
  assert all(len(member.history.rows) == 2 for member in both)
  assert both[1].history.config["stopped_at_round"] == 1


def test_early_stopping_on_a_column_the_history_lacks_is_refused():
  with pytest.raises(ValueError, match="'test_acc' is not a column"):
    _run(3, [loop.EarlyStopping("test_acc")])
