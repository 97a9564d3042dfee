"""The verdict tables of the paper re-runs, regenerated from their histories.

Every ``experiments/<paper>/RESULTS.md`` opens with a ``## Verdict`` table
(claim | paper | ours | verdict | most likely reason). The "ours" column
holds only numbers computed from the committed histories under
``experiments/<paper>/results/``: each paper's ``summarize.py`` rebuilds
every "ours" cell from them, and ``tests/experiments_scripts`` requires the
rebuilt cells to equal the committed ones, so a number in a verdict table
cannot drift from the runs it describes.

  python experiments/fedlap/summarize.py           # print the cells
  python experiments/fedlap/summarize.py --check  # exit 1 on a difference
  python experiments/fedlap/summarize.py --write   # rewrite RESULTS.md's cells

This module holds what the scripts share: reading a run's histories
(``runs``), the formatting of the tables (``pm``: mean ± population sd
over seeds; ``signed``), and reading and rewriting the "ours" column.
"""

import argparse
import csv
import glob
import json
import os
import re
import sys
from typing import Callable, Sequence

import numpy as np

MINUS = "\u2212"  # the tables' minus sign
OURS = 2  # the "ours" column's index in a verdict table
_SEED = re.compile(r"seed(\d+)$")


def paper_files(folder: str) -> tuple[str, str]:
  """A paper folder's (results folder, RESULTS.md)."""
  return os.path.join(folder, "results"), os.path.join(folder, "RESULTS.md")


def _float(text: str) -> float:
  if text in ("", "None", "nan"):
    return float("nan")
  try:
    return float(text)
  except ValueError:
    return float("nan")


def read_history(path: str) -> dict:
  """One ``history.csv`` as column -> [rounds + 1] float array (row 0 the
  initial model; empty cells NaN)."""
  with open(path, newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  if not rows:
    raise ValueError(f"{path} holds no rounds")
  return {name: np.array([_float(r[name]) for r in rows])
          for name in rows[0]}


def runs(results: str, algorithm: str) -> list:
  """Every seed's history of ``algorithm`` in the results folder
  ``results`` (``<results>/<algorithm>/seed<k>/history.csv``, or
  ``<results>/<algorithm>/history.csv`` for a one-seed run; the same in
  ``<results>`` itself for a run of one algorithm), seed order."""
  folder = os.path.join(results, algorithm)
  if not os.path.isdir(folder):  # a run of this one algorithm writes at
    folder = results             # the top of its folder
  single = os.path.join(folder, "history.csv")
  if os.path.exists(single):
    return [read_history(single)]
  seeds = []
  for path in glob.glob(os.path.join(folder, "seed*")):
    match = _SEED.search(path)
    if match and os.path.exists(os.path.join(path, "history.csv")):
      seeds.append((int(match.group(1)), path))
  if not seeds:
    raise FileNotFoundError(f"no history of {algorithm!r} under {results}")
  return [read_history(os.path.join(p, "history.csv"))
          for _, p in sorted(seeds)]


def column(results: str, algorithm: str, name: str = "test_accuracy"
           ) -> np.ndarray:
  """[seeds, rounds + 1]: column ``name`` of every seed's run."""
  return np.stack([h[name] for h in runs(results, algorithm)])


def reader(results: str) -> Callable[..., np.ndarray]:
  """``curves(run, algorithm, name="test_accuracy")``: ``column`` of the
  run folder ``run`` under the results folder ``results``."""

  def curves(run: str, algorithm: str, name: str = "test_accuracy"
             ) -> np.ndarray:
    return column(os.path.join(results, run), algorithm, name)

  return curves


def window(curves: np.ndarray, first: int, last: int) -> np.ndarray:
  """Per seed: the mean of ``curves`` [seeds, rounds + 1] over rounds
  ``first``..``last`` (empty cells left out)."""
  return np.nanmean(np.asarray(curves)[:, first:last + 1], axis=1)


def rounds_to(curves: np.ndarray, target: float) -> list:
  """Per seed: ``first_round`` of each row of ``curves`` (None if none)."""
  return [first_round(c, target) for c in curves]


def load_json(path: str):
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def fixed(value: float, digits: int = 1) -> str:
  """``value`` with ``digits`` decimals, the tables' minus sign."""
  text = f"{value:.{digits}f}"
  return text.replace("-", MINUS) if text.startswith("-") else text


def signed(value: float, digits: int = 1) -> str:
  """``value`` with its sign always written (+0.7, −1.2)."""
  text = f"{value:+.{digits}f}"
  return text.replace("-", MINUS)


def pm(values, digits: int = 1, scale: float = 100.0) -> str:
  """"mean ± sd" of ``values`` over seeds (population sd, ddof 0), scaled
  (accuracies as percent by default)."""
  values = np.asarray(values, np.float64) * scale
  if values.ndim != 1 or not values.size:
    raise ValueError(f"pm takes one value per seed, got shape "
                     f"{values.shape}")
  return f"{fixed(np.mean(values), digits)} ± {fixed(np.std(values), digits)}"


def per_seed(values, digits: int = 1, scale: float = 100.0,
             sep: str = ", ") -> str:
  return sep.join(fixed(v * scale, digits) for v in values)


def first_round(curve: np.ndarray, target: float):
  """The first round whose value reaches ``target`` (None if none)."""
  hits = np.nonzero(np.asarray(curve)[1:] >= target)[0]
  return int(hits[0]) + 1 if hits.size else None


def _table_lines(text: str) -> tuple:
  """(first, last + 1) line indices of the verdict table's body rows."""
  lines = text.split("\n")
  try:
    start = next(i for i, line in enumerate(lines)
                 if line.strip() == "## Verdict")
  except StopIteration:
    raise ValueError("no '## Verdict' section") from None
  header = next(i for i in range(start, len(lines))
                if lines[i].startswith("|"))
  first = header + 2  # after the header and its |---| line
  last = first
  while last < len(lines) and lines[last].startswith("|"):
    last += 1
  return first, last


def split_row(line: str) -> list:
  """A markdown table row's cells (``\\|`` inside a cell is kept)."""
  cells = re.split(r"(?<!\\)\|", line.strip())
  return [c.strip() for c in cells[1:-1]]


def ours_cells(text: str) -> list:
  """The verdict table's "ours" cells, row order."""
  lines = text.split("\n")
  first, last = _table_lines(text)
  return [split_row(line)[OURS] for line in lines[first:last]]


def replace_ours(text: str, cells: Sequence[str]) -> str:
  """``text`` with the verdict table's "ours" cells replaced by ``cells``
  (as many as the table has rows)."""
  lines = text.split("\n")
  first, last = _table_lines(text)
  if len(cells) != last - first:
    raise ValueError(f"the verdict table has {last - first} rows, got "
                     f"{len(cells)} cells")
  for i, cell in zip(range(first, last), cells, strict=True):
    row = split_row(lines[i])
    row[OURS] = cell
    lines[i] = "| " + " | ".join(row) + " |"
  return "\n".join(lines)


def differences(text: str, cells: Sequence[str]) -> list:
  """(row, committed, rebuilt) for every "ours" cell that differs."""
  committed = ours_cells(text)
  if len(committed) != len(cells):
    return [(None, f"{len(committed)} rows", f"{len(cells)} cells")]
  return [(i + 1, a, b) for i, (a, b) in
          enumerate(zip(committed, cells, strict=True)) if a != b]


def main(cells: Callable[[], list], results_md: str, argv=None) -> int:
  """The command line of a paper's ``summarize.py``."""
  parser = argparse.ArgumentParser(
      description="Rebuilds the verdict table's 'ours' cells of "
      f"{os.path.relpath(results_md)} from the committed histories.")
  group = parser.add_mutually_exclusive_group()
  group.add_argument("--check", action="store_true",
                     help="exit 1 when RESULTS.md holds other cells")
  group.add_argument("--write", action="store_true",
                     help="write the rebuilt cells into RESULTS.md")
  args = parser.parse_args(argv)
  rebuilt = cells()
  with open(results_md, encoding="utf-8") as f:
    text = f.read()
  if args.write:
    tmp = results_md + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(replace_ours(text, rebuilt))
    os.replace(tmp, results_md)
    print(f"wrote {len(rebuilt)} cells into {os.path.relpath(results_md)}")
    return 0
  for i, cell in enumerate(rebuilt, 1):
    print(f"row {i}: {cell}")
  if args.check:
    diff = differences(text, rebuilt)
    for row, committed, new in diff:
      print(f"row {row} differs:\n  committed: {committed}\n  rebuilt:   "
            f"{new}", file=sys.stderr)
    return 1 if diff else 0
  return 0
