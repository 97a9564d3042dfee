"""docs/history-columns.md lists exactly the columns runs write.

The page's tables are read back: its client-row table (section "Client
rows") and every other table (history columns). What they must list is
found, not copied:

* every metric of every registered rule and client side, from
  ``jax.eval_shape`` of one round on a small cohort (a ``[]`` metric is a
  column, any other a client-row array);
* every column and client-row key of six small runs that add the run's
  own columns (per-client losses and client evaluations, privacy
  accounting, a simulated clock with a codec and secure aggregation,
  FedBuff, a backdoor attack, personalised evaluation).

The page must list each of them in the table of its kind and nothing
else; a column it calls cumulative must never decrease in these runs.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import experiment
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import partitions
from fedjax_agg import validation
from fedjax_agg.config import LocalTraining
from fedjax_agg.models import lora
from tests import agg_testutil as tu
from tests._docs_util import ROOT
from tests.lora import _util as lora_util

DOC = ROOT / "docs" / "history-columns.md"
_ROW = re.compile(r"^\| `([A-Za-z_0-9]+)` \|([^|]*)\|([^|]*)\|", re.M)
# The model options whose adapters each LoRA rule takes.
_ADAPTER_KINDS = {"fedit": {}, "ffa_lora": {"freeze_a": True},
                  "flora": {"merged": True}, "hetlora": {}}


def documented():
  """-> ({column: its Kind cell}, {client-row key}) as the page lists
  them."""
  text = DOC.read_text("utf8")
  columns_part, _, client_part = text.partition("\n## Client rows\n")
  columns = {}
  for name, _, kind in _ROW.findall(columns_part):
    assert name not in columns, f"{name} is listed twice"
    columns[name] = kind.strip()
  keys = [name for name, _, _ in _ROW.findall(client_part)]
  assert len(keys) == len(set(keys)), "a client-row key is listed twice"
  return columns, set(keys)


def _split(metrics):
  """Metric shapes -> (column names, client-row names)."""
  scalars = {name for name, shape in metrics.items() if shape == ()}
  return scalars, set(metrics) - scalars


@functools.cache
def rule_metrics():
  """Every registered rule's metric shapes, from one traced round."""
  found = {}
  for name in sorted(aggregators.REGISTRY):
    rule = tu.build(name)
    if name in _ADAPTER_KINDS:
      global_params, client_params, info = lora_util.cohort(
          lora_util.lora_mlp(rank=2, **_ADAPTER_KINDS[name])[2], 4)
    else:
      rng = np.random.default_rng(0)
      global_params = tu.make_params(rng)
      client_params = tu.make_clients(rng, global_params, 4)
      info = tu.make_info([3, 0, 6, 2], [10.0, 3.0, 25.0, 7.0])
    _, _, metrics = jax.eval_shape(rule.aggregate, global_params,
                                   client_params, info,
                                   rule.init(global_params))
    found[name] = {k: tuple(v.shape) for k, v in metrics.items()}
  return found


def _tiny_federation(num_clients=4):
  rng = np.random.default_rng(0)
  x = rng.random((80, 28, 28, 1), dtype=np.float32)
  y = rng.integers(0, 10, 80)
  data = federated.from_partition(x, y, partitions.iid(
      y, num_clients=num_clients, seed=0))
  train, held = validation.holdout_split(data, 0.25, seed=0)
  return train.with_validation(held)


def _update_metrics(update, model, data):
  ids, mask = jnp.array([0, 2]), jnp.ones(2)
  state = update.init(data.num_clients)
  global_params = model.init(jax.random.key(0))
  _, _, metrics = jax.eval_shape(
      update.update, state, global_params, data, ids, mask,
      jnp.full(2, 0.1), jnp.full(2, 100), jnp.int32(1), jax.random.key(1))
  return {k: tuple(v.shape) for k, v in metrics.items()}


@functools.cache
def client_side_metrics():
  """Every registered client side's (and ADCT's) metric shapes, from one
  traced round."""
  data = _tiny_federation()
  model = models.get("mlp2", hidden=8)
  training = LocalTraining(batch_size=10)
  found = {}
  for name in sorted(clients.REGISTRY):
    if name == "lora_ranks":
      base = models.get("mlp2", hidden=8)
      adapted = lora.lora(base, base.init(jax.random.key(0)), rank=2,
                          key=jax.random.key(1))
      update = clients.lora_ranks(adapted, [1, 2, 1, 2], training)
      found[name] = _update_metrics(update, adapted, data)
      continue
    net = models.get("mlp2", hidden=8, batch_norm=True) if (
        name == "fedbn") else model
    found[name] = _update_metrics(
        clients.REGISTRY.build(name, model=net, training=training), net,
        data)
  tuner = clients.adct(model, grid=((0.1, 1), (0.05, 1)), batch_size=10)
  found["adct"] = _update_metrics(clients.adct_update(tuner), model, data)
  return found


_BASE = {"name": "columns",
         "dataset": {"name": "mnist", "source": "mnist_5k"},
         "partition": {"name": "iid", "num_clients": 4},
         "model": {"name": "mlp2", "args": {"hidden": 16}},
         "train": {"rounds": 3, "participation": 0.5, "batch_size": 50,
                   "learning_rate": 0.05},
         "seeds": [0]}
_PERSONAL = tuple(f"{kind}_accuracy_{stat}"
                  for kind in ("global", "personal", "finetuned")
                  for stat in ("mean", "std", "p10"))
# name -> (its config's own sections, the columns and the client-row keys
# it must write besides the rule's and the client side's metrics).
RUNS = {
    "losses": ({"algorithms": {"A": {"aggregator": "fedavg"}},
                "train": {**_BASE["train"], "compute_losses": True,
                          "eval_clients": True}},
               ("round", "time_s", "train_loss", "nonfinite_clients",
                "test_loss", "test_accuracy", "test_macro_f1",
                "client_loss_mean", "client_loss_var", "cohort_loss_before",
                "cohort_loss_after"),
               ("round", "client_ids", "steps_taken", "loss_before",
                "loss_after")),
    "privacy": ({"algorithms": {"A": {"aggregator": "dp_fedavg",
                                      "aggregator_args": {
                                          "noise_multiplier": 1.0,
                                          "clip_norm": 1.0}}},
                 "privacy": {"sampling": "poisson"}},
                ("epsilon",), ("mask",)),
    "systems": ({"algorithms": {"A": {"aggregator": "fedavg"}},
                 "systems": {"profiles": "lognormal", "codec": "uniform",
                             "codec_args": {"bits": 8},
                             "deadline_s": 100.0, "secagg_bits": 24}},
                ("sim_time_s", "uplink_bytes", "downlink_bytes", "dropped",
                 "compression_error", "secagg_clipped",
                 "secagg_update_clipped", "secagg_overflow"), ()),
    "fedbuff": ({"algorithms": {"A": {"aggregator": "fedavg"}},
                 "systems": {"profiles": "lognormal", "concurrency": 3}},
                ("stale", "staleness_mean", "staleness_max"),
                ("start_version", "staleness")),
    "backdoor": ({"algorithms": {"A": {"aggregator": "norm_bounding"}},
                  "attack": {"name": "backdoor", "fraction": 0.5}},
                 ("num_malicious", "attack_success"), ("malicious",)),
    "personal": ({"algorithms": {"A": {"aggregator": "fedavg",
                                       "client": "ditto"}},
                  "partition": {**_BASE["partition"],
                                "holdout_fraction": 0.2},
                  "train": {**_BASE["train"], "personalized": True,
                            "finetune_steps": 2}},
                 _PERSONAL, ()),
    # A language model (per-token targets): its perplexity.
    "language_model": ({"algorithms": {"A": {"aggregator": "fedavg"}},
                        "dataset": {"name": "shakespeare", "args": {
                            "min_samples": 2000, "sequence_length": 20}},
                        "partition": {"name": "natural", "num_clients": 4},
                        "model": {"name": "char_lstm", "args": {
                            "embed_dim": 4, "hidden": 8}},
                        "train": {**_BASE["train"], "rounds": 1,
                                  "batch_size": 32, "eval_clients": False}},
                       ("test_perplexity",), ()),
}


def _run(name):
  """-> (rows, client rows) of run ``name``."""
  config = {**_BASE, **RUNS[name][0]}
  result = experiment.run_algorithm(config, "A", seed=0)
  return result.history.rows, result.history.client_rows


def _assert_listed(metrics_by_name):
  """Each component's metrics are in the table of their kind."""
  columns, keys = documented()
  for name, metrics in metrics_by_name.items():
    scalars, arrays = _split(metrics)
    assert scalars <= set(columns), (name, sorted(scalars - set(columns)))
    assert arrays <= keys, (name, sorted(arrays - keys))


def test_the_page_lists_every_rules_metric_in_the_table_of_its_kind():
  _assert_listed(rule_metrics())


def test_the_page_lists_every_client_sides_metric_in_the_table_of_its_kind():
  _assert_listed(client_side_metrics())


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_page_lists_every_column_a_run_writes(name):
  columns, keys = documented()
  rows, client_rows = _run(name)
  written = {column for row in rows for column in row}
  assert written <= set(columns), sorted(written - set(columns))
  written_keys = {key for row in client_rows for key in row}
  assert written_keys <= keys, sorted(written_keys - keys)
  _, own_columns, own_keys = RUNS[name]
  assert set(own_columns) <= written, sorted(set(own_columns) - written)
  assert set(own_keys) <= written_keys, sorted(set(own_keys) -
                                               written_keys)
  for column in written:
    if columns[column] == "cumulative":
      values = [row[column] for row in rows if row.get(column) is not None]
      assert values == sorted(values), (column, values)


def test_the_page_lists_nothing_no_run_writes():
  columns, keys = documented()
  found_columns, found_keys = set(), set()
  for metrics in [*rule_metrics().values(),
                  *client_side_metrics().values()]:
    scalars, arrays = _split(metrics)
    found_columns |= scalars
    found_keys |= arrays
  for _, own_columns, own_keys in RUNS.values():
    found_columns |= set(own_columns)
    found_keys |= set(own_keys)
  assert set(columns) == found_columns, (
      sorted(set(columns) - found_columns), sorted(found_columns -
                                                  set(columns)))
  assert keys == found_keys, (sorted(keys - found_keys),
                              sorted(found_keys - keys))
