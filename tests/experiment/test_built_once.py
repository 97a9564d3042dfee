"""What a run builds or computes once: a 2-round run with a codec builds
its codec once, and its cohort size is computed once by the description
and once by the round plan (not at every check and call site)."""

import collections

from fedjax_agg import cli
from fedjax_agg import compression
from fedjax_agg import rounds
from tests.cli.test_cli import TINY


def test_a_two_round_codec_run_builds_its_codec_and_cohort_once(
    tmp_path, monkeypatch):
  counts = collections.Counter()
  get, num_sampled = compression.get, rounds.num_sampled

  def counted_get(*args, **kwargs):
    counts["codec"] += 1
    return get(*args, **kwargs)

  def counted_num_sampled(*args, **kwargs):
    counts["cohort"] += 1
    return num_sampled(*args, **kwargs)
  monkeypatch.setattr(compression, "get", counted_get)
  monkeypatch.setattr(rounds, "num_sampled", counted_num_sampled)
  argv = [("2" if flag == "1" and TINY[i - 1] == "--rounds" else flag)
          for i, flag in enumerate(TINY)]
  assert cli.main(argv + ["--codec", "uniform", "--out",
                          str(tmp_path / "run")]) == 0
  assert counts["codec"] == 1, counts
  # Once by the description (spec.Experiment.cohort_size), once by the
  # round plan (runner.Plan.cohort_size).
  assert counts["cohort"] == 2, counts
