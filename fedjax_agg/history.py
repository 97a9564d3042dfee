"""What a run records: one row of scalars per round, plus per-client arrays.

``History.rows[0]`` is the initial model's evaluation; row r holds round
r's scalars (training loss, the aggregator's scalar metrics, the count of
excluded non-finite clients and, at evaluated rounds, the test metrics).
``History.client_rows[r - 1]`` holds round r's per-client arrays (cohort,
losses, steps, the aggregator's per-client metrics).

Files. ``History.save`` writes ``history.csv`` (rows) and ``history.json``
(config, rows and client rows); both are written to a temporary file and
renamed, and the JSON is strict (NaN and infinities become ``null``).
``HistoryWriter`` is a round callback that rewrites them after every round,
so a run that dies keeps what it computed.
"""

import csv
import dataclasses
import json
import math
import os
import tempfile
from typing import Any, Optional

import jax
import numpy as np

__all__ = ["History", "HistoryWriter", "client_row", "round_scalars",
           "rounds_to_target", "to_json_value", "write_atomic"]


def to_json_value(value: Any) -> Any:
  """``value`` as strict JSON: arrays as lists, NaN/inf as None."""
  if isinstance(value, dict):
    return {str(k): to_json_value(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_json_value(v) for v in value]
  if isinstance(value, (np.ndarray, jax.Array)):
    return to_json_value(np.asarray(value).tolist())
  if isinstance(value, np.generic):
    return to_json_value(value.item())
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if value is None or isinstance(value, (bool, int, str)):
    return value
  return str(value)


def write_atomic(path: str, text: str) -> None:
  """Writes ``text`` to ``path`` via a temporary file and a rename, so a
  reader never sees a half-written file."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-",
                             suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, "w", newline="") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


@dataclasses.dataclass
class History:
  """One row of scalars per round (row 0 = the initial model), plus the
  per-round client-level arrays (cohort, weights, losses)."""
  rows: list[dict]
  client_rows: list[dict]
  config: dict

  def to_dataframe(self):
    import pandas as pd  # pylint: disable=g-import-not-at-top
    return pd.DataFrame(self.rows)

  def column(self, name: str) -> np.ndarray:
    return np.array([np.nan if row.get(name) is None else row[name]
                     for row in self.rows], np.float64)

  def save(self, directory: str, name: str = "history") -> dict[str, str]:
    """Writes ``<name>.csv`` (rows) and ``<name>.json`` (everything)."""
    os.makedirs(directory, exist_ok=True)
    csv_path = os.path.join(directory, f"{name}.csv")
    json_path = os.path.join(directory, f"{name}.json")
    columns = list(dict.fromkeys(k for row in self.rows for k in row))
    lines = _CsvText()
    writer = csv.DictWriter(lines, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(self.rows)
    write_atomic(csv_path, lines.text)
    write_atomic(json_path, json.dumps(to_json_value(
        {"config": self.config, "rows": self.rows,
         "clients": self.client_rows}), allow_nan=False))
    return {"csv": csv_path, "json": json_path}


class _CsvText:
  """A file-like sink for ``csv.writer`` that keeps the text."""

  def __init__(self):
    self.parts = []

  def write(self, text: str) -> None:
    self.parts.append(text)

  @property
  def text(self) -> str:
    return "".join(self.parts)


class HistoryWriter:
  """Round callback that keeps ``<directory>/history.csv|json`` current.

  Args:
    directory: where to write (created).
    config: the run's resolved config, written into ``history.json``.
    every: rewrite every this many rounds (and at the end, via ``close``).
  """

  def __init__(self, directory: str, config: Optional[dict] = None,
               every: int = 1):
    self.directory = directory
    self.config = dict(config or {})
    self.every = every
    self.rows, self.client_rows = [], []

  def __call__(self, row: dict, client: Optional[dict]) -> None:
    self.rows.append(row)
    if client is not None:
      self.client_rows.append(client)
    if row["round"] % self.every == 0:
      self.flush()

  def flush(self) -> None:
    History(self.rows, self.client_rows, self.config).save(self.directory)


def rounds_to_target(history: History, target: float,
                     metric: str = "test_accuracy") -> Optional[int]:
  """First round whose ``metric`` reaches ``target`` (None if never)."""
  for row in history.rows:
    value = row.get(metric)
    if value is not None and not np.isnan(value) and value >= target:
      return int(row["round"])
  return None


def round_scalars(out) -> dict[str, float]:
  """A round's scalar outputs (a ``rounds.RoundOutput`` on the host)."""
  real = np.asarray(out.mask) > 0
  losses_before = np.asarray(out.loss_before)
  losses_after = np.asarray(out.loss_after)
  row = {"train_loss": float(out.train_loss),
         "cohort_loss_before": float(np.mean(losses_before)),
         "cohort_loss_after": float(np.mean(losses_after)),
         "nonfinite_clients": int(np.sum(real & ~np.asarray(out.finite)))}
  for name, value in out.metrics.items():
    if np.ndim(value) == 0:
      row[name] = float(value)
  return row


def client_row(round_num: int, out) -> dict:
  """A round's per-client outputs, as ``History.client_rows`` holds them."""
  return {"round": round_num, "client_ids": np.asarray(out.client_ids),
          "loss_before": np.asarray(out.loss_before),
          "loss_after": np.asarray(out.loss_after),
          "steps_taken": np.asarray(out.steps_taken),
          **{k: np.asarray(v) for k, v in out.metrics.items()
             if np.ndim(v) > 0}}
