"""Golden histories: ``simulation.run`` (and the ADCT driver) for fixed seeds.

The fixture ``golden/histories.json`` was written by the round driver before
it was restructured; the driver must keep reproducing it (every scalar
column and every per-client array, to float32 rounding). Regenerate it only
for an intended change of results: ``python -m tests.test_golden_history``.
"""

import json
import os

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import drivers
from fedjax_agg import simulation
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from tests.test_engine import SIZES
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

# Recorded under XLA's default compile options; they hold to these
# tolerances under the tests' fast options too (conftest.py), and on
# other CPUs: FEDJAX_AGG_TEST_FAST_COMPILE=0 checks them as users compile.

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "histories.json")
ROUNDS = 3
RULES = ("fedavg", "fedadp", "fedlayerwise", "fednnnn", "feddrl", "adct")


def _aggregator(name, num_clients):
  if name == "feddrl":
    return aggregators.get("feddrl", num_participants=3, min_buffer_size=2,
                           batch_size=2)
  return aggregators.get("fedavg" if name == "adct" else name,
                         num_clients=num_clients)


def _history(name):
  """The history of a short run of rule ``name`` as plain lists."""
  # ADCT holds out a validation split: every client needs 2+ examples.
  data, x, y, _ = tiny_data((7, 13, 4, 10, 3) if name == "adct" else SIZES)
  model = tiny_model()
  aggregator = _aggregator(name, data.num_clients)
  if name == "adct":
    tuner = clients.adct(
        model, grid=[(0.05, 1), (0.2, 1), (0.2, 2)], batch_size=3,
        threshold_mode="absolute", round_one="first")
    history = drivers.run_adct(
        model, data, (x, y), aggregator, tuner, num_rounds=ROUNDS,
        participation=0.6, seed=4,
        execution=Execution(progress=False)).history
  else:
    history = simulation.run(
        model, data, (x, y), aggregator, num_rounds=ROUNDS,
        participation=0.6,
        training=LocalTraining(epochs=2, batch_size=3, learning_rate=0.2,
                               compute_losses=True),
        evaluation=Evaluation(clients=True),
        execution=Execution(clients_per_step=2, progress=False),
        seed=4).history
  rows = [{k: v for k, v in row.items() if k != "time_s"}
          for row in history.rows]
  client_rows = [{k: np.asarray(v).tolist() for k, v in row.items()}
                 for row in history.client_rows]
  return {"rows": rows, "clients": client_rows}


RTOL, ATOL = 2e-6, 1e-7
# FedAdp's and FedLayerWise's angles are arccos of cosines computed in
# float32, and arccos turns a cosine's rounding d into d / sin(theta): a
# 0.19 rad angle moves 5x more than its cosine (seen: 3.3e-6 relative on
# another CPU, and under LLVM at level 0). These, and their running
# means, hold to the values' tolerance over the least sine recorded.
ANGLES = ("angles", "smoothed_angles")


def _angle_atol(want) -> float:
  """The angles' absolute tolerance: ``RTOL`` (a cosine's, as every value
  of size one) over the least sine of an angle in the record ``want``."""
  angles = [a for row in want["clients"] for a in np.ravel(row.get(
      "angles", []))]
  return RTOL / float(np.min(np.sin(angles))) if angles else ATOL


def _assert_close(got, want, where, angle_atol):
  assert set(got) >= set(want), (where, sorted(set(want) - set(got)))
  for key, value in want.items():
    np.testing.assert_allclose(
        np.asarray(got[key], np.float64), np.asarray(value, np.float64),
        rtol=RTOL, atol=angle_atol if key in ANGLES else ATOL,
        err_msg=f"{where}[{key!r}]")


@pytest.mark.parametrize("name", RULES)
def test_history_equals_golden(name):
  with open(GOLDEN) as f:
    want = json.load(f)[name]
  got = _history(name)
  angle_atol = _angle_atol(want)
  assert angle_atol < 2e-5, angle_atol  # no angle near 0 or pi
  assert len(got["rows"]) == len(want["rows"])
  for r, (g, w) in enumerate(zip(got["rows"], want["rows"], strict=True)):
    _assert_close(g, w, f"{name} row {r}", angle_atol)
  for r, (g, w) in enumerate(zip(got["clients"], want["clients"],
                                 strict=True)):
    _assert_close(g, w, f"{name} client row {r}", angle_atol)


if __name__ == "__main__":
  jax.config.update("jax_platforms", "cpu")
  os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
  with open(GOLDEN, "w") as f:
    json.dump({name: _history(name) for name in RULES}, f)
  print("wrote", GOLDEN)
