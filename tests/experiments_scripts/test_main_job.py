"""The README's main job: what the README and the guide state of it (its
final accuracy, its figure) is what ``experiments/bench/main_job.py``
recorded from running the README's own command."""

import json
import os
import re

from tests.experiments_scripts._util import ROOT
from tests.experiments_scripts._util import load_script

main_job = load_script("bench", "main_job.py")


def _read(*parts) -> bytes:
  with open(os.path.join(ROOT, *parts), "rb") as f:
    return f.read()


def test_the_record_ran_the_readmes_command():
  record = json.loads(_read(main_job.RECORD))
  assert record["command"] == ["python", "-m", "fedjax_agg",
                               *main_job.readme_command(), "--out",
                               main_job.OUT]
  rows = json.loads(_read(main_job.OUT, "history.json"))["rows"]
  assert record["rounds"] == rows[-1]["round"] == 20
  assert record["final_test_accuracy"] == round(rows[-1]["test_accuracy"], 4)
  saved = json.loads(_read(main_job.OUT, "config.json"))
  assert saved["provenance"]["execution"]["out"] == main_job.OUT


def test_the_readme_and_guide_state_the_recorded_run():
  record = json.loads(_read(main_job.RECORD))
  readme = _read("README.md").decode()
  stated = re.search(r"ended at test accuracy\s+([0-9.]+)", readme)
  assert stated and float(stated[1]) == record["final_test_accuracy"], (
      stated and stated[1], record)
  # The figure the README and getting-started show is the run's own.
  assert _read(main_job.FIGURE) == _read(main_job.OUT, "curves.png")
  assert "img/quickstart_accuracy.png" in _read(
      "docs", "getting-started.md").decode()


def test_the_command_is_read_from_the_readme(tmp_path):
  readme = tmp_path / "README.md"
  readme.write_text("# x\n\n## Run the main job\n\n```sh\npython -m "
                    "fedjax_agg --rounds 2 \\\n    --out somewhere --lr "
                    "0.1\n```\n")
  assert main_job.readme_command(str(readme)) == ["--rounds", "2", "--lr",
                                                  "0.1"]
