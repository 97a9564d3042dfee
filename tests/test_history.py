"""History files and TensorBoard events written as the run goes."""

import json

import pandas as pd
import pytest

from fedjax_agg import aggregators
from fedjax_agg import history as history_lib
from fedjax_agg import simulation
from tests._util import QUIET
from tests._util import TRAINING
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model


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


def test_load_refuses_a_file_nested_past_the_parser(tmp_path):
  (tmp_path / "history.json").write_text("[" * 100_000 + "]" * 100_000)
  with pytest.raises(ValueError, match="history.json: not a saved history"):
    history_lib.History.load(str(tmp_path))
