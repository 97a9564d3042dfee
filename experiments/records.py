"""The committed run records (``experiments/*/results/**/config.json``):
checks that each says what data its run used and with which rule
arguments, and writes that provenance, verified, for runs that predate it.

  python experiments/records.py check
  python experiments/records.py backfill experiments/fedlap/results/fig2_mnist
  python experiments/records.py backfill experiments/adct/results/grid_mnist \\
      --config experiments/adct/configs/grid_mnist.json --rounds 2

``check`` lists every record lacking the data entry (the source read,
split sizes, each seed's client sizes), the resolved arguments of a rule
it ran, or naming ``auto`` as its source instead of what was read; it
exits with 1 when any does (``tests/experiments_scripts/test_records.py``
runs it).

``backfill`` rewrites one results folder's ``config.json`` from its config
(``--config``: the committed config that pins what the run used where
today's defaults differ, e.g. ADCT's ``threshold_mode`` and
``round_one``) restricted to the algorithms the folder holds, with the
provenance today's code computes from it, but only after re-running what
would show a mismatch: for every seed the initial model's evaluation
(round 0: the model, its initialisation and every client's data), and for
the first seed every algorithm's first ``--rounds`` rounds; each
recomputed metric must equal the committed history's within float32
rounding (accuracy within one test example, losses within 1e-4
relative). The comparisons are written under ``provenance.backfill``
together with the code's commit, so a reader can tell a record written
after its run from one written by it; ``environment`` and ``command``
then describe the backfill, not the original run. A mismatch writes
nothing and exits with 1.
"""

import argparse
import copy
import datetime
import glob
import importlib.util
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from fedjax_agg import experiment  # pylint: disable=wrong-import-position
from fedjax_agg import history as history_lib
from fedjax_agg import jsonio  # pylint: disable=wrong-import-position

# Compared between a committed history and its re-run (where both have
# them); accuracies within one test example, losses within LOSS_RTOL.
METRICS = ("test_accuracy", "test_loss", "client_loss_mean")
LOSS_RTOL = 1e-4
# Algorithm entries whose rounds need a stage this tool does not re-run.
NOT_RERUN = {"two_stage": "needs FedDRL's offline pre-training stage"}


def records(root: str = HERE) -> list[str]:
  """Every committed run record under ``root``, sorted (a Hugging Face
  checkpoint's config.json, beside its model.safetensors, is none)."""
  found = glob.glob(os.path.join(root, "*", "results", "**", "config.json"),
                    recursive=True)
  return sorted(path for path in found if not os.path.exists(
      os.path.join(os.path.dirname(path), "model.safetensors")))


def _provenance(record: dict) -> dict:
  """A record's provenance: its own, or its experiment config's (ADCT's
  records keep ADCT's format and hold the experiment config beside it)."""
  if "provenance" in record:
    return record["provenance"]
  return record.get("experiment_config", {}).get("provenance") or {}


def problems(path: str) -> list[str]:
  """What the record at ``path`` fails to say (empty: complete)."""
  with open(path) as f:
    record = json.load(f)
  provenance = _provenance(record)
  found = []
  data = provenance.get("data")
  if not data:
    found.append("no provenance.data (the data the run used)")
  else:
    if not data.get("source") or data["source"] == "auto":
      found.append(f"provenance.data.source is {data.get('source')!r}, "
                   "not what was read")
    if not data.get("clients_by_seed"):
      found.append("no provenance.data.clients_by_seed")
  rules = provenance.get("algorithms") or {}
  folder = os.path.dirname(path)
  # A command-line run of one algorithm keeps its history at the top of
  # its folder (execution.algorithm names it); a compared config one
  # folder per algorithm.
  single = (provenance.get("execution") or {}).get("algorithm")
  for name in record.get("algorithms", {}):
    if name == single and os.path.isfile(os.path.join(folder,
                                                      "history.json")):
      if "aggregator_args" not in rules.get(name, {}):
        found.append(f"no resolved rule arguments for {name!r}")
    elif not os.path.isdir(os.path.join(folder, name)):
      found.append(f"algorithm {name!r} has no results folder")
    elif "aggregator_args" not in rules.get(name, {}):
      found.append(f"no resolved rule arguments for {name!r}")
  return found


def check(root: str = HERE) -> int:
  """Prints every incomplete record; -> the count of them."""
  paths, bad = records(root), 0
  for path in paths:
    found = problems(path)
    if found:
      bad += 1
      print(f"{os.path.relpath(path, ROOT)}:")
      for problem in found:
        print(f"  {problem}")
  print(f"{len(paths) - bad} of {len(paths)} records complete")
  return bad


def _script(folder: str):
  """The experiment script of a results folder, imported (its
  ``run_one`` for ADCT), or None for the generic runner."""
  path = os.path.join(HERE, os.path.relpath(folder, HERE).split(os.sep)[0],
                      "run.py")
  if not os.path.exists(path) or "adct" not in path.split(os.sep)[-2]:
    return None
  spec = importlib.util.spec_from_file_location("adct_run", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _with_rounds(config: dict, rounds: int) -> dict:
  config = copy.deepcopy(config)
  config.setdefault("train", {})["rounds"] = rounds
  for spec in config["algorithms"].values():
    spec.get("train", {}).pop("rounds", None)
  return config


def _close(metric: str, committed, recomputed, test_examples: int) -> bool:
  if metric.endswith("accuracy"):
    return abs(committed - recomputed) <= 1.0 / test_examples + 1e-9
  return abs(committed - recomputed) <= LOSS_RTOL * max(abs(committed), 1e-12)


def _compare(algorithm, seed, saved_rows, rows, test_examples) -> list[dict]:
  compared = []
  for row in rows:
    saved = saved_rows[row["round"]]
    for metric in METRICS:
      a, b = saved.get(metric), row.get(metric)
      if a is None or b is None or not (math.isfinite(a)
                                        and math.isfinite(b)):
        continue
      compared.append({"algorithm": algorithm, "seed": seed,
                       "round": row["round"], "metric": metric,
                       "committed": a, "recomputed": b,
                       "equal": _close(metric, a, b, test_examples)})
  return compared


def _same_round_zero(spec: dict, other: dict) -> bool:
  """Whether two algorithms' initial evaluations are the same numbers:
  the same local training settings and neither ADCT's (whose clients hold
  their data whole where the others train on a split)."""
  return ("adct" not in spec and "adct" not in other
          and spec.get("train") == other.get("train"))


def verify(folder: str, config: dict, rounds: int, script, setting: dict,
           dataset) -> list[dict]:
  """Re-runs what ``backfill`` checks (module docstring); -> every
  comparison made. ``script``: ``_script(folder)``; ``setting``: the
  experiment config of ``config``; ``dataset``: its loaded dataset."""
  test_examples = len(dataset.test_y)
  seeds = experiment.check_config(config).seeds
  specs = config["algorithms"]
  runnable = [n for n, spec in specs.items()
              if not set(spec) & set(NOT_RERUN)]
  compared = []
  for seed in seeds:
    prepared = experiment.prepare_data(setting, seed, dataset)
    rerun = {}  # algorithm -> its recomputed rows, this seed
    for name in sorted(specs, key=lambda n: n not in runnable):
      saved = history_lib.load_saved(os.path.join(folder, name),
                                     f"seed{seed}", len(seeds))["rows"]
      want = rounds if seed == seeds[0] and name in runnable else 0
      twin = next((other for other in rerun if _same_round_zero(
          specs[name], specs[other])), None)
      if want == 0 and twin is not None:
        rows = rerun[twin][:1]  # round 0 does not depend on the rule
      else:
        short = _with_rounds(config, want)
        if script:
          rows = script.run_one(short, name, seed, prepared).history.rows
        else:
          rows = experiment.run_algorithm(short, name, seed,
                                          prepared).history.rows
        rerun[name] = rows
        print(f"{name} seed {seed}: rounds 0-{want} re-run", flush=True)
      compared += _compare(name, seed, saved, rows, test_examples)
  return compared


def _commit() -> str:
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def backfill(folder: str, config_path=None, rounds: int = 1) -> int:
  """Verifies and rewrites ``folder``'s ``config.json`` (module
  docstring); -> 0, or 1 on a mismatch (nothing written)."""
  config = experiment.load_config(  # a key given twice refused
      config_path or os.path.join(folder, "config.json"))
  for key in ("provenance", "experiment_config", "environment"):
    config.pop(key, None)
  held = [n for n in config["algorithms"]
          if os.path.isdir(os.path.join(folder, n))]
  if not held:
    raise ValueError(f"{folder} holds none of the config's algorithms "
                     f"{sorted(config['algorithms'])}")
  config["algorithms"] = {n: config["algorithms"][n] for n in held}
  script = _script(folder)
  setting = script.spec_config(config) if script else config
  dataset = experiment.load_dataset(setting)
  compared = verify(folder, config, rounds, script, setting, dataset)
  wrong = [c for c in compared if not c["equal"]]
  for c in wrong:
    print(f"MISMATCH {c}")
  if wrong or not compared:
    print(f"{folder}: nothing written ({len(wrong)} of {len(compared)} "
          "comparisons differ)")
    return 1
  skipped = {n: why for n, spec in config["algorithms"].items()
             for key, why in NOT_RERUN.items() if key in spec}
  note = {
      "written": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
      "code_commit": _commit(),
      "what": ("written after the run by experiments/records.py backfill: "
               "data and rule arguments computed from this config by the "
               "code at code_commit, after re-running the initial model "
               "(every seed) and the first rounds (first seed) and finding "
               "the committed histories' metrics equal (checks); "
               "environment and command describe the backfill"),
      "rounds_rerun": rounds, "not_rerun_beyond_round_0": skipped,
      "checks": compared}
  record = experiment.run_record(
      setting, dataset=dataset,
      execution={"out": experiment.shown_path(folder)},
      command=[experiment.shown_path(sys.argv[0])] + sys.argv[1:])
  record["provenance"]["backfill"] = note
  if script:
    record = {**config, "experiment_config": record}
  jsonio.dump_json(record, os.path.join(folder, "config.json"))
  print(f"{folder}: {len(compared)} comparisons equal; config.json written")
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  sub.add_parser("check", help="list incomplete records")
  fill = sub.add_parser("backfill", help="verify and write one record")
  fill.add_argument("folder")
  fill.add_argument("--config", default=None,
                    help="the config the run used (default: the folder's)")
  fill.add_argument("--rounds", type=int, default=1,
                    help="rounds re-run for the first seed (default 1)")
  args = parser.parse_args(argv)
  if args.command == "check":
    return 1 if check() else 0
  if args.rounds < 0:
    parser.error(f"--rounds must be >= 0, got {args.rounds}")
  return backfill(args.folder, args.config, args.rounds)


if __name__ == "__main__":
  sys.exit(main())
