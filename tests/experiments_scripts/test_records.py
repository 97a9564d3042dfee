"""The committed run records (``experiments/records.py``): each says what
data its run read and with which rule arguments, and a record written
after its run is written only when the run's first rounds reproduce; the
paper table of the user guide (``docs/paper-reruns.md``) says what each
RESULTS.md says."""

import json
import os
import re
import shutil

import pytest

from fedjax_agg import experiment
from tests.experiment._util import CONFIG
from tests.experiments_scripts._util import load_script
from tests.experiments_scripts._util import ROOT

RECORDS = load_script("records.py")

# The experiment tests' config (2 rounds, 2 seeds) on the offline MNIST
# subset, with the clients' losses recorded.
TINY = experiment.override(CONFIG, {
    "name": "tiny_record",
    "dataset": {"name": "mnist", "source": "mnist_5k",
                "max_train_examples": 400},
    "partition": {"name": "dirichlet", "num_clients": 4,
                  "args": {"alpha": 0.5}},
    "model.args.hidden": 16, "train.eval_clients": True,
    "algorithms": {"FedAvg": {"aggregator": "fedavg"},
                   "FedAdp": {"aggregator": "fedadp"}}})


def test_the_committed_records_are_found():
  paths = RECORDS.records()
  assert len(paths) >= 50
  assert all(p.endswith("config.json") for p in paths)


@pytest.mark.parametrize("path", RECORDS.records(),
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_every_committed_record_says_its_data_and_rule_arguments(path):
  assert RECORDS.problems(path) == []


def _write(path, record):
  with open(path, "w") as f:
    json.dump(record, f)


def test_problems_names_what_a_record_lacks(tmp_path):
  os.makedirs(tmp_path / "FedAvg")
  path = str(tmp_path / "config.json")
  _write(path, {"algorithms": {"FedAvg": {}, "Gone": {}}})
  found = RECORDS.problems(path)
  assert any("provenance.data" in p for p in found)
  assert any("'Gone' has no results folder" in p for p in found)
  assert any("rule arguments for 'FedAvg'" in p for p in found)
  _write(path, {"algorithms": {"FedAvg": {}}, "provenance": {
      "data": {"source": "auto", "clients_by_seed": {"0": {}}},
      "algorithms": {"FedAvg": {"aggregator_args": {}}}}})
  assert RECORDS.problems(path) == [
      "provenance.data.source is 'auto', not what was read"]
  # ADCT's records keep the provenance in their experiment config.
  _write(path, {"algorithms": {"FedAvg": {}}, "experiment_config": {
      "provenance": {"data": {"source": "files:x",
                              "clients_by_seed": {"0": {}}},
                     "algorithms": {"FedAvg": {"aggregator_args": {}}}}}})
  assert RECORDS.problems(path) == []


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("run"))
  experiment.run_config(TINY, out, progress=False)
  return out


def _without_provenance(src, dst):
  shutil.copytree(src, dst)
  path = os.path.join(dst, "config.json")
  with open(path) as f:
    record = json.load(f)
  record.pop("provenance")
  _write(path, record)
  return path


def test_backfill_writes_the_provenance_its_reruns_confirm(tiny_run,
                                                            tmp_path):
  folder = str(tmp_path / "run")
  path = _without_provenance(tiny_run, folder)
  assert RECORDS.problems(path)
  assert RECORDS.backfill(folder, rounds=2) == 0
  assert RECORDS.problems(path) == []
  with open(path) as f:
    record = json.load(f)
  with open(os.path.join(tiny_run, "config.json")) as f:
    original = json.load(f)
  provenance = record["provenance"]
  assert provenance["data"] == original["provenance"]["data"]
  assert provenance["algorithms"] == original["provenance"]["algorithms"]
  checks = provenance["backfill"]["checks"]
  assert all(c["equal"] for c in checks)
  # Round 0 of both seeds for both algorithms; rounds 1-2 of seed 0.
  seen = {(c["algorithm"], c["seed"], c["round"]) for c in checks}
  assert seen == {(a, s, 0) for a in ("FedAvg", "FedAdp") for s in (0, 1)} | {
      (a, 0, r) for a in ("FedAvg", "FedAdp") for r in (1, 2)}
  assert {c["metric"] for c in checks} == {"test_accuracy", "test_loss",
                                           "client_loss_mean"}


def test_backfill_writes_nothing_for_a_history_it_cannot_reproduce(
    tiny_run, tmp_path, capsys):
  folder = str(tmp_path / "run")
  path = _without_provenance(tiny_run, folder)
  history = os.path.join(folder, "FedAdp", "seed0", "history.json")
  with open(history) as f:
    saved = json.load(f)
  saved["rows"][1]["test_loss"] *= 1.01  # not what this config runs
  _write(history, saved)
  with open(path) as f:
    before = f.read()
  assert RECORDS.backfill(folder, rounds=1) == 1
  assert "MISMATCH" in capsys.readouterr().out
  with open(path) as f:
    assert f.read() == before


# The paper table, moved from the README into the user guide; its links
# are relative to docs/.
PAPER_TABLE = os.path.join("docs", "paper-reruns.md")


def _paper_rows() -> list[tuple[str, list[str]]]:
  """(RESULTS.md path from the repository root, [what ran, finding]) of
  each row of the paper table (``PAPER_TABLE``)."""
  with open(os.path.join(ROOT, PAPER_TABLE)) as f:
    text = f.read()
  section = text[text.index("# Paper re-runs"):]
  rows = []
  for line in section.splitlines():
    found = re.search(r"\]\(\.\./(experiments/[^)]+/RESULTS\.md)\)", line)
    if line.startswith("| ") and found:
      cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
      rows.append((found.group(1), cells[1:]))
  return rows


def test_the_paper_table_lists_every_paper_rerun():
  listed = {path for path, _ in PAPER_ROWS}
  assert len(listed) == len(PAPER_ROWS) >= 8
  for path in listed:
    assert os.path.exists(os.path.join(ROOT, path)), path


PAPER_ROWS = _paper_rows()


@pytest.mark.parametrize("path,cells", PAPER_ROWS,
                         ids=[p for p, _ in PAPER_ROWS])
def test_paper_table_row_equals_the_one_in_its_results(path, cells):
  with open(os.path.join(ROOT, path)) as f:
    text = f.read()
  heading = "## In the README's paper table"
  assert heading in text, path
  section = text[text.index(heading):]
  rows = [[c.strip() for c in line.strip().strip("|").split(" | ")]
          for line in section.splitlines() if line.startswith("| ")]
  assert rows[2:] == [cells], (path, rows[2:], cells)
