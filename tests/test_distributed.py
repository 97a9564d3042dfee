"""``use_all_cores`` in a fresh process; the default vmap width per backend."""

import functools
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


def test_cpu_width_is_one_client_per_device():
  for devices in (1, 2, 8):
    assert distributed.choose_clients_per_step(
        "cpu", devices, num_params=1_663_370, free_bytes=None) == max(
            2, devices)


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
def test_accelerator_width_from_model_size_and_free_memory(backend):
  choose = functools.partial(distributed.choose_clients_per_step, backend)
  cap = distributed.ACCELERATOR_MAX_WIDTH
  # The measured CNN on an H200's 139 GiB: the measured best width.
  assert choose(1, 1_663_370, 139 << 30) == cap
  # A multiple of the devices the client axis is split over.
  assert choose(4, 1_663_370, 139 << 30) == 4 * cap
  # Memory bounds it: 24 bytes a parameter a client in a quarter of it.
  assert choose(1, 100_000_000, 16 << 30) == (16 << 30) // 4 // (
      24 * 100_000_000)
  # A model too large for two side by side still trains one at a time.
  assert choose(2, 10_000_000_000, 16 << 30) == 2
  # Unknown size: the former default of 8 a device.
  assert choose(2, None, None) == 16
  # Unknown memory: the cap.
  assert choose(1, 1_663_370, None) == cap


def test_free_memory_is_unknown_on_the_cpu():
  if jax.default_backend() != "cpu":
    pytest.skip("CPU only")
  assert distributed.free_device_memory() is None


def test_the_model_size_is_asked_only_on_an_accelerator(monkeypatch):
  asked = []

  def num_params():
    asked.append(1)
    return 1_663_370
  if jax.default_backend() == "cpu":
    # The CPU's width does not depend on the model: nothing is traced.
    assert distributed.default_clients_per_step(None, "clients",
                                                num_params) == 2
    assert not asked
  # As a GPU with 16 GiB free: the size is asked for once, and a quarter
  # of the memory at 24 bytes a parameter a client bounds the width.
  monkeypatch.setattr(distributed.jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(distributed, "free_device_memory",
                      lambda device=None: 16 << 30)
  assert distributed.default_clients_per_step(
      None, "clients", num_params) == (16 << 30) // 4 // (24 * 1_663_370)
  assert asked == [1]
