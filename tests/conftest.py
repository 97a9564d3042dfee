"""Test configuration: float32 everywhere, CPU, deterministic hypothesis."""

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

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", deadline=None, max_examples=25,
                          derandomize=True)
settings.load_profile("ci")
