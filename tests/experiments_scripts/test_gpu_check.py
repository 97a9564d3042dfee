"""The one-command accelerator check runs on the CPU at toy size, so that
its commands cannot rot between the times a GPU is at hand."""

import json
import os
import subprocess
import sys

from tests.experiments_scripts._util import ROOT
from tests.experiments_scripts._util import load_script

# One step of each script and flag set (the other steps repeat them with
# other sizes); the whole list must still name real steps.
TINY_STEPS = ("tests", "engine_n100_867e56b_defaults", "sweep_s8",
              "main_job", "scale_10k", "central_b1600")


def test_every_step_runs_at_toy_size_and_is_recorded(tmp_path, fashion):
  del fashion  # the sweep and the main job read Fashion-MNIST
  out, logs = tmp_path / "out", tmp_path / "logs"
  proc = subprocess.run(
      [sys.executable, "experiments/bench/gpu_check.py", "--tiny", "--out",
       str(out), "--logs", str(logs), "--only", ",".join(TINY_STEPS)],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  records = [json.loads(line) for line in
             (out / "gpu_check.jsonl").read_text().splitlines()]
  first, steps = records[0], {r["step"]: r for r in records[1:]}
  assert first["step"] == "environment"
  assert first["backend"] == "cpu" and first["versions"]["jax"]
  assert sorted(steps) == sorted(TINY_STEPS)
  for name, record in steps.items():
    assert record["rc"] == 0, (name, record)
    assert (logs / f"{name}.log").exists()
  assert steps["tests"]["counts"]["passed"] > 0
  assert steps["tests"]["failed"] == []
  engine = steps["engine_n100_867e56b_defaults"]
  assert engine["samples_per_s"] > 0
  assert engine["engine_options"]["clients_per_step"] == 2
  assert engine["matmul_precision"] == "default"
  assert steps["central_b1600"]["peer"] == "fedjax_agg_central"
  assert 0 <= steps["main_job"]["final_test_accuracy"] <= 1
  assert steps["main_job"]["rounds"] == 1
  assert steps["sweep_s8"]["seeds"] == 2
  # On the CPU the sweep's members equal the separate runs to rounding.
  assert steps["sweep_s8"]["max_final_params_diff"] < 1e-5
  assert steps["scale_10k"]["cohort"] == 2
  # The table at the end names every step.
  for name in TINY_STEPS:
    assert f"| {name} | 0 |" in proc.stdout


def test_unknown_steps_are_refused_by_name(tmp_path):
  proc = subprocess.run(
      [sys.executable, "experiments/bench/gpu_check.py", "--tiny", "--out",
       str(tmp_path), "--only", "tests,engine_n10"],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 2
  assert "--only names unknown steps ['engine_n10']" in proc.stderr


def test_failed_tests_and_summaries_are_read_from_the_output():
  check = load_script("bench", "gpu_check.py")
  summary = check.pytest_summary(
      "FAILED tests/a.py::test_x - AssertionError\n"
      "FAILED tests/c.py::test_z[(1, 5, 'SAME')-im2col] - Assert...\n"
      "ERROR tests/b.py::test_y\n"
      "2 failed, 726 passed, 1 error in 131.47s (0:02:11)\n", "")
  assert summary == {"counts": {"failed": 2, "passed": 726, "error": 1},
                     "failed": ["tests/a.py::test_x", "tests/b.py::test_y",
                                "tests/c.py::test_z[(1, 5, 'SAME')-im2col]"]}
  assert check.last_json_line('x\n{"a": 1}\n{bad\nend\n', "") == {"a": 1}
  assert check.last_json_line("no json\n", "") == {}
  names = [step.name for step in check.steps(os.devnull)]
  assert len(names) == len(set(names))
  assert set(TINY_STEPS) <= set(names)


def test_the_platform_named_for_the_tests_is_one_jax_platforms_takes():
  check = load_script("bench", "gpu_check.py")

  class Client:
    def __init__(self, version):
      self.platform_version = version

  class Device:
    def __init__(self, platform, version=""):
      self.platform, self.client = platform, Client(version)

  # A GPU's platform is "gpu", which JAX_PLATFORMS reads as CUDA and ROCm.
  assert check.jax_platform(Device("gpu", "PJRT C API\ncuda 13000")) == "cuda"
  assert check.jax_platform(Device("gpu", "rocm 6.2")) == "rocm"
  assert check.jax_platform(Device("tpu")) == "tpu"
  assert check.jax_platform(Device("cpu")) == "cpu"
