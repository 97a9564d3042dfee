"""Argument checks and the CSV table reader shared by the systems modules.

Every check raises ``TypeError`` for a value of the wrong kind and
``ValueError`` for a value out of range, naming the argument (or the file,
line and column for a CSV table) and what was expected.
"""

import csv
import math
import os
from typing import NamedTuple, Sequence

import numpy as np

from fedjax_agg import checks

__all__ = ["Table", "as_client_ids", "as_times", "check_num_clients",
    "check_seed", "check_table_ids", "per_client", "read_table"]


def check_num_clients(num_clients) -> None:
  """N: a Python/numpy int >= 1."""
  checks.check_int("num_clients", num_clients, 1)


def check_seed(seed) -> None:
  """Seeds are ints >= 0 (``np.random.SeedSequence`` entropy)."""
  checks.check_int("seed", seed, 0)


def as_client_ids(name: str, ids, num_clients: int) -> np.ndarray:
  """``ids`` as a [K] int64 array of ids in [0, num_clients).

  Raises:
    TypeError: ``ids`` is not an integer array (an empty list is fine).
    ValueError: ``ids`` is not 1-D or holds an id out of range.
  """
  array = np.asarray(ids)
  if array.ndim != 1:
    raise ValueError(f"{name} must be a [K] vector of client ids, got shape "
                     f"{array.shape}")
  # np.asarray([]) is float64: an empty selection returns before the dtype check
  # would refuse it.
  if array.size == 0:
    return np.zeros((0,), np.int64)
  if array.dtype.kind not in "iu":
    raise TypeError(f"{name} must hold integer client ids, got dtype "
                    f"{array.dtype}")
  bad = (array < 0) | (array >= num_clients)
  if bad.any():
    raise ValueError(f"{name} must hold client ids in [0, {num_clients}), got "
                     f"{array[bad][0]} at position {np.flatnonzero(bad)[0]}")
  return array.astype(np.int64, copy=False)


def as_times(name: str, value, size: int) -> np.ndarray:
  """A time (seconds, finite, >= 0), scalar or [size], as a [size] float64.

  Raises:
    TypeError: ``value`` is not numeric.
    ValueError: wrong shape, NaN, infinite or negative.
  """
  array = per_client(name, value, size, positive=False,
                     what="a time in seconds (a number or a [K] array)")
  return array if array.ndim else np.full((size,), array)


def per_client(name: str, value, num_clients: int, *, positive: bool,
               what: str = "a number or a [num_clients] array"
               ) -> np.ndarray:
  """A scalar or [num_clients] finite number(s), > 0 or >= 0, as float64.

  A scalar stays 0-d (it broadcasts against any [K] selection).
  """
  array = np.asarray(value)
  if array.dtype.kind not in "iuf":
    raise TypeError(f"{name} must be {what}, got {value!r}")
  if array.ndim > 1 or (array.ndim == 1 and array.shape[0] != num_clients):
    raise ValueError(f"{name} must be a scalar or a [{num_clients}] vector, "
                     f"got shape {array.shape}")
  array = array.astype(np.float64)
  bad = ~np.isfinite(array) | ((array <= 0) if positive else (array < 0))
  if bad.any():
    bound = "> 0" if positive else ">= 0"
    raise ValueError(f"{name} must be finite and {bound}, got "
                     f"{array[bad].flat[0]}"
                     + (f" at index {np.flatnonzero(bad)[0]}"
                        if array.ndim else ""))
  return array


class Table(NamedTuple):
  """A parsed CSV table: an integer id column and float value columns."""
  ids: np.ndarray      # [R] int64, the first column
  values: np.ndarray   # [R, C - 1] float64, the other columns (all finite)
  lines: np.ndarray    # [R] int64, each row's line number in the file


def read_table(path, columns: Sequence[str]) -> Table:
  """Reads a CSV file whose header is exactly ``columns``.

  The first column holds integers, the others finite numbers. Blank lines
  are skipped; every other line must have ``len(columns)`` fields.

  Raises:
    ValueError: naming the file, the line and the column, for a wrong
      header, a wrong number of fields, a non-integer id, a non-numeric or
      non-finite value, or a file without data rows.
  """
  where = os.fspath(path)
  ids, values, lines = [], [], []
  with open(path, newline="", encoding="utf-8") as file:
    reader = csv.reader(file)
    header = None
    for row in reader:
      if not row or all(not field.strip() for field in row):
        continue
      if header is None:
        header = [field.strip() for field in row]
        if header != list(columns):
          raise ValueError(f"{where}, line {reader.line_num}: the header must "
                           f"be {','.join(columns)}, got {','.join(header)}")
        continue
      line = reader.line_num
      if len(row) != len(columns):
        raise ValueError(f"{where}, line {line}: expected {len(columns)} "
                         f"fields ({','.join(columns)}), got {len(row)}")
      try:
        ids.append(int(row[0].strip()))
        # Python ints are unbounded; a huge id would overflow the int64 array
        # below instead of being named at its line.
        if abs(ids[-1]) >= 2 ** 62:
          raise ValueError
      except ValueError:
        raise ValueError(f"{where}, line {line}, column {columns[0]}: expected"
                         f" an integer client id, got {row[0]!r}") from None
      parsed = []
      for column, field in zip(columns[1:], row[1:], strict=True):
        try:
          number = float(field.strip())
        except ValueError:
          raise ValueError(f"{where}, line {line}, column {column}: expected "
                           f"a number, got {field!r}") from None
        if not math.isfinite(number):
          raise ValueError(f"{where}, line {line}, column {column}: expected "
                           f"a finite number, got {field!r}")
        parsed.append(number)
      values.append(parsed)
      lines.append(line)
  if header is None:
    raise ValueError(f"{where}: empty file, expected the header "
                     f"{','.join(columns)}")
  return Table(np.asarray(ids, np.int64),
               np.asarray(values, np.float64).reshape(-1, len(columns) - 1),
               np.asarray(lines, np.int64))


def check_table_ids(where: str, table: Table, column: str,
                    num_clients: int) -> None:
  """Raises ValueError at the first row whose id is outside [0, N)."""
  bad = (table.ids < 0) | (table.ids >= num_clients)
  if bad.any():
    row = np.flatnonzero(bad)[0]
    raise ValueError(f"{where}, line {table.lines[row]}, column {column}: "
                     f"unknown client id {table.ids[row]} (num_clients="
                     f"{num_clients}: ids are 0..{num_clients - 1})")
