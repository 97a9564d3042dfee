"""``experiments/fine_tuning/cohort_rss_hf.py`` at toy size: one call of
a LoRA cohort on a fresh Llama-architecture checkpoint is measured in
this process (plain and rematerialised), the whole script fits a line
per variant from child processes (with the variant's XLA flags), and a
bad option is refused by name."""

import json

import pytest

from tests.experiments_scripts._util import load_script

script = load_script("fine_tuning", "cohort_rss_hf.py")


@pytest.mark.parametrize("variant", ["fedit", "fedit-remat"])
def test_one_call_is_measured(variant):
  record = script.measure("tiny", variant, 2, 2, 8, 2)
  assert record["method"] == variant and record["clients"] == 2
  assert record["finite"]
  assert record["peak"] >= record["resident_before"] > 0
  assert record["call_bytes"] == record["peak"] - record["resident_before"]
  assert 0 < record["trainable"] < record["base_params"]


def test_the_script_fits_each_variant(tmp_path):
  summary = script.main(["--tiny", "--variants", "fedit-remat-sched",
                         "--out", str(tmp_path)])
  assert [r["clients"] for r in summary["runs"]] == [1, 2]
  assert set(summary["fits"]) == {"fedit-remat-sched"}
  # The child ran with XLA's memory-ordering scheduler.
  assert all(script.MEMORY_SCHEDULER in r["xla_flags"]
             for r in summary["runs"])
  written = json.loads((tmp_path / "cohort_rss_hf.json").read_text())
  assert written["settings"]["model"] == script.CONFIGS["tiny"]
  assert written["settings"]["seq_len"] == 8


@pytest.mark.parametrize("argv, named", [
    (["--variants", "full"], "--variants"),
    (["--widths", "4"], "--widths"),
    (["--confirm", "1.5"], "--confirm")])
def test_bad_options_are_refused(argv, named, capsys):
  with pytest.raises(SystemExit):
    script.main(argv)
  assert named in capsys.readouterr().err
