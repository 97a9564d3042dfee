"""One command that checks the library on an accelerator and times it.

On a machine with one GPU (or TPU), from the repository root:

  python experiments/bench/gpu_check.py --out gpu_check_results

runs, one after the other, each in a process of its own:

* ``tests``: the tests whose answers an accelerator could change (the
  aggregation rules, the conformance suite, the engine, the rounds, the
  tree math, the convolution lowerings, the golden histories), on the
  accelerator at its default matmul precision;
* the round benchmark (``round_bench.py``, N clients x 600 examples, the
  1.66 M-parameter CNN, FedAvg): N = 100 with the library's defaults,
  with cuDNN's convolution at full precision, with the defaults of commit
  867e56b (8 clients side by side, cuDNN's
  convolution, the backend's matmul precision), with TF32 training
  (``--matmul-precision default``), with bfloat16 products on float32
  master weights (``--matmul-precision bfloat16``), and N = 1,000 with
  the defaults;
* the centralized anchors: the same CNN as one model at batch 16 and 1,600
  (``round_bench.py --mode central``);
* 10,000 clients x 100 examples in one call (``scaling_bench.py``);
* 8 seeds as one vmapped sweep against 8 runs (``sweep_bench.py``);
* the README's main job (the command line, 20 rounds of Fashion-MNIST).

Each step writes one JSON line to ``<out>/gpu_check.jsonl`` (its name, exit
status, seconds, the command and what the step printed as JSON), after a
first line naming the device, the driver, the versions and the commit; each
step's output goes to ``<logs>/<step>.log``. A step that would not fit in
what is left of ``--budget-s`` is skipped (and recorded as skipped), so
that the whole check ends in time. Prints a table at the end.

``--tiny`` runs every step at a toy size (a few clients, one round, one
test file) so that the check runs on a CPU in seconds; the test suite runs
it that way, so the command cannot rot.
"""

import argparse
import dataclasses
import glob
import json
import os
import platform
import re
import subprocess
import sys
import time
from importlib import metadata
from typing import Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The tests whose answers depend on the backend's arithmetic.
GPU_TESTS = ("tests/aggregators", "tests/test_aggregators_conformance.py",
             "tests/test_engine.py", "tests/test_rounds.py",
             "tests/test_tree_math.py", "tests/test_update_stats.py",
             "tests/models/test_layers.py", "tests/test_golden_history.py",
             "tests/test_distributed.py")
TINY_TESTS = ("tests/test_distributed.py", "-k", "width")
MAIN_JOB = ("--dataset", "fashion_mnist", "--partition", "shards",
            "--num-clients", "100", "--participation", "0.1", "--model",
            "cnn_mcmahan", "--rounds", "20", "--epochs", "1",
            "--batch-size", "16", "--lr", "0.05")
TINY_MAIN_JOB = ("--dataset", "fashion_mnist", "--max-train-examples",
                 "1000", "--partition", "shards", "--num-clients", "10",
                 "--participation", "0.2", "--model", "mlp2", "--rounds",
                 "1", "--epochs", "1", "--batch-size", "16", "--lr", "0.05")


@dataclasses.dataclass(frozen=True)
class Step:
  """One process of the check.

  Attributes:
    name: the step's name in the JSON lines.
    argv: the command after the interpreter, full size.
    tiny_argv: the same at toy size.
    timeout_s: the most seconds it may take (also what it needs left).
    parse: reads what the step printed (and wrote under ``out``) into the
      step's record.
  """
  name: str
  argv: tuple
  tiny_argv: tuple
  timeout_s: float
  parse: Callable[[str, str], dict]


def last_json_line(stdout: str, out: str) -> dict:
  """The last line of ``stdout`` that is a JSON object."""
  del out
  for line in reversed(stdout.splitlines()):
    line = line.strip()
    if line.startswith("{"):
      try:
        return json.loads(line)
      except json.JSONDecodeError:
        continue
  return {}


def pytest_summary(stdout: str, out: str) -> dict:
  """Counts of pytest's last summary line and the failed tests' ids."""
  del out
  counts = {}
  for line in reversed(stdout.splitlines()):
    found = re.findall(r"(\d+) (passed|failed|errors?|skipped)", line)
    if found and " in " in line:
      counts = {kind: int(n) for n, kind in found}
      break
  # A test id may hold spaces (parameters); " - " starts the reason.
  failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$",
                                 stdout, re.MULTILINE)))
  return {"counts": counts, "failed": failed}


def main_job_summary(stdout: str, out: str) -> dict:
  """The main job's final accuracy and round times, from its history."""
  del stdout
  paths = sorted(glob.glob(os.path.join(out, "main_job", "**",
                                        "history.json"), recursive=True))
  if not paths:
    return {}
  with open(paths[0], encoding="utf-8") as f:
    rows = json.load(f)
  rows = rows["rows"] if isinstance(rows, dict) else rows
  times = [row["time_s"] for row in rows[1:] if "time_s" in row]
  later = sorted(times[1:])
  return {"rounds": len(rows) - 1,
          "final_test_accuracy": rows[-1].get("test_accuracy"),
          "first_round_s": times[0] if times else None,
          "median_round_s": later[len(later) // 2] if later else None,
          "training_s": round(sum(times), 3)}


def _bench(*args) -> tuple:
  return ("experiments/bench/round_bench.py", "--host-devices", "1", *args)


TINY_ROUND = ("--clients", "2", "--examples-per-client", "32", "--rounds",
              "1")


def steps(out: str, test_workers: int = 8,
          test_paths: tuple = GPU_TESTS) -> list[Step]:
  """The check's steps, in the order they run (``test_workers``: pytest
  processes of the tests step; ``test_paths``: what it runs)."""
  main_out = ("--out", os.path.join(out, "main_job"), "--no-progress")
  tiny_round = TINY_ROUND
  return [
      Step("tests", ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-n",
                     str(test_workers), *test_paths),
           ("-m", "pytest", "-q", "-p", "no:cacheprovider", *TINY_TESTS),
           200, pytest_summary),
      Step("engine_n100", _bench("--clients", "100", "--rounds", "3"),
           _bench(*tiny_round), 60, last_json_line),
      Step("engine_n100_867e56b_defaults",
           _bench("--clients", "100", "--rounds", "3", "--clients-per-step",
                  "8", "--conv-impl", "xla", "--matmul-precision",
                  "default"),
           # XLA:CPU's grouped convolution is too slow for a toy run.
           _bench(*tiny_round, "--clients-per-step", "2", "--conv-impl",
                  "conv", "--matmul-precision", "default"),
           60, last_json_line),
      Step("sweep_s8",
           ("experiments/bench/sweep_bench.py", "--seeds", "8", "--rounds",
            "5"),
           ("experiments/bench/sweep_bench.py", "--seeds", "2", "--rounds",
            "1", "--clients", "10", "--max-train-examples", "600"),
           90, last_json_line),
      Step("main_job", ("-m", "fedjax_agg", *MAIN_JOB, *main_out),
           ("-m", "fedjax_agg", *TINY_MAIN_JOB, *main_out), 90,
           main_job_summary),
      Step("engine_n1000", _bench("--clients", "1000", "--rounds", "1"),
           _bench(*tiny_round), 90, last_json_line),
      Step("engine_n100_tf32",
           _bench("--clients", "100", "--rounds", "3",
                  "--matmul-precision", "default"),
           _bench(*tiny_round, "--matmul-precision", "default"),
           60, last_json_line),
      Step("engine_n100_xla",
           _bench("--clients", "100", "--rounds", "3", "--conv-impl",
                  "xla"),
           _bench(*tiny_round, "--conv-impl", "conv"),
           60, last_json_line),
      Step("engine_n100_bf16",
           _bench("--clients", "100", "--rounds", "3",
                  "--matmul-precision", "bfloat16"),
           _bench(*tiny_round, "--matmul-precision", "bfloat16"),
           60, last_json_line),
      Step("scale_10k",
           ("experiments/bench/scaling_bench.py", "--only", "1",
            "--clients-per-device", "10000", "--examples", "100",
            "--model", "cnn_mcmahan", "--rounds", "1"),
           ("experiments/bench/scaling_bench.py", "--only", "1",
            "--clients-per-device", "2", "--examples", "16", "--model",
            "mlp2", "--rounds", "1"),
           90, last_json_line),
      Step("central_b1600",
           _bench("--mode", "central", "--clients", "100", "--rounds", "3",
                  "--central-batch", "1600"),
           _bench("--mode", "central", *tiny_round, "--central-batch",
                  "32"),
           45, last_json_line),
      Step("central_b16",
           _bench("--mode", "central", "--clients", "100", "--rounds", "3",
                  "--central-batch", "16"),
           _bench("--mode", "central", *tiny_round, "--central-batch", "16"),
           45, last_json_line),
  ]


def environment() -> dict:
  """Device, driver, versions and commit of this check."""
  import jax  # pylint: disable=g-import-not-at-top
  record = {"step": "environment", "backend": jax.default_backend(),
            "device_kind": jax.devices()[0].device_kind,
            "platform": jax_platform(jax.devices()[0]),
            "devices": jax.device_count(), "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "versions": {}}
  for name in ("jax", "jaxlib", "flax", "optax", "numpy", "chex"):
    try:
      record["versions"][name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      record["versions"][name] = None
  try:
    record["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
         "--format=csv,noheader"], capture_output=True, text=True,
        timeout=20, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    record["nvidia_smi"] = None
  record["commit"] = os.environ.get("FEDJAX_AGG_COMMIT") or _git_commit()
  return record


def jax_platform(device) -> str:
  """The name ``JAX_PLATFORMS`` takes for ``device``'s backend: "cuda" or
  "rocm" for a GPU (whose ``platform`` is "gpu", which would ask for
  both), else its platform ("cpu", "tpu")."""
  if device.platform != "gpu":
    return device.platform
  version = str(getattr(device.client, "platform_version", "")).lower()
  return "rocm" if "rocm" in version else "cuda"


def _git_commit() -> Optional[str]:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, timeout=10,
                          check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None


def run_step(step: Step, out: str, logs: str, tiny: bool, timeout_s: float,
             env: dict) -> dict:
  """Runs one step; its record (also when it fails or times out)."""
  argv = [sys.executable, *(step.tiny_argv if tiny else step.argv)]
  start = time.perf_counter()
  try:
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s, check=False)
    rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
  except subprocess.TimeoutExpired as e:
    rc = "timeout"
    stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (
        e.stdout or "")
    stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else (
        e.stderr or "")
  seconds = time.perf_counter() - start
  with open(os.path.join(logs, f"{step.name}.log"), "w",
            encoding="utf-8") as f:
    f.write(f"$ {' '.join(argv[1:])}\n{stdout}\n--- stderr ---\n{stderr}")
  return {"step": step.name, "rc": rc, "seconds": round(seconds, 1),
          "command": " ".join(argv[1:]), **step.parse(stdout, out)}


def summary(records: list[dict]) -> str:
  """A Markdown table of the records."""
  lines = ["| step | rc | s | result |", "| --- | --- | --- | --- |"]
  for record in records[1:]:
    if "samples_per_s" in record:
      result = f"{record['samples_per_s']:,} samples/s"
    elif "counts" in record:
      result = f"{record['counts']} failed: {record['failed']}"
    elif "speedup_total" in record:
      result = (f"sweep {record['speedup_total']}x, params diff "
                f"{record['max_final_params_diff']:.2e}")
    elif "median_round_s" in record:
      result = (f"accuracy {record['final_test_accuracy']}, "
                f"{record['median_round_s']} s a round")
    else:
      result = record.get("skipped", "")
    lines.append(f"| {record['step']} | {record.get('rc', '-')} | "
                 f"{record.get('seconds', '-')} | {result} |")
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True,
                      help="folder for gpu_check.jsonl and the main job")
  parser.add_argument("--logs", default=None,
                      help="folder for the steps' logs (default: --out)")
  parser.add_argument("--tiny", action="store_true",
                      help="every step at a toy size (for a CPU)")
  parser.add_argument("--budget-s", type=float, default=450.0,
                      help="seconds the whole check may take")
  parser.add_argument("--test-workers", type=int, default=8,
                      help="pytest processes of the tests step")
  parser.add_argument("--tests", default=None,
                      help="comma-separated test paths instead of the "
                      "accelerator subset")
  parser.add_argument("--only", default=None,
                      help="comma-separated step names to run")
  args = parser.parse_args(argv)
  plan = steps(args.out, args.test_workers,
               GPU_TESTS if args.tests is None else tuple(
                   args.tests.split(",")))
  names = [step.name for step in plan]
  only = None if args.only is None else args.only.split(",")
  unknown = sorted(set(only or ()) - set(names))
  if unknown:
    parser.error(f"--only names unknown steps {unknown}; steps: {names}")
  logs = args.logs or args.out
  for folder in (args.out, logs):
    os.makedirs(folder, exist_ok=True)
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
             PYTHONPATH=os.pathsep.join(
                 filter(None, [ROOT, os.environ.get("PYTHONPATH", "")])))
  first = environment()
  tests_env = dict(env)
  if first["backend"] != "cpu":
    # The test configuration keeps tests on the CPU unless told; "gpu"
    # would also ask for ROCm, so the platform's own name ("cuda"), with
    # the CPU for the tests that start CPU processes.
    tests_env["JAX_PLATFORMS"] = first["platform"] + ",cpu"
  records = [first]
  path = os.path.join(args.out, "gpu_check.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    f.write(json.dumps(first) + "\n")
  deadline = time.perf_counter() + args.budget_s
  for step in plan:
    if only is not None and step.name not in only:
      continue
    left = deadline - time.perf_counter()
    if left < min(step.timeout_s, 30):
      record = {"step": step.name, "skipped": f"{left:.0f} s left"}
    else:
      print(f"{step.name} ...", file=sys.stderr, flush=True)
      record = run_step(step, args.out, logs, args.tiny,
                        min(step.timeout_s, left),
                        tests_env if step.name == "tests" else env)
    records.append(record)
    with open(path, "a", encoding="utf-8") as f:
      f.write(json.dumps(record) + "\n")
  print(summary(records), flush=True)
  return records


if __name__ == "__main__":
  main()
