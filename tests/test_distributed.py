"""``use_all_cores``: one device per core in a fresh process."""

import os
import subprocess
import sys

import jax
import pytest

from fedjax_agg import distributed


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
