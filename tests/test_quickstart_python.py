"""The README's Python quick start is the command line's main job: run
both (at a small size) in fresh processes and compare their histories."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from fedjax_agg import data as data_lib
from tests import agg_testutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The main job made small, the same way in both.
SMALL = {'rounds=20': 'rounds=2', '"cnn_mcmahan"': '"mlp2"',
         'spec.DataSpec("fashion_mnist")':
             'spec.DataSpec("fashion_mnist", max_train_examples=3000)',
         'spec.PartitionSpec("shards", 100)':
             'spec.PartitionSpec("shards", 20)'}


def _readme_blocks():
  text = open(os.path.join(ROOT, "README.md")).read()
  section = text.split("## Quick start in Python", 1)[1]
  command = re.search(r"```sh\n(python -m fedjax_agg .*?)```", text,
                      re.S).group(1)
  return re.search(r"```python\n(.*?)```", section, re.S).group(1), command


def _run(argv, cwd):
  # Each process splits the CPU itself (no device count), compiling fast
  # as the other tests do: both processes compile alike.
  env = {**os.environ, "PYTHONPATH": ROOT,
         "XLA_FLAGS": " ".join(agg_testutil.fast_compile_flags())}
  done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


def test_the_python_quick_start_is_the_main_job(tmp_path):
  try:
    data_lib.load("fashion_mnist")
  except data_lib.DatasetNotFoundError as error:
    pytest.skip(f"Fashion-MNIST not installed: {error}")
  code, command = _readme_blocks()
  for old, new in SMALL.items():
    assert old in code, old
    code = code.replace(old, new)
  printed = _run([sys.executable, "-c", code], tmp_path)
  assert re.search(r"final test accuracy 0\.\d+", printed), printed
  flags = command.replace("\\\n", " ").split()[3:]
  changes = {"--model": "mlp2", "--rounds": "2", "--num-clients": "20"}
  for i, flag in enumerate(flags[:-1]):
    if flag in changes:
      flags[i + 1] = changes[flag]
  flags += ["--max-train-examples", "3000", "--no-progress"]
  flags[flags.index("--out") + 1] = "cli"
  _run([sys.executable, "-m", "fedjax_agg", *flags], tmp_path)
  python = json.load(open(tmp_path / "results" / "quickstart_python" /
                          "history.json"))["rows"]
  cli = json.load(open(tmp_path / "cli" / "history.json"))["rows"]
  assert len(python) == len(cli) == 3
  for ours, theirs in zip(python, cli, strict=True):
    np.testing.assert_allclose(ours["test_accuracy"],
                               theirs["test_accuracy"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(ours["test_loss"], theirs["test_loss"],
                               rtol=1e-5)
