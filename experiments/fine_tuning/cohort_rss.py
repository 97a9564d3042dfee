"""The largest cohort one call trains, measured by running the call.

  python experiments/fine_tuning/cohort_rss.py        # W = 100, 200, 400
  python experiments/fine_tuning/cohort_rss.py --tiny --out /tmp/rss

``finetune.py --memory`` reads what one call of local training for W
clients side by side holds from XLA's compiled program. This script runs
that call: for each method (full fine-tuning, FedIT at rank 8) and each
W, a fresh process loads the setting of ``finetune.py`` (the base, the
natural partition), compiles the engine's local trainer for W clients
side by side as the rounds run it, and runs one local step for every
client. One step holds what a whole epoch holds (the steps are a loop
over the same buffers), so the call's memory is a cohort's. The process
reports its resident memory just before the call and its peak after it
(``ru_maxrss``); their difference is what the call allocated.

A least-squares line through (W, call memory) gives the memory per
client; with the memory held before the call it gives the largest
cohort within ``--budget-gib`` (default: this machine's memory,
``MemTotal``). ``--confirm F`` then runs each method once more at F
times that cohort and records whether the call ran. Writes
``<out>/cohort_rss.json`` (every process's record, the fits and the
settings) and prints a Markdown table.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import finetune  # noqa: E402  pylint: disable=g-import-not-at-top

METHODS = ("full", "fedit-8")


def resident_bytes() -> int:
  """This process's resident memory now (Linux ``/proc/self/statm``)."""
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(base_dir: str, method: str, width: int, batch_size: int,
            plays=None) -> dict:
  """Runs one call of local training for ``width`` clients of ``method``
  side by side in this process; -> its record (bytes and seconds)."""
  base, fed, _, _ = finetune.load_setting(base_dir, plays, 0, 1)
  rank = int(method.split("-")[1]) if "-" in method else 8
  model, _, init = finetune.methods(base, [rank], jax.random.key(0))[method]
  params = init if init is not None else model.init(jax.random.key(0))
  data = finetune.federations(fed, 0)["natural"]
  return {"method": method, "clients": width,
          **timed_call(model, params, data, width, batch_size)}


def timed_call(model, params, data, width: int, batch_size: int) -> dict:
  """Compiles and runs one call of local training (one step a client) for
  ``width`` clients side by side; -> the memory before it and at the
  peak (``ru_maxrss``), XLA's temporaries and outputs, the seconds."""
  start = time.perf_counter()
  compiled, args = finetune.cohort_call(model, params, data, width,
                                        batch_size,
                                        np.ones((width,), np.int32))
  compile_s = time.perf_counter() - start
  analysis = compiled.memory_analysis()
  before = resident_bytes()
  start = time.perf_counter()
  out = jax.block_until_ready(compiled(*args))
  call_s = time.perf_counter() - start
  # ru_maxrss is in KiB on Linux. The kernel keeps its resident-page
  # counters per thread and folds them in lazily, so the high-water mark
  # can trail a statm reading by a few pages: the peak is at least every
  # resident size read here.
  peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             before, resident_bytes())
  finite = all(bool(np.isfinite(np.asarray(leaf)).all())
               for leaf in jax.tree.leaves(out.client_params))
  return {"resident_before": before, "peak": peak,
          "call_bytes": max(peak - before, 0),
          "xla_temp_bytes": int(analysis.temp_size_in_bytes),
          "xla_output_bytes": int(analysis.output_size_in_bytes),
          "compile_s": round(compile_s, 2), "call_s": round(call_s, 2),
          "finite": finite}


def mem_total_bytes() -> int:
  """This machine's memory (Linux ``/proc/meminfo``'s ``MemTotal``)."""
  with open("/proc/meminfo") as f:
    for line in f:
      if line.startswith("MemTotal:"):
        return int(line.split()[1]) * 1024
  raise RuntimeError("/proc/meminfo has no MemTotal")


def run_child(args, method: str, width: int):
  """``measure`` in a fresh process; -> (return code, record or None)."""
  command = [sys.executable, os.path.abspath(__file__), "--one",
             f"{method}:{width}", "--base", args.base, "--batch-size",
             str(args.batch_size)] + (["--tiny"] if args.tiny else [])
  return child_record(command)


def child_record(command, env=None):
  """Runs ``command``, a ``--one`` child; -> (its return code, the record
  of its last stdout line, or None when it failed)."""
  done = subprocess.run(command, capture_output=True, text=True,
                        check=False, env=env)
  if done.returncode != 0:
    return done.returncode, None
  return 0, json.loads(done.stdout.strip().splitlines()[-1])


def measure_each(summary: dict, names, widths, run, budget_gib: float,
                 confirm: float, path: str) -> dict:
  """Every one of ``names`` at every width (``run(name, width) -> (return
  code, record)``, a child process each), the fit of each name's records
  and, with ``confirm``, a run at that fraction of its largest cohort;
  ``summary`` is written to ``path`` as JSON and printed as a table."""
  for name in names:
    for width in widths:
      code, record = run(name, width)
      if record is None:
        raise RuntimeError(f"{name} with {width} clients failed "
                           f"(exit status {code})")
      print(json.dumps(record), flush=True)
      summary["runs"].append(record)
    summary["fits"][name] = fitted = fit(
        [r for r in summary["runs"] if r["method"] == name],
        int(budget_gib * 2**30))
    if confirm:
      # At least one client: a fraction of a small cohort may round to 0.
      width = max(int(confirm * fitted["largest_cohort"]), 1)
      code, record = run(name, width)
      fitted["confirm"] = {"clients": width, "exit_status": code,
                           "record": record}
      print(json.dumps({"confirm": name, **fitted["confirm"]}),
            flush=True)
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    json.dump(summary, f, indent=1)
  print(table(summary))
  return summary


def fit(records, budget_bytes: int) -> dict:
  """The least-squares line of call memory over W, and the largest W
  whose call and resident memory fit ``budget_bytes``."""
  w = np.array([r["clients"] for r in records], np.float64)
  b = np.array([r["call_bytes"] for r in records], np.float64)
  per_client, fixed = np.polyfit(w, b, 1)
  resident = max(r["resident_before"] for r in records)
  largest = int((budget_bytes - resident - fixed) // per_client)
  return {"per_client_bytes": float(per_client), "fixed_bytes": float(fixed),
          "resident_before_bytes": int(resident),
          "largest_cohort": largest}


def table(summary) -> str:
  """The Markdown table of a ``summary``."""
  lines = ["| method | W | call memory (peak - before) | XLA temporaries "
           "| compile s | call s |", "| --- | ---: | ---: | ---: | ---: "
           "| ---: |"]
  for r in summary["runs"]:
    lines.append(f"| {r['method']} | {r['clients']} | "
                 f"{r['call_bytes'] / 2**20:,.0f} MiB | "
                 f"{r['xla_temp_bytes'] / 2**20:,.0f} MiB | "
                 f"{r['compile_s']} | {r['call_s']} |")
  for method, f in summary["fits"].items():
    lines.append(f"\n{method}: {f['per_client_bytes'] / 2**20:.1f} MiB per "
                 f"client, largest cohort in "
                 f"{summary['settings']['budget_gib']} GiB: "
                 f"{f['largest_cohort']:,}")
    if "confirm" in f:
      ran = f["confirm"]
      lines.append(f"{method}: {ran['clients']:,} clients in one call "
                   + ("ran" if ran["exit_status"] == 0 else
                      f"failed (exit status {ran['exit_status']})"))
  return "\n".join(lines)


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--base", default=os.path.join(HERE, "base"))
  parser.add_argument("--out", default=os.path.join(HERE, "results"))
  parser.add_argument("--widths", default="100,200,400")
  parser.add_argument("--batch-size", type=int, default=16)
  parser.add_argument("--budget-gib", type=float, default=None,
                      help="memory a cohort may use (default: MemTotal)")
  parser.add_argument("--confirm", type=float, default=0.0,
                      help="run each method at this fraction of its "
                      "largest cohort (0: not)")
  parser.add_argument("--tiny", action="store_true",
                      help="two plays, W = 1 and 2 (a smoke run)")
  parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  plays = ["hamlet", "macbeth"] if args.tiny else None
  if args.one:  # the child: one method and width, a JSON line
    method, width = args.one.split(":")
    print(json.dumps(measure(args.base, method, int(width), args.batch_size,
                             plays)), flush=True)
    return {}
  widths = [1, 2] if args.tiny else [
      int(w) for w in args.widths.split(",") if w]
  if len(widths) < 2 or min(widths) < 1:
    parser.error(f"--widths must name two or more positive cohort sizes, "
                 f"got {args.widths!r}")
  if args.budget_gib is None:
    args.budget_gib = round(mem_total_bytes() / 2**30, 2)
  if not 0 <= args.confirm < 1:
    parser.error(f"--confirm must be in [0, 1), got {args.confirm}")
  summary = {"settings": {**vars(args), "widths": widths,
                          **finetune.shown_paths(args)},
             "runs": [], "fits": {}}
  summary["settings"].pop("one")
  return measure_each(
      summary, METHODS, widths,
      lambda method, width: run_child(args, method, width),
      args.budget_gib, args.confirm,
      os.path.join(args.out, "cohort_rss.json"))


if __name__ == "__main__":
  main()
