"""Test configuration: float32 everywhere, CPU, deterministic hypothesis;
the real Fashion-MNIST as a fixture."""

import os

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

# A compilation cache shared by the test processes of one session: tests
# build the same small programs again and again (a new jit of the same
# round is a new trace but the same XLA program), so all but the first
# compile of each are read back. FEDJAX_AGG_TEST_COMPILE_CACHE=0 turns it
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
