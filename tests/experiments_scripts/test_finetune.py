"""``experiments/fine_tuning/finetune.py``'s and ``seeds.py``'s own parts,
without training: the IID federation deals the natural one's rows to
clients of the same sizes, the seeds' summary is over the members, and
the tables are what the summaries and the histories say."""

import json

import jax
import numpy as np
import pytest

from fedjax_agg import clients
from fedjax_agg import history as history_lib
from fedjax_agg import rounds
from fedjax_agg.models import lora
from fedjax_agg import runner
from fedjax_agg.data import NaturalFederation
from tests.experiments_scripts._util import load_script
from tests.lora import _util


@pytest.fixture(scope="module")
def finetune():
  return load_script("fine_tuning", "finetune.py")


def test_the_iid_federation_deals_the_same_rows_to_clients_of_the_same_sizes(
    finetune):
  rng = np.random.default_rng(0)
  x = rng.integers(0, 80, size=(30, 5)).astype(np.int32)
  clients = (np.arange(0, 4), np.arange(4, 5), np.arange(5, 30))
  fed = NaturalFederation("toy", x, x, clients, x[:3], x[:3],
                          (np.arange(3),) * 3, ("a", "b", "c"), 80, (5,),
                          "sequence", {})
  both = finetune.federations(fed, seed=0)
  natural, iid = both["natural"], both["iid"]
  np.testing.assert_array_equal(natural.num_examples, [4, 1, 25])
  np.testing.assert_array_equal(iid.num_examples, [4, 1, 25])
  dealt = np.concatenate([np.asarray(iid.client_indices[k][
      :int(iid.num_examples[k])]) for k in range(3)])
  assert sorted(dealt.tolist()) == list(range(30))  # every row once
  assert dealt.tolist() != list(range(30))  # and not in the roles' order


def test_the_table_is_the_summary_and_the_histories(finetune, tmp_path):
  rows = [{"round": 0, "test_loss": 1.7},
          {"round": 1, "test_loss": 1.6, "inexact_aggregation": 0.02,
           "inexact_aggregation_of_update": 0.05},
          {"round": 2, "test_loss": 1.5, "inexact_aggregation": 0.04,
           "inexact_aggregation_of_update": 0.15}]
  history_lib.save_run(str(tmp_path / "natural" / "fedit-2"),
                       {"run": history_lib.History(rows, [], {})})
  history_lib.save_run(str(tmp_path / "natural" / "full"), {
      "run": history_lib.History([{"round": 0, "test_loss": 1.7}], [], {})})
  entry = {"final_perplexity": float(np.exp(1.5)),
           "initial_perplexity": float(np.exp(1.7)),
           "final_accuracy": 0.5, "uplink_bytes_per_client": 18432,
           "trainable_params": 4608, "median_round_s": 0.95}
  (tmp_path / "summary.json").write_text(json.dumps({"runs": {
      "natural/fedit-2": entry, "natural/full": {
          **entry, "trainable_params": 115536}}}))
  table = finetune.results_table(str(tmp_path)).splitlines()
  # FedIT's gap: over the product, mean of the rounds; over the round's
  # update, mean (max).
  assert table[2] == ("| natural | fedit-2 | 4,608 | 18,432 B | 5.474 -> "
                      "4.482 | 0.5000 | 0.0300 | 0.1000 (0.1500) | 0.95 |")
  assert table[3].startswith("| natural | full | 115,536 |")
  assert table[3].endswith("| 0.5000 |  |  | 0.95 |")
  assert (tmp_path / "table.md").read_text().splitlines() == table


def test_a_rerun_of_some_methods_extends_a_summary_of_the_same_settings(
    finetune, tmp_path):
  settings = {"rounds": 20, "lr": 3.0, "memory": "10,100", "only": ""}
  path = tmp_path / "summary.json"
  path.write_text(json.dumps({"settings": settings, "runs": {"a": {}}}))
  # What runs (--only, --memory, --table-only) may change ...
  again = {**settings, "memory": "", "only": "fedit-8", "table_only": False}
  assert finetune.earlier_summary(str(path), again)["runs"] == {"a": {}}
  # ... how it runs may not.
  with pytest.raises(SystemExit, match="other settings"):
    finetune.earlier_summary(str(path), {**again, "lr": 1.0})


def test_a_config_runs_the_scripts_fedit_on_the_committed_base(finetune):
  # The script builds its runs in Python; the same run described as a
  # config (model.base, model.adapters) trains the same adapters.
  import argparse  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_agg import data as data_lib  # pylint: disable=g-import-not-at-top
  from fedjax_agg import experiment  # pylint: disable=g-import-not-at-top
  pretrain = load_script("fine_tuning", "pretrain.py")
  folder = os.path.join(os.path.dirname(finetune.__file__), "base")
  base = pretrain.load_base(folder)
  plays = ["macbeth"]
  fed = data_lib.shakespeare(plays=plays,
                             exclude_plays=pretrain.HELD_OUT_PLAYS)
  natural = finetune.federations(fed, 0)["natural"]
  args = argparse.Namespace(rounds=2, clients_per_round=3, batch_size=16,
                            lr=3.0, lr_full=0.05, seed=0)
  model, rule, init = finetune.methods(base, [2], jax.random.key(0))[
      "fedit-2"]
  test = (fed.test_x[:16], fed.test_y[:16])
  _, by_script = finetune.run_one(model, rule, init, natural, test, args)
  config = {
      "dataset": {"name": "shakespeare",
                  "args": {"plays": plays,
                           "exclude_plays": list(pretrain.HELD_OUT_PLAYS)}},
      "partition": {"name": "natural", "num_clients": natural.num_clients},
      "model": {"name": "transformer_lm", "args": base.record["model_args"],
                "base": folder,
                "adapters": {"rank": 2, "targets": "transformer"}},
      "train": {"rounds": 2, "participation": 3 / natural.num_clients,
                "batch_size": 16, "learning_rate": 3.0,
                "eval_clients": False, "eval_every": 2},
      "algorithms": {"FedIT": {"aggregator": "fedit"}}, "seeds": [0]}
  by_config = experiment.run_algorithm(config, "FedIT", 0).state.params
  for got, want in zip(jax.tree.leaves(by_config),
                       jax.tree.leaves(by_script), strict=True):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_seeds_summary_is_over_the_members_and_the_table_reads_it(
    tmp_path):
  # ``seeds.py``'s parts, without training: one method's members (two
  # seeds, DP on FedIT's adapters) summarised, then tabled.
  seeds = load_script("fine_tuning", "seeds.py")
  _, _, model = _util.lora_mlp(rank=2)
  params = model.init(jax.random.key(0))
  members = []
  for seed, (loss, accuracy, epsilon) in enumerate(((1.5, 0.5, 3.0),
                                                    (1.7, 0.4, 3.0))):
    rows = [{"round": 0, "test_loss": 2.0, "time_s": 0.0},
            {"round": 1, "test_loss": 1.8, "time_s": 9.0},
            {"round": 2, "test_loss": loss, "test_accuracy": accuracy,
             "epsilon": epsilon, "clip_norm": 0.5, "time_s": 0.25}]
    members.append(runner.Member({}, seed, history_lib.History(rows, [], {}),
                                 rounds.ServerState(params, (), 2, None, ())))
  entry = seeds.summarise("dp_fedit-2", members, seconds=12.34)
  np.testing.assert_allclose(entry["final_perplexity"],
                             [np.exp(1.5), np.exp(1.7)])
  np.testing.assert_allclose(entry["perplexity"]["mean"],
                             (np.exp(1.5) + np.exp(1.7)) / 2)
  np.testing.assert_allclose(entry["accuracy"]["sd"],
                             np.std([0.5, 0.4], ddof=1))
  assert entry["seeds"] == [0, 1] and entry["epsilon"] == [3.0, 3.0]
  assert entry["final_clip_norm"] == [0.5, 0.5]
  # The adapters' A and B of both layers of the MLP, in float32: what
  # FedIT sends with or without DP.
  assert entry["uplink_bytes_per_client"] == lora.uplink_bytes(params)
  assert entry["median_round_s"] == 0.25  # the compiling round left out
  assert entry["initial_perplexity"] == pytest.approx(np.exp(2.0))
  (tmp_path / "summary.json").write_text(json.dumps({
      "settings": {}, "runs": {"dp_fedit-2": entry}}))
  table = seeds.results_table(str(tmp_path)).splitlines()
  assert table[2] == (
      f"| dp_fedit-2 | 2 | {lora.uplink_bytes(params):,} B | "
      f"{entry['perplexity']['mean']:.3f} ± "
      f"{entry['perplexity']['sd']:.3f} | 0.4500 ± 0.0707 | 3 |  | 0.25 |")
  assert (tmp_path / "table.md").read_text().splitlines() == table
  # Clipping: the share of the participants clipped, over every round of
  # every member; members run apart (FFA-LoRA's seeds): the round time
  # is the sum of their medians.
  clipping = [m._replace(history=history_lib.History(
      [{**row, "fraction_clipped": clipped[i]} if i else row
       for i, row in enumerate(m.history.rows)], [], {}))
              for m, clipped in zip(members, ((None, 0.2, 0.6),
                                              (None, 0.5, 0.9)),
                                    strict=True)]
  clip = seeds.summarise("clip_ffa_lora-2", clipping, 1.0, apart=True)
  assert clip["fraction_clipped"]["mean"] == pytest.approx(0.55)
  assert clip["fraction_clipped"]["min"] == pytest.approx(0.2)
  assert clip["fraction_clipped"]["max"] == pytest.approx(0.9)
  assert clip["median_round_s"] == 0.5 and clip["seeds_run_apart"]
  (tmp_path / "summary.json").write_text(json.dumps({
      "settings": {}, "runs": {"clip_ffa_lora-2": clip}}))
  assert seeds.results_table(str(tmp_path)).splitlines()[2].endswith(
      "| 3 | 55% (20%-90%) | 0.50 (seeds apart) |")
  # HetLoRA: a client of rank r_k sends r_k / r of the rank-r adapters;
  # the uplink is the mean over the federation's clients.
  het = seeds.summarise("hetlora-2", members, 1.0, client_ranks=[1, 2, 2])
  full = lora.uplink_bytes(params)
  assert het["uplink_bytes_at_rank_r"] == full
  assert het["uplink_bytes_per_client"] == round(full * (5 / 3) / 2)
  assert het["client_ranks"] == {"1": 1, "2": 2}
  assert "final_client_ranks" not in het  # these members keep no ranks
  # Self-pruning: the ranks the clients ended with, from every member's
  # client state (``clients.LoRARanksState``), over all members.
  # The participants' ranks as sent, round by round; a padding row (mask
  # 0) sent nothing.
  sent = ({"client_ranks": [2, 1], "mask": [1.0, 1.0]},
          {"client_ranks": [1, 2], "mask": [1.0, 0.0]})
  pruned = [m._replace(
      state=m.state._replace(client_state=clients.LoRARanksState(
          np.asarray(ranks, np.int32))),
      history=history_lib.History(m.history.rows, [row], {}))
            for m, ranks, row in zip(members, ([1, 2, 1], [1, 1, 2]), sent,
                                     strict=True)]
  het = seeds.summarise("hetlora_pruned-2", pruned, 1.0,
                        client_ranks=[1, 2, 2])
  assert het["client_ranks"] == {"1": 1, "2": 2}
  assert het["final_client_ranks"] == {"1": 4, "2": 2}
  assert het["final_mean_rank"] == pytest.approx(8 / 6)
  assert het["mean_sent_rank"] == pytest.approx(4 / 3)  # 2, 1 and 1


def test_ffa_lora_draws_a_per_seed_and_dp_has_its_two_controls(finetune):
  import argparse  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from fedjax_agg.config import LocalTraining  # pylint: disable=g-import-not-at-top
  seeds = load_script("fine_tuning", "seeds.py")
  pretrain = load_script("fine_tuning", "pretrain.py")
  base = pretrain.load_base(os.path.join(os.path.dirname(finetune.__file__),
                                         "base"))
  args = argparse.Namespace(seed=0, gamma=0.5, pruning_strength=1e-3,
                            noise=0.05, delta=1e-4, clip=1.0)
  every = seeds.methods(base, 2, 9, LocalTraining(), args)
  frozen = lambda model: lora.spec(model).frozen_a
  single_run = frozen(finetune.methods(base, [2], jax.random.key(0))[
      "ffa_lora-2"][0])
  for name in ("ffa_lora-2", "uniform_ffa_lora-2", "clip_ffa_lora-2",
               "dp_ffa_lora-2"):
    # Seed 0's A is the one-seed run's; another seed draws another.
    by_seed = every[name].seed_model
    jax.tree.map(np.testing.assert_array_equal, frozen(by_seed(0)),
                 single_run)
    for path in single_run:
      assert not np.allclose(frozen(by_seed(1))[path], single_run[path])
  for name in ("fedit-2", "uniform_fedit-2", "clip_fedit-2", "dp_fedit-2"):
    assert every[name].seed_model is None  # A is drawn by model.init
  # The controls: clipping without noise and no privacy; then DP.
  for rule in ("fedit", "ffa_lora"):
    assert every[f"clip_{rule}-2"].rule.noise_multiplier == 0.0
    assert "privacy" not in every[f"clip_{rule}-2"].fields
    assert every[f"dp_{rule}-2"].rule.noise_multiplier == 0.05
    assert "privacy" in every[f"dp_{rule}-2"].fields
    assert not every[f"uniform_{rule}-2"].fields
  # Equal weights, as DP-FedAvg's, whatever the clients' examples.
  for rule, options in (("fedit", {}), ("ffa_lora", {"freeze_a": True})):
    _, _, model = _util.lora_mlp(rank=2, **options)
    global_params, clients, info = _util.cohort(model, 4, seed=0)
    weights = every[f"uniform_{rule}-2"].rule.aggregate(
        global_params, clients, info, ())[2]["client_weights"]
    np.testing.assert_allclose(weights, [0.25] * 4)


def test_a_cohorts_call_is_measured_and_the_memory_fitted_per_client():
  import os  # pylint: disable=g-import-not-at-top
  rss = load_script("fine_tuning", "cohort_rss.py")
  base = os.path.join(os.path.dirname(rss.__file__), "base")
  record = rss.measure(base, "fedit-8", 2, 4, plays=["macbeth"])
  assert record["method"] == "fedit-8" and record["clients"] == 2
  assert record["finite"]
  assert record["peak"] >= record["resident_before"] > 0
  assert record["call_bytes"] == record["peak"] - record["resident_before"]
  assert record["xla_temp_bytes"] > 0 and record["xla_output_bytes"] > 0
  # The line through exact points, and the cohort it allows.
  records = [{"method": "m", "clients": w, "call_bytes": 5e6 + 3e6 * w,
              "resident_before": 10**9, "xla_temp_bytes": 0,
              "compile_s": 1.0, "call_s": 2.0} for w in (10, 20, 40)]
  fitted = rss.fit(records, 2**31)
  np.testing.assert_allclose(fitted["per_client_bytes"], 3e6, rtol=1e-9)
  np.testing.assert_allclose(fitted["fixed_bytes"], 5e6, rtol=1e-6)
  assert fitted["largest_cohort"] == (2**31 - 10**9 - 5 * 10**6) // (
      3 * 10**6)
  table = rss.table({"runs": records, "fits": {"m": fitted},
                     "settings": {"budget_gib": 2.0}})
  assert "| m | 40 | 119 MiB | 0 MiB | 1.0 | 2.0 |" in table
  assert f"largest cohort in 2.0 GiB: {fitted['largest_cohort']:,}" in table
  fitted["confirm"] = {"clients": 342, "exit_status": -9, "record": None}
  table = rss.table({"runs": records, "fits": {"m": fitted},
                     "settings": {"budget_gib": 2.0}})
  assert "m: 342 clients in one call failed (exit status -9)" in table
  assert rss.mem_total_bytes() > 2**20
