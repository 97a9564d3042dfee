"""Checkpoint and resume: a killed run resumes to the uninterrupted history.

The kill test runs ``run_worker`` in a subprocess that checkpoints every
round, SIGKILLs it once checkpoint ``KILL_AFTER`` is on disk, resumes in
this process and compares every history column (but ``time_s``), every
client row and the final state with an uninterrupted run. A run's
per-client state resumes too.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import checkpoint
from fedjax_agg import fingerprint
from fedjax_agg.checkpoint import _run as checkpoint_run
from fedjax_agg import clients
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg import simulation
from fedjax_agg import stragglers
from fedjax_agg.aggregators._feddrl import AgentConfig
from fedjax_agg.config import Checkpointing
from fedjax_agg import rounds as rounds_lib
from fedjax_agg import history as history_lib
from tests.clients._util import _run_data
from tests.clients._util import close
from tests.clients._util import linear_model
from tests.clients._util import QUIET
from tests.clients._util import RUN_TRAINING
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

ROUNDS = 6
KILL_AFTER = 2
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = tiny_model()
AGENT = AgentConfig(policy_hidden=(8, 8, 8), value_hidden=(8, 8),
                    buffer_capacity=8, batch_size=4, updates_per_round=1,
                    min_buffer_size=2)


def run_args(aggregator="feddrl", learning_rate=0.2):
  """Arguments of a tiny run whose state has every kind of leaf: FedDRL's
  agent (networks, Adam, buffer, raw uint32 key), a typed key, stragglers
  (the round's step key)."""
  data, x, y, _ = tiny_data()
  rule = (aggregators.feddrl(3, config=AGENT) if aggregator == "feddrl"
          else aggregators.get(aggregator, num_clients=data.num_clients))
  return dict(
      model=MODEL, data=data, test_data=(x, y), aggregator=rule,
      num_rounds=ROUNDS, participation=0.6,
      training=LocalTraining(batch_size=3, learning_rate=learning_rate,
                             steps_fn=stragglers.stragglers(0.5, 1)),
      execution=Execution(clients_per_step=3, devices=1, progress=False),
      # Client losses every round: a schedule that does not depend on R,
      # so that an extended run equals the longer one column for column.
      evaluation=Evaluation(clients=True), seed=4)


def run_worker(directory: str, pause_s: float) -> None:
  """The run that gets killed: checkpoints every round, pausing after each
  save so that the parent can kill it mid-run."""
  save = checkpoint.RunCheckpointer.save

  def slow_save(self, *args, **kwargs):
    save(self, *args, **kwargs)
    time.sleep(pause_s)

  checkpoint.RunCheckpointer.save = slow_save
  simulation.run(**run_args(),
      checkpointing=Checkpointing(directory=directory, every=1))


def strip_time(rows):
  return [{k: v for k, v in row.items() if k != "time_s"} for row in rows]


def assert_same_history(got, expected):
  assert strip_time(got.rows) == strip_time(expected.rows)
  assert len(got.client_rows) == len(expected.client_rows)
  for a, b in zip(got.client_rows, expected.client_rows, strict=True):
    assert sorted(a) == sorted(b)
    for name in a:
      np.testing.assert_array_equal(a[name], b[name])
      assert np.asarray(a[name]).dtype == np.asarray(b[name]).dtype


def assert_same_tree(got, expected):
  got_leaves, got_def = jax.tree.flatten(got)
  exp_leaves, exp_def = jax.tree.flatten(expected)
  assert got_def == exp_def
  for a, b in zip(got_leaves, exp_leaves, strict=True):
    if checkpoint_run._is_key(a):  # pylint: disable=protected-access
      assert checkpoint_run._is_key(b)  # pylint: disable=protected-access
      a, b = jax.random.key_data(a), jax.random.key_data(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
  """A persistent compilation cache shared by this module's runs and the
  killed subprocess: each run builds its own jitted round, and compiling
  the same round again would dominate this file's runtime."""
  path = str(tmp_path_factory.mktemp("compilation_cache"))
  names = ("jax_compilation_cache_dir",
           "jax_persistent_cache_min_compile_time_secs",
           "jax_persistent_cache_min_entry_size_bytes")
  old = {name: getattr(jax.config, name) for name in names}
  for name, value in zip(names, (path, 0, 0), strict=True):
    jax.config.update(name, value)
  _reset_cache()  # the cache is set up once per process, at first use
  yield path
  for name, value in old.items():
    jax.config.update(name, value)
  _reset_cache()


def _reset_cache():
  try:
    from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top
    compilation_cache.reset_cache()
  except (ImportError, AttributeError):  # only slower without it
    pass


@pytest.fixture(scope="module")
def uninterrupted():
  return simulation.run(**run_args())


def test_killed_run_resumes_to_the_uninterrupted_history(
    tmp_path, uninterrupted, compilation_cache):
  directory = str(tmp_path / "ckpt")
  code = ("import sys; from tests.test_checkpoint import run_worker; "
          "run_worker(sys.argv[1], 0.5)")
  # The worker must run on the devices this process runs on, compiled as
  # this process compiles (the XLA flags: device count, compile options).
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
         "JAX_COMPILATION_CACHE_DIR": compilation_cache,
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
  proc = subprocess.Popen([sys.executable, "-c", code, directory], cwd=REPO,
                          env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
  final = os.path.join(directory, str(KILL_AFTER))
  deadline = time.monotonic() + 120
  while not os.path.isdir(final):
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    assert time.monotonic() < deadline, "no checkpoint written"
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  proc.stderr.close()
  assert proc.returncode == -signal.SIGKILL
  written = sorted(int(n) for n in os.listdir(directory) if n.isdigit())
  assert KILL_AFTER in written and written[-1] < ROUNDS  # killed mid-run

  resumed = simulation.run(**run_args(),
      checkpointing=Checkpointing(directory=directory, every=1, resume=True))
  assert_same_history(resumed.history, uninterrupted.history)
  assert_same_tree(resumed.state, uninterrupted.state)
  # No temporary folders left; only the latest checkpoints kept.
  names = os.listdir(directory)
  assert not [n for n in names if "tmp" in n]
  assert sorted(int(n) for n in names if n.isdigit()) == [ROUNDS - 1, ROUNDS]


def test_feddrl_state_round_trips_exactly(tmp_path, uninterrupted, caplog):
  directory = str(tmp_path / "ckpt")
  # resume=True with no checkpoint yet: starts at round 0 and says so.
  result = simulation.run(**run_args(),
      checkpointing=Checkpointing(directory=directory, every=4, resume=True))
  assert "no checkpoint" in caplog.text and "round 0" in caplog.text
  assert_same_history(result.history, uninterrupted.history)
  assert_same_tree(result.state, uninterrupted.state)
  args = run_args()
  template = rounds_lib.init_state(args["model"].init(jax.random.key(0)),
                                   args["aggregator"])
  checkpointer = checkpoint.RunCheckpointer(directory, 0, {})
  assert checkpointer.all_rounds() == [4, ROUNDS]  # every 4 and the last
  # Read back with the stored config (only the state is compared here).
  checkpointer.config = checkpointer.read_meta(ROUNDS)["config"]
  assert checkpointer.config["aggregator"]["aggregate"]["num_participants"] \
      == 3
  snapshot = checkpointer.restore(template, jax.random.key(0))
  checkpointer.close()
  assert snapshot.round == ROUNDS
  assert_same_tree(snapshot.state, result.state)
  agent_state = snapshot.state.aggregator_state
  assert int(agent_state.buffer.size) == ROUNDS - 1  # one per round but 1st
  assert_same_history(
      history_lib.History(snapshot.rows, snapshot.client_rows, {}),
      result.history)
  # A finished run resumed does no more rounds and returns the same.
  again = simulation.run(**run_args(),
      checkpointing=Checkpointing(directory=directory, every=4, resume=True))
  assert_same_history(again.history, result.history)
  assert_same_tree(again.state, result.state)


@pytest.fixture(scope="module")
def saved_fedavgm_run(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("fedavgm") / "ckpt")
  simulation.run(**run_args("fedavgm"),
      checkpointing=Checkpointing(directory=directory, every=3))
  return directory


@pytest.fixture()
def saved_run(saved_fedavgm_run, tmp_path):
  """A copy of a finished run's checkpoints (rounds 3 and 6) to damage."""
  return shutil.copytree(saved_fedavgm_run, str(tmp_path / "ckpt"))


def _state_files(directory, round_num):
  root = os.path.join(directory, str(round_num), "state")
  return sorted(os.path.join(d, f) for d, _, files in os.walk(root)
                for f in files if os.sep + "d" + os.sep in os.path.join(d, f)
                or os.path.basename(d) == "d")


# orbax leaves an asyncio callback behind when a read fails.
@pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["truncate", "delete", "flip", "meta"])
def test_corrupt_checkpoint_raises(saved_run, damage):
  if damage == "meta":
    path = os.path.join(saved_run, str(ROUNDS), "meta", "metadata")
    with open(path, "w") as f:
      f.write('{"format_version": 1, "rou')
  else:
    files = _state_files(saved_run, ROUNDS)
    assert files
    path = max(files, key=os.path.getsize)
    if damage == "truncate":
      with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    elif damage == "delete":
      for name in files:
        os.remove(name)
    else:
      with open(path, "r+b") as f:
        f.seek(-20, os.SEEK_END)
        byte = f.read(1)
        f.seek(-20, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
  with pytest.raises(checkpoint.CorruptCheckpointError,
                     match=r"round 6 .*Earlier checkpoints: rounds \[3\]"):
    simulation.run(**run_args("fedavgm"),
        checkpointing=Checkpointing(directory=saved_run, every=3, resume=True))


def test_mismatched_checkpoint_names_the_difference(saved_run):
  with pytest.raises(checkpoint.CheckpointMismatchError,
                     match=r"learning_rate: checkpoint 0.2, now 0.1"):
    simulation.run(**run_args("fedavgm", learning_rate=0.1),
        checkpointing=Checkpointing(directory=saved_run, every=3, resume=True))
  with pytest.raises(checkpoint.CheckpointMismatchError,
                     match=r"aggregator\.(.|\n)*server/aggregator_state/"
                     r"opt_state/0/m/params/Dense_0/bias: not in the "):
    simulation.run(**run_args("fedadam"),
        checkpointing=Checkpointing(directory=saved_run, every=3, resume=True))
  # Starting afresh in a folder that holds checkpoints is refused.
  with pytest.raises(checkpoint.CheckpointError, match="resume=True"):
    simulation.run(**run_args("fedavgm"),
        checkpointing=Checkpointing(directory=saved_run, every=3))


def test_mismatched_model_shape_names_the_leaf(tmp_path):
  args = run_args("fedavg")
  template = rounds_lib.init_state(args["model"].init(jax.random.key(0)),
                                   args["aggregator"])
  checkpointer = checkpoint.RunCheckpointer(str(tmp_path), 1, {"a": 1},
                                            async_save=False)
  checkpointer.save(1, template, jax.random.key(1), [{"round": 0},
                                                     {"round": 1}], [])
  wider = template._replace(params=jax.tree.map(
      lambda p: np.zeros(p.shape[:-1] + (p.shape[-1] + 1,), p.dtype),
      template.params))
  with pytest.raises(checkpoint.CheckpointMismatchError,
                     match=r"params/params/Dense_0/bias: shape \[8\] in the "
                     r"checkpoint, \[9\] now"):
    checkpointer.restore(wider, jax.random.key(1))
  checkpointer.config = {"a": 2}
  with pytest.raises(checkpoint.CheckpointMismatchError,
                     match="a: checkpoint 1, now 2"):
    checkpointer.restore(template, jax.random.key(1))
  checkpointer.close()


def test_bad_arguments():
  with pytest.raises(ValueError, match="every"):
    Checkpointing(directory="x", every=-1)
  with pytest.raises(TypeError, match="every"):
    Checkpointing(directory="x", every=1.5)
  with pytest.raises(TypeError, match="directory"):
    Checkpointing(directory="", resume=True)
  with pytest.raises(TypeError, match="resume"):
    Checkpointing(directory="x", resume="yes")


def _other_partition(args):
  """The same clients' sizes, other examples: client 0 and 1 swap one."""
  data = args["data"]
  indices = np.array(data.client_indices)
  indices[0, 0], indices[1, 0] = indices[1, 0], indices[0, 0]
  return dict(args, data=data._replace(client_indices=indices))


def _rescaled(args):
  data = args["data"]
  return dict(args, data=data._replace(x=np.asarray(data.x) * 2.0))


@pytest.mark.parametrize("change,entry", [
    (_other_partition, "data.client_indices"),
    (_rescaled, "data.x"),
    (lambda a: dict(a, test_data=(np.asarray(a["test_data"][0])[:-1],
                                  np.asarray(a["test_data"][1])[:-1])),
     "test_data"),
])
def test_resume_refuses_other_data(saved_run, change, entry):
  with pytest.raises(checkpoint.CheckpointMismatchError,
                     match=re.escape(entry)):
    simulation.run(**change(run_args("fedavgm")), checkpointing=Checkpointing(
        directory=saved_run, every=3, resume=True))


def test_tampered_history_is_refused(saved_run):
  path = os.path.join(saved_run, str(ROUNDS), "history", "metadata")
  with open(path) as f:
    text = f.read()
  edited = re.sub(r'("test_accuracy": )0\.(\d)', r"\g<1>0.9\2", text,
                  count=1)
  assert edited != text
  with open(path, "w") as f:
    f.write(edited)
  with pytest.raises(checkpoint.CorruptCheckpointError, match="history"):
    simulation.run(**run_args("fedavgm"), checkpointing=Checkpointing(
        directory=saved_run, every=3, resume=True))


def test_finished_run_extends_to_the_longer_run(saved_run):
  longer = dict(run_args("fedavgm"), num_rounds=ROUNDS + 2)
  extended = simulation.run(**longer, checkpointing=Checkpointing(
      directory=saved_run, every=3, resume=True))
  straight = simulation.run(**longer)
  assert len(extended.history.rows) == ROUNDS + 3
  assert_same_history(extended.history, straight.history)
  assert_same_tree(extended.state, straight.state)
  with pytest.raises(checkpoint.CheckpointMismatchError, match="past"):
    simulation.run(**dict(longer, num_rounds=2), checkpointing=Checkpointing(
        directory=saved_run, every=3, resume=True))


def test_describe_sees_closure_hyperparameters():
  a = fingerprint.describe(aggregators.fedadp(num_clients=4, alpha=5.0))
  b = fingerprint.describe(aggregators.fedadp(num_clients=4, alpha=3.0))
  assert a == fingerprint.describe(aggregators.fedadp(num_clients=4,
                                                     alpha=5.0))
  differences = fingerprint.config_differences(a, b)
  assert differences and all("alpha" in line for line in differences)


def test_client_state_resume_equals_uninterrupted(tmp_path):
  data, test = _run_data()
  model = linear_model()
  training = RUN_TRAINING
  update = clients.scaffold(model, training)
  rule = clients.scaffold_aggregator(1.0)
  kw = dict(participation=0.5, training=training, execution=QUIET,
            local_update=update, seed=3)
  straight = simulation.run(model, data, test, rule, num_rounds=4, **kw)
  directory = str(tmp_path / "ckpt")
  simulation.run(model, data, test, rule, num_rounds=2,
                 checkpointing=Checkpointing(directory, every=1), **kw)
  resumed = simulation.run(
      model, data, test, rule, num_rounds=4,
      checkpointing=Checkpointing(directory, every=1, resume=True), **kw)
  close(resumed.state.client_state, straight.state.client_state,
        atol=0)
  close(resumed.state.params, straight.state.params, atol=0)
