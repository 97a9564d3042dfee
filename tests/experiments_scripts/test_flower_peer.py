"""``experiments/bench/flower_peer.py``: without Flower, Ray, PyTorch (or
PEFT for fine-tuning) installed, it names what is missing in one JSON line
and times nothing (none of them is a dependency); the /proc/stat clock
it reads counts CPU seconds."""

import importlib.util
import json

import pytest

from tests.experiments_scripts._util import load_script

peer = load_script("bench", "flower_peer.py")


@pytest.mark.parametrize("workload, missing", [
    ("image", "flwr, ray, torch"), ("finetune", "flwr, ray, torch, peft")])
def test_a_missing_package_is_named_and_nothing_runs(monkeypatch, capsys,
                                                     workload, missing):
  find = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: (
      None if name in ("flwr", "ray", "torch", "peft") else find(name)))
  assert peer.main(["--workload", workload, "--clients", "2"]) == 0
  line, = capsys.readouterr().out.strip().splitlines()
  assert json.loads(line) == {"variant": "flower", "workload": workload,
                              "skipped": f"not installed: {missing}"}


def test_the_busy_clock_advances_with_work():
  before = peer._busy_seconds()
  total = 0
  while peer._busy_seconds() - before < 0.02:
    total += sum(range(10_000))
  assert peer._busy_seconds() > before
