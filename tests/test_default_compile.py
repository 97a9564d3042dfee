"""The golden histories, compared in a process compiling with XLA's
default options when this session compiles fast (conftest.py): they were
recorded under the default options, which users' runs get, and hold to
their tolerances only there (LLVM at level 0 rounds a few float32 values
differently, e.g. a 0.19 rad angle by 3e-6 relative)."""

import os
import subprocess
import sys

import pytest

from tests import conftest

# The entry points' goldens hold under both (their tolerance is the spread
# between machines, larger than that between compile options) and run in
# the session.
GOLDEN_TESTS = ("tests/test_golden_history.py",)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_golden_histories_hold_as_users_compile():
  if os.environ.get("FEDJAX_AGG_TEST_FAST_COMPILE") != "1":
    pytest.skip("this session compiles with the default options: the "
                "golden tests ran in it")
  flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
           if flag not in conftest.FAST_FLAGS]
  env = {**os.environ, "FEDJAX_AGG_TEST_FAST_COMPILE": "0",
         "XLA_FLAGS": " ".join(flags)}
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       "-p", "no:xdist", "--durations=0", *GOLDEN_TESTS], cwd=REPO,
      env=env, capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
  assert " passed" in proc.stdout and "deselected" not in proc.stdout, (
      proc.stdout[-2000:])
