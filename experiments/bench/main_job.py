"""The README's main job, run as the README says, and the figures the
guide shows from it.

  python experiments/bench/main_job.py            # run it, then record
  python experiments/bench/main_job.py --record   # record from the run

Runs the command of the README's "Run the main job" (read from README.md,
so that the two cannot differ) with ``--out`` set to
``experiments/bench/results/main_job`` (replacing an earlier run of it
there: only the files that run wrote), then copies its ``curves.png`` to
``docs/img/quickstart_accuracy.png`` and writes
``experiments/bench/results/main_job.json``: the command, the final test
accuracy and the wall time of the command.
``tests/experiments_scripts/test_main_job.py`` checks that the README's
stated accuracy, the figure and the committed history agree.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join("experiments", "bench", "results", "main_job")
FIGURE = os.path.join("docs", "img", "quickstart_accuracy.png")
RECORD = os.path.join("experiments", "bench", "results", "main_job.json")


def readme_command(readme: str = os.path.join(ROOT, "README.md")
                   ) -> list[str]:
  """The arguments of the README's main job (after ``python -m
  fedjax_agg``), its ``--out`` left out."""
  with open(readme, encoding="utf-8") as f:
    text = f.read()
  section = text.split("## Run the main job", 1)[1]
  block = re.search(r"```sh\n(.*?)```", section, re.S)[1]
  words = shlex.split(block.replace("\\\n", " "))
  if words[:3] != ["python", "-m", "fedjax_agg"]:
    raise ValueError(f"README's main job is not a fedjax_agg command: "
                     f"{words[:3]}")
  arguments = words[3:]
  if "--out" in arguments:
    at = arguments.index("--out")
    del arguments[at:at + 2]
  return arguments


def record(seconds=None) -> dict:
  """Copies the run's figure into the guide and writes ``main_job.json``;
  returns it."""
  with open(os.path.join(ROOT, OUT, "history.json"), encoding="utf-8") as f:
    rows = json.load(f)["rows"]
  shutil.copyfile(os.path.join(ROOT, OUT, "curves.png"),
                  os.path.join(ROOT, FIGURE))
  entry = {"command": ["python", "-m", "fedjax_agg", *readme_command(),
                       "--out", OUT],
           "rounds": rows[-1]["round"],
           "final_test_accuracy": round(rows[-1]["test_accuracy"], 4)}
  if seconds is not None:
    entry["wall_s"] = round(seconds, 1)
  elif os.path.exists(os.path.join(ROOT, RECORD)):
    with open(os.path.join(ROOT, RECORD), encoding="utf-8") as f:
      entry["wall_s"] = json.load(f).get("wall_s")
  with open(os.path.join(ROOT, RECORD), "w", encoding="utf-8") as f:
    json.dump(entry, f, indent=1)
    f.write("\n")
  return entry


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--record", action="store_true",
                      help="only record from the committed run")
  args = parser.parse_args(argv)
  seconds = None
  if not args.record:
    command = [sys.executable, "-m", "fedjax_agg", *readme_command(),
               "--out", OUT]
    if os.path.isdir(os.path.join(ROOT, OUT)):
      command.append("--overwrite")
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True)
    seconds = time.perf_counter() - start
  print(json.dumps(record(seconds)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
