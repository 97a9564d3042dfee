"""``experiments/bench/finetune_bench.py`` at toy size: the engine's FedIT
round is timed and printed as one JSON line per variant; the loop is
skipped by name where PyTorch + PEFT are not installed (they are not
dependencies); the committed results hold the fields the README reads."""

import json
import os

from tests.experiments_scripts._util import ROOT
from tests.experiments_scripts._util import load_script

bench = load_script("bench", "finetune_bench.py")


def test_the_engine_round_is_timed_at_toy_size(capsys):
  assert bench.main(["--clients", "2", "--rounds", "1", "--no-loop"]) == 0
  lines = [json.loads(line) for line in
           capsys.readouterr().out.strip().splitlines()]
  engine, = [line for line in lines if line["variant"] == "engine"]
  assert engine["clients"] == 2 and engine["rounds"] == 1
  assert engine["round_s"] > 0 and engine["cpu_s"] > 0
  assert len(engine["load"]) == 3 and engine["date"]


def test_the_recorded_results_name_their_setting():
  path = os.path.join(ROOT, "experiments", "bench", "results",
                      "finetune_bench_2026-11-28.jsonl")
  with open(path) as f:
    lines = [json.loads(line) for line in f]
  variants = {(line["variant"], line["clients"]) for line in lines}
  assert {("engine", 10), ("engine", 100), ("loop", 10),
          ("loop", 100)} <= variants
  for line in lines:
    assert line["round_s"] > 0 and len(line["load"]) == 3
    if line["variant"] == "loop":
      assert line["logit_gap"] < 1e-4  # the same base, checked
