"""Ctrl-C (SIGINT) and a scheduler's SIGTERM stop a run at the end of its
round: the callbacks keep what they write (history files, a checkpoint),
the run says where it stopped, and a resume goes on to the history of the
uninterrupted run."""

import os
import signal
import time

import numpy as np
import pytest

from fedjax_agg import checkpoint
from fedjax_agg import history as history_lib
from fedjax_agg import loop
from fedjax_agg.config import Checkpointing
from tests.test_loop import _run


class _SignalAt:
  """Sends ``number`` to this process when round ``at`` is recorded."""

  def __init__(self, number, at, times=1):
    self.number, self.at, self.times = number, at, times

  def __call__(self, row, client):
    del client
    if row["round"] == self.at:
      for _ in range(self.times):
        noting = signal.getsignal(self.number)
        os.kill(os.getpid(), self.number)
        # Two signals sent before Python runs the first one's handler
        # would arrive as one: wait until it ran (it restores the
        # handler before it).
        deadline = time.monotonic() + 10
        while (signal.getsignal(self.number) is noting
               and time.monotonic() < deadline):
          time.sleep(0.001)


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_after_its_round_and_it_resumes(tmp_path,
                                                               number):
  folder = str(tmp_path / "ckpt")
  writer = history_lib.HistoryWriter(str(tmp_path / "hist"))
  before = signal.getsignal(number)
  with pytest.raises(loop.Interrupted) as raised:
    _run(6, [_SignalAt(number, 2), writer],
         checkpointing=Checkpointing(folder, every=5))
  error = raised.value
  assert (error.signal, error.round, error.num_rounds) == (
      signal.Signals(number).name, 2, 6)
  assert error.checkpointed and "--resume" in str(error)
  assert signal.getsignal(number) is before  # handlers restored
  # The history files hold rounds 0..2; the checkpoint is of round 2.
  kept = history_lib.History.load(str(tmp_path / "hist"))
  assert [row["round"] for row in kept.rows] == [0, 1, 2]
  checkpointer = checkpoint.RunCheckpointer(folder, 0, {})
  try:
    assert checkpointer.all_rounds() == [2]
  finally:
    checkpointer.close()
  # Resumed, it ends where the uninterrupted run ends.
  resumed = _run(6, checkpointing=Checkpointing(folder, every=5,
                                                resume=True))
  full = _run(6)
  np.testing.assert_allclose(resumed.history.column("test_loss"),
                             full.history.column("test_loss"), rtol=1e-6)


def test_without_checkpoints_the_message_says_a_rerun_starts_again():
  with pytest.raises(loop.Interrupted, match="starts again") as raised:
    _run(4, [_SignalAt(signal.SIGINT, 1)])
  assert raised.value.round == 1 and not raised.value.checkpointed


def test_a_run_without_periodic_checkpoints_is_saved_when_interrupted(
    tmp_path):
  """every=0 (the entry points' default): nothing is written by a run
  that ends, and a run that a signal stops saves its last round and
  resumes to the uninterrupted history."""
  folder = tmp_path / "ckpt"
  _run(3, checkpointing=Checkpointing(str(folder), every=0))
  assert not folder.exists()
  with pytest.raises(loop.Interrupted, match="--resume") as raised:
    _run(5, [_SignalAt(signal.SIGTERM, 2)],
         checkpointing=Checkpointing(str(folder), every=0))
  assert raised.value.checkpointed and raised.value.round == 2
  checkpointer = checkpoint.RunCheckpointer(str(folder), 0, {})
  try:
    assert checkpointer.all_rounds() == [2]
  finally:
    checkpointer.close()
  resumed = _run(5, checkpointing=Checkpointing(str(folder), every=0,
                                                resume=True))
  np.testing.assert_allclose(resumed.history.column("test_loss"),
                             _run(5).history.column("test_loss"), rtol=1e-6)


def test_a_signal_at_the_last_round_lets_the_run_finish():
  result = _run(3, [_SignalAt(signal.SIGTERM, 3)])
  assert result.history.rows[-1]["round"] == 3


def test_a_second_signal_stops_at_once():
  # The second signal goes to the handler from before the run: Python's
  # default here (a test runner's worker may have set another).
  before = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with pytest.raises(KeyboardInterrupt):
      _run(4, [_SignalAt(signal.SIGINT, 1, times=2)])
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  finally:
    signal.signal(signal.SIGINT, before)


def test_the_command_line_stops_politely_and_resumes(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  from tests.cli.test_cli import TINY  # pylint: disable=g-import-not-at-top
  out = tmp_path / "run"
  argv = [sys.executable, "-m", "fedjax_agg"] + [
      "40" if flag == "1" and TINY[i - 1] == "--rounds" else flag
      for i, flag in enumerate(TINY)] + [
          "--out", str(out), "--cpu-devices", "1"]  # default checkpoints
  process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
  history = out / "history.json"
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline:
    if history.exists():
      try:
        if len(json.loads(history.read_text())["rows"]) >= 3:
          break
      except ValueError:
        pass
    time.sleep(0.05)
  process.send_signal(signal.SIGINT)
  _, err = process.communicate(timeout=120)
  assert process.returncode == 130, err
  last = err.strip().splitlines()[-1]
  assert last.startswith("fedjax_agg: interrupted (SIGINT) after round "), err
  assert "--resume" in last and "Traceback" not in err, err
  stopped = int(last.split("after round ")[1].split()[0])
  assert 2 <= stopped < 40
  rows = json.loads(history.read_text())["rows"]
  assert rows[-1]["round"] == stopped
  resumed = subprocess.run(argv + ["--resume"], capture_output=True,
                           text=True, timeout=300, check=False)
  assert resumed.returncode == 0, resumed.stderr
  rows = json.loads(history.read_text())["rows"]
  assert [row["round"] for row in rows] == list(range(41))
