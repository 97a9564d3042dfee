"""``experiments/bench/finetune_trace.py`` at toy size: one JSON line
whose op times are split into the kinds the README reads (the frozen
base's products, attention, the adapters' products)."""

import json

from tests.experiments_scripts._util import load_script

trace = load_script("bench", "finetune_trace.py")


def test_the_call_is_traced_and_split_by_kind(capsys):
  assert trace.main(["--clients", "2", "--top", "3"]) == 0
  line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert line["clients"] == 2 and line["call_s"] > 0
  kinds = line["by_kind_ms"]
  assert {"frozen base products", "attention products",
          "adapter products (rank 8)"} <= set(kinds)
  assert abs(sum(kinds.values()) - line["op_ms"]) < 1.0
  assert len(line["top"]) == 3 and len(line["load"]) == 3
