"""The one round loop: callbacks that stop a run (early stopping), for one
member and for S vmapped members, with checkpoints; the non-finite
policy, the label checks, callbacks closed at the end."""

import dataclasses
import math

import jax
import numpy as np
import pandas as pd
import pytest

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import history as history_lib
from fedjax_agg import loop
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg import types
from fedjax_agg.config import Checkpointing, Execution
from fedjax_agg.config import NonFinite
from tests._util import _poisoned_data
from tests._util import TRAINING
from tests.clients._util import _run_data, linear_model
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

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


def _sweep(member_callbacks=None, callbacks=()):
  data, test = _run_data()
  return sweep.run_sweep(
      lambda h: aggregators.fedadp(h["alpha"], num_clients=6),
      {"alpha": [1.0, 4.0]}, seeds=[0], model=linear_model(), data=data,
      test_data=test, num_rounds=4, participation=0.5, execution=QUIET,
      callbacks=callbacks, member_callbacks=member_callbacks)


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
  with pytest.raises(loop.NonFiniteError, match=r"round 1.*\[1\]"):
    simulation.run(model, data, test, aggregators.fedavg(),
                   nonfinite=NonFinite(clients="raise"), **kwargs)
  # Propagated, the NaN reaches the global model: the run stops, naming
  # the round, instead of reporting numbers of a NaN model.
  with pytest.raises(loop.NonFiniteError, match="round 1"):
    simulation.run(model, data, test, aggregators.fedavg(),
                   nonfinite=NonFinite(clients="propagate"), **kwargs)
  recorded = simulation.run(
      model, data, test, aggregators.fedavg(),
      nonfinite=NonFinite(clients="propagate", model="record"), **kwargs)
  assert np.isnan(recorded.history.rows[-1]["test_loss"])


def test_cohort_losses_leave_out_the_excluded_nonfinite_client():
  # One client's data is poisoned: it is excluded from the round, and the
  # cohort's mean losses are those of the others, not NaN.
  data, test = _poisoned_data(client=1)
  result = simulation.run(
      tiny_model(), data, test, aggregators.fedavg(), num_rounds=2,
      participation=1.0, training=dataclasses.replace(
          TRAINING, compute_losses=True), execution=QUIET, seed=0)
  for row, clients in zip(result.history.rows[1:],
                          result.history.client_rows, strict=True):
    assert row["nonfinite_clients"] == 1
    for key in ("loss_before", "loss_after"):
      losses = np.asarray(clients[key])
      assert np.isfinite(losses).sum() == len(losses) - 1
      np.testing.assert_allclose(row[f"cohort_{key}"],
                                 np.mean(losses[np.isfinite(losses)]),
                                 rtol=1e-6)


def test_labels_outside_the_model_outputs_are_refused():
  data, x, y, _ = tiny_data()
  with pytest.raises(ValueError, match=r"test_data.*labels outside \[0, 3\)"):
    simulation.run(tiny_model(), data, (x, np.full_like(y, 7)),
                   aggregators.fedavg(), num_rounds=1, execution=QUIET)


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


def test_callbacks_have_one_interface_in_a_run_and_a_sweep():
  # A plain function and a types.Callback subclass take the same rows in
  # a run and in a sweep (each member's rows, in order); after_round and
  # close run once per round and once per run; an object with such
  # methods that is not a Callback is refused rather than half-called.
  class Counter(types.Callback):
    def __init__(self):
      self.rows, self.rounds, self.closed = [], [], 0

    def __call__(self, row, client_row):
      self.rows.append((row["round"], client_row is None))

    def after_round(self, round_num, state, stopping):
      self.rounds.append(round_num)

    def close(self):
      self.closed += 1

  seen = []
  counter = Counter()
  _run(2, [counter, lambda row, client: seen.append(row["round"])])
  assert counter.rows == [(0, True), (1, False), (2, False)]
  assert counter.rounds == [1, 2] and counter.closed == 1
  assert seen == [0, 1, 2]
  counter, seen = Counter(), []
  _sweep(callbacks=[counter, lambda row, client: seen.append(row["round"])])
  assert [r for r, _ in counter.rows] == seen == [0, 0, 1, 1, 2, 2, 3, 3,
                                                  4, 4]
  assert counter.rounds == [1, 2, 3, 4] and counter.closed == 1

  class HalfCallback:
    def __call__(self, row, client_row):
      pass

    def close(self):
      pass

  with pytest.raises(TypeError, match=r"callbacks\[0\]: HalfCallback has "
                     "close but is not a types.Callback"):
    _run(1, [HalfCallback()])
  with pytest.raises(TypeError, match="got int"):
    _run(1, [3])
