"""Test configuration: float32 everywhere, CPU, deterministic hypothesis;
the real Fashion-MNIST as a fixture."""

import os

from tests._fast_compile import as_flags
from tests._fast_compile import FAST_COMPILE

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One CPU device per test process, whatever the order tests run in: an
# entry point that asks for all cores (``distributed.use_all_cores``) keeps
# an explicit count, so JAX never starts with a count a later test's
# ``--cpu-devices 1`` cannot have. Tests of several devices start
# subprocesses with their own count.
if "--xla_force_host_platform_device_count" not in os.environ.get(
    "XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                             "--xla_force_host_platform_device_count=1"
                             ).strip()

# Test programs compile with LLVM at optimisation level 0 and XLA:CPU's
# elemental emitters (``_fast_compile.FAST_COMPILE``): the tests check what
# a program computes, not how fast its machine code runs, and most of
# their time is compiling many small programs, which this halves.
# FEDJAX_AGG_TEST_FAST_COMPILE=0 compiles as users' runs do. XLA aborts on
# a flag it does not know, so the flags are tried in a process of their
# own first, together, then one by one if that fails (once: the workers
# inherit the controller's environment).
FAST_FLAGS = tuple(as_flags(FAST_COMPILE))


def _xla_accepts(flags) -> bool:
  """Whether a JAX process starts and computes with ``flags``."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  return subprocess.run(
      [sys.executable, "-c", "import jax; jax.numpy.zeros(1).sum()"],
      env={**os.environ, "XLA_FLAGS": " ".join(flags)}, capture_output=True,
      check=False).returncode == 0


if (os.environ.get("FEDJAX_AGG_TEST_FAST_COMPILE", "1") != "0"
    and "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]):
  _known = (list(FAST_FLAGS) if _xla_accepts(FAST_FLAGS) else
            [flag for flag in FAST_FLAGS if _xla_accepts([flag])])
  os.environ["XLA_FLAGS"] = " ".join([os.environ["XLA_FLAGS"], *_known])
  os.environ["FEDJAX_AGG_TEST_FAST_COMPILE"] = "1"

# A compilation cache shared by the test processes of one session: tests
# build the same small programs again and again (a new jit of the same
# round is a new trace but the same XLA program), so all but the first
# compile of each are read back (also the quick ones: measured, keeping
# only those over 0.5 s made the suite 6 % slower).
# FEDJAX_AGG_TEST_COMPILE_CACHE=0 turns it
# off; a directory path keeps it between sessions.
_CACHE = os.environ.get("FEDJAX_AGG_TEST_COMPILE_CACHE", "")
_OWN_CACHE = None
if _CACHE != "0":
  if not _CACHE:
    import tempfile  # pylint: disable=g-import-not-at-top
    _CACHE = _OWN_CACHE = tempfile.mkdtemp(prefix="fedjax_agg_xla_cache_")
    # The workers (started after this) share the controller's directory.
    os.environ["FEDJAX_AGG_TEST_COMPILE_CACHE"] = _CACHE
  # As environment variables, so that the processes tests start (other
  # device counts, the notebook's kernel, the CLI) share the cache too.
  _SETTINGS = {"jax_compilation_cache_dir": _CACHE,
               "jax_persistent_cache_min_compile_time_secs": "0",
               "jax_persistent_cache_min_entry_size_bytes": "0"}
  for _name, _value in _SETTINGS.items():
    os.environ[_name.upper()] = _value
  import jax  # noqa: E402  pylint: disable=g-import-not-at-top
  jax.config.update("jax_compilation_cache_dir", _CACHE)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", deadline=None, max_examples=25,
                          derandomize=True)
settings.load_profile("ci")


def pytest_sessionfinish(session, exitstatus):
  """Removes the session's own compilation cache (the process that made
  it: the controller of a parallel run, or the only process)."""
  del session, exitstatus
  if _OWN_CACHE is not None:
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


@pytest.fixture(scope="module")
def fashion():
  """The real Fashion-MNIST from its installed files (skips without them)."""
  from fedjax_agg import data as data_lib  # pylint: disable=g-import-not-at-top
  try:
    return data_lib.load("fashion_mnist", source="files")
  except data_lib.DatasetNotFoundError as e:
    pytest.skip(f"Fashion-MNIST files not installed: {e}")


# The longest modules (each goes whole to one worker, ``--dist
# loadscope``), longest first as measured (2026-11-29, in seconds: 62,
# 60, 49, 43, 38, 35, 33, 32, 27, 26, 23, ..., 11), run before the others:
# a parallel run then ends on short modules, with its workers finishing
# together, instead of one working through a long module at the end
# (collection order would put several of them last).
LONG_FIRST = ("tests/test_sharding.py", "tests/test_docs_howtos.py",
              "tests/test_python_config_equivalence.py",
              "tests/experiments_scripts/test_scripts_build.py",
              "tests/test_sweep.py", "tests/test_aggregators_conformance.py",
              "tests/experiments_scripts/test_hf_checkpoints.py",
              "tests/experiment/test_pretrained_base.py",
              "tests/cli/test_cli.py",
              "tests/models/test_pretrained_rules.py",
              "tests/experiments_scripts/test_gpu_check.py",
              "tests/test_rounds.py", "tests/test_runner.py",
              "tests/test_secagg.py",
              "tests/test_engine_rows_independent.py",
              "tests/test_notebook.py",
              "tests/experiments_scripts/test_finetune.py",
              "tests/test_history_columns_doc.py", "tests/test_checkpoint.py",
              "tests/test_interrupt.py", "tests/test_privacy.py",
              "tests/lora/test_spec.py", "tests/objectives/test_fedlap.py",
              "tests/aggregators/test_dp_ftrl.py",
              "tests/cli/test_before_writing.py",
              "tests/aggregators/test_dp_fedavg.py", "tests/test_engine.py",
              "tests/test_hostile_aggregators.py",
              "tests/experiments_scripts/test_cohort_rss_hf.py",
              "tests/test_fedbuff.py", "tests/lora/test_hostile.py",
              "tests/test_compression.py",
              "tests/test_quickstart_python.py",
              "tests/clients/test_apfl.py", "tests/clients/test_feddyn.py",
              "tests/test_simulation.py", "tests/test_run_context.py")


def _long_first(item) -> int:
  """Where ``item`` runs among the ``LONG_FIRST`` modules (after them: one
  more than their count)."""
  for rank, module in enumerate(LONG_FIRST):
    if item.nodeid.startswith(module):
      return rank
  return len(LONG_FIRST)


def pytest_collection_modifyitems(config, items):
  """Runs the ``LONG_FIRST`` modules first."""
  del config
  items.sort(key=_long_first)

