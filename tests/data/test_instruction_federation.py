"""``instruction_federation`` and ``split_records`` against independent
computations: the loss mask covers exactly the response tokens (checked
under ``jax.jit`` through the library's sequence loss), truncation counts,
packing, the IID, category and Dirichlet splits (the numpy draw redone
here), and one round of the engine on the task."""

import collections
import json

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import data
from fedjax_agg import models
from fedjax_agg import simulation
from fedjax_agg import types
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import PAD_TARGET
from tests.data import _instruction_util

TEMPLATE = _instruction_util.TEMPLATE
CLASSIFY = {"What is": "arithmetic", "Reverse": "reverse",
            "Capitalise": "capitalise", "How many": "count", "Sort": "sort"}


def _records(num=120):
  return list(_instruction_util.records(num))


def _build(records=None, **kwargs):
  kwargs = {"sequence_length": 100, "split": "iid", "num_clients": 1,
            "test_fraction": 0.0, "template": TEMPLATE, **kwargs}
  return data.instruction_federation(
      _records() if records is None else records,
      _instruction_util.tokenizer(), **kwargs)


def _pieces(record):
  """(prompt ids, response ids with EOS) of a record, computed apart."""
  tokenizer = _instruction_util.tokenizer()
  prompt, response = data.render(record, data.parse_template(TEMPLATE))
  return (list(tokenizer.encode(prompt)),
          list(tokenizer.encode(response)) + [tokenizer.eos_id])


def _category_of_row(x) -> str:
  text = _instruction_util.tokenizer().decode(x)
  question = text.split("Q: ", 1)[1]
  return next(name for start, name in CLASSIFY.items()
              if question.startswith(start))


# ------------------------------------------------------- rows and the mask


def test_the_targets_are_exactly_the_response_tokens():
  records = _records()
  fed = _build(records)
  # One client, no test split, nothing truncated: row i is record i.
  assert fed.provenance["records_truncated"] == 0
  assert fed.train_x.shape == (len(records), 100)
  for i, record in enumerate(records):
    prompt, response = _pieces(record)
    ids = prompt + response
    n = len(ids) - 1
    np.testing.assert_array_equal(fed.train_x[i, :n], ids[:-1])
    want_y = np.full(100, PAD_TARGET)
    want_y[len(prompt) - 1:n] = response
    np.testing.assert_array_equal(fed.train_y[i], want_y)
  assert fed.provenance["train_tokens"] == sum(len(_pieces(r)[1])
                                               for r in records)


def test_the_jitted_sequence_loss_scores_the_response_only():
  records = _records()[:16]
  fed = _build(records, sequence_length=96)
  vocab = fed.num_classes
  logits = np.random.default_rng(0).normal(
      size=fed.train_x.shape + (vocab,)).astype(np.float32)
  got = jax.jit(types.sequence_cross_entropy)(logits, fed.train_y)
  counts = jax.jit(types.target_counts)(fed.train_y)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  for i, record in enumerate(records):
    prompt, response = _pieces(record)
    positions = np.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    want = -np.mean(log_probs[i, positions, response])
    np.testing.assert_allclose(got[i], want, rtol=1e-5)
    assert counts[i] == len(response)


def test_truncation_is_counted_as_computed_by_hand():
  records = _records()
  length = 32
  sizes = [(len(p), len(p) + len(r)) for p, r in map(_pieces, records)]
  cut = [(p, n) for p, n in sizes if n - 1 > length and p <= length]
  right = _build(records, sequence_length=length)
  assert right.provenance["records_truncated"] == len(cut) > 0
  assert right.provenance["response_tokens_truncated"] == sum(
      n - (length + 1) for _, n in cut)
  assert right.provenance["records_dropped"] == sum(
      p > length for p, _ in sizes) > 0
  drop = _build(records, sequence_length=length, truncation="drop")
  assert drop.provenance["records_truncated"] == 0
  assert drop.provenance["records_dropped"] == sum(
      n - 1 > length for _, n in sizes)
  assert drop.train_x.shape[0] == len(records) - sum(
      n - 1 > length for _, n in sizes)


def test_a_huge_output_is_cut_to_the_row_and_counted():
  huge = data.InstructionRecord("Say it.", "", "ab " * 100_000, "x")
  fed = _build([huge], sequence_length=24)
  prompt = _pieces(huge)[0]
  assert fed.train_y.shape == (1, 24)
  assert np.sum(fed.train_y != PAD_TARGET) == 25 - len(prompt)
  assert fed.provenance["records_truncated"] == 1
  assert fed.provenance["response_tokens_truncated"] == sum(
      map(len, _pieces(huge))) - 25


def test_packing_keeps_every_scored_target_in_order_in_fewer_rows():
  plain = _build(split="iid", num_clients=3, sequence_length=64)
  packed = _build(split="iid", num_clients=3, sequence_length=64, pack=True)
  assert packed.train_x.shape[0] < plain.train_x.shape[0]
  for rows_plain, rows_packed in zip(plain.train_clients,
                                     packed.train_clients, strict=True):
    scored = [plain.train_y[r][plain.train_y[r] != PAD_TARGET]
              for r in rows_plain]
    packed_scored = [packed.train_y[r][packed.train_y[r] != PAD_TARGET]
                     for r in rows_packed]
    np.testing.assert_array_equal(np.concatenate(scored),
                                  np.concatenate(packed_scored))
  # A response is a run of scored targets: one a row unpacked; packed, the
  # same number in all, several in some rows.
  def responses(y):
    scored = np.concatenate([[False], y != PAD_TARGET])
    return np.sum(scored[1:] & ~scored[:-1])

  assert [responses(y) for y in plain.train_y] == [1] * len(plain.train_y)
  packed_counts = [responses(y) for y in packed.train_y]
  assert sum(packed_counts) == len(plain.train_y) and max(packed_counts) > 1


def test_a_tokenizer_that_prepends_a_bos_gets_it_before_the_prompt(
    tmp_path):
  path = tmp_path / "tokenizer.json"
  path.write_text(json.dumps(_instruction_util.WITH_BOS))
  tokenizer = data.load_tokenizer(path)
  record = data.InstructionRecord("hello world", "", "again world")
  fed = data.instruction_federation(
      [record], tokenizer, sequence_length=6, num_clients=1,
      test_fraction=0.0, template="{instruction} {output}")
  # <s> hello world | again world </s>, with </s> (3) padding the inputs.
  np.testing.assert_array_equal(fed.train_x, [[4, 1, 2, 7, 2, 3]])
  np.testing.assert_array_equal(fed.train_y, [[-1, -1, 7, 2, 3, -1]])


def test_a_response_the_tokenizer_removes_is_dropped_and_counted(tmp_path):
  strip_x = {"type": "Replace", "pattern": {"String": "x"}, "content": ""}
  path = tmp_path / "tokenizer.json"
  path.write_text(json.dumps(dict(_instruction_util.WORD_LEVEL,
                                  normalizer=strip_x)))
  records = [data.InstructionRecord("hello", "", "world"),
             data.InstructionRecord("hello", "", "xxx")]
  fed = data.instruction_federation(
      records, data.load_tokenizer(path), sequence_length=4,
      num_clients=1, test_fraction=0.0, template="{instruction} {output}",
      append_eos=False)
  assert fed.provenance["records_dropped"] == 1
  np.testing.assert_array_equal(fed.train_y, [[2, -1, -1, -1]])


def test_alpacas_default_template_is_used_without_a_template():
  record = _records()[0]
  fed = _build([record], template=None, sequence_length=400)
  tokenizer = _instruction_util.tokenizer()
  prompt, response = data.render(record)
  ids = list(tokenizer.encode(prompt)) + list(tokenizer.encode(response))
  np.testing.assert_array_equal(fed.train_x[0, :len(ids)], ids)
  assert fed.provenance["template"] == "alpaca"


# ------------------------------------------------------------------ splits


def _categories(records):
  names = sorted({r.category for r in records})
  return np.array([names.index(r.category) for r in records]), names


def test_iid_sizes_and_indices_are_the_seeded_permutations():
  records = _records()
  parts = data.split_records(records, "iid", num_clients=7, seed=3)
  order = np.random.default_rng(3).permutation(len(records))
  size = len(records) // 7
  for k, part in enumerate(parts):
    np.testing.assert_array_equal(part,
                                  np.sort(order[k * size:(k + 1) * size]))
  fed = _build(records, split="iid", num_clients=7, seed=3)
  assert fed.provenance["records_left_out"] == len(records) % 7
  assert [len(rows) for rows in fed.train_clients] == [size] * 7


def test_one_client_per_category():
  records = _records()
  labels, names = _categories(records)
  parts = data.split_records(records, "category")
  assert len(parts) == len(names)
  for c, part in enumerate(parts):
    np.testing.assert_array_equal(part, np.flatnonzero(labels == c))
  fed = _build(records, split="category", num_clients=None,
               test_fraction=0.25)
  assert fed.client_ids == tuple(names)
  for name, rows, test_rows in zip(fed.client_ids, fed.train_clients,
                                   fed.test_clients, strict=True):
    assert {_category_of_row(fed.train_x[r]) for r in rows} == {name}
    assert {_category_of_row(fed.test_x[r]) for r in test_rows} <= {name}
  assert sum(map(len, fed.test_clients)) == round(0.25 * len(records))


def test_categories_dealt_to_fewer_clients_stay_whole():
  records = _records()
  labels, names = _categories(records)
  parts = data.split_records(records, "category", num_clients=2, seed=5)
  order = np.random.default_rng(5).permutation(len(names))
  for k, part in enumerate(parts):
    np.testing.assert_array_equal(
        part, np.flatnonzero(np.isin(labels, order[k::2])))
  assert sorted(np.concatenate(parts)) == list(range(len(records)))


def test_categories_spread_over_more_clients_share_them_equally():
  records = _records()
  labels, names = _categories(records)
  parts = data.split_records(records, "category", num_clients=12, seed=1)
  assert sorted(np.concatenate(parts)) == list(range(len(records)))
  holders = collections.defaultdict(list)
  for part in parts:
    assert len(set(labels[part])) == 1  # one category a client
    holders[labels[part][0]].append(len(part))
  assert sorted(holders) == list(range(len(names)))
  for c, sizes in holders.items():
    assert sum(sizes) == np.sum(labels == c)
    assert max(sizes) - min(sizes) <= 1


def _dirichlet_by_hand(labels, num_categories, num_clients, seed, alpha):
  """The draw of ``partitions.dirichlet`` without balancing, first try."""
  rng = np.random.default_rng(seed)
  order = rng.permutation(labels.size)
  order = order[np.argsort(labels[order], kind="stable")]
  parts = [[] for _ in range(num_clients)]
  for c in range(num_categories):
    members = order[labels[order] == c]
    shares = rng.dirichlet(np.full(num_clients, alpha))
    cuts = np.floor(np.cumsum(shares)[:-1] * members.size).astype(int)
    for client, piece in enumerate(np.split(members, cuts)):
      parts[client].extend(piece)
  return [np.sort(np.asarray(p, np.int64)) for p in parts]


@pytest.mark.parametrize("seed,alpha", [(0, 0.5), (4, 2.0), (1, 50.0)])
def test_dirichlet_is_the_numpy_draw_reproduced_by_seed(seed, alpha):
  records = _records()
  labels, names = _categories(records)
  want = _dirichlet_by_hand(labels, len(names), 4, seed, alpha)
  assert min(map(len, want)) >= 1  # the first draw is the one kept
  got = data.split_records(records, "dirichlet", 4, seed=seed, alpha=alpha)
  for part, wanted in zip(got, want, strict=True):
    np.testing.assert_array_equal(part, wanted)
  again = data.split_records(records, "dirichlet", 4, seed=seed, alpha=alpha)
  assert all(np.array_equal(a, b) for a, b in zip(got, again, strict=True))


def test_dirichlet_skew_follows_alpha():
  records = data.generated_instructions(2000, seed=2)
  labels, names = _categories(records)

  def mean_top_share(alpha):
    parts = data.split_records(records, "dirichlet", 5, seed=0, alpha=alpha)
    owner = np.empty(labels.size, int)
    for k, part in enumerate(parts):
      owner[part] = k
    return np.mean([np.bincount(owner[labels == c], minlength=5).max()
                    / np.sum(labels == c) for c in range(len(names))])

  assert mean_top_share(0.05) > 0.8
  assert mean_top_share(1000.0) < 0.3


def test_client_category_counts_are_those_of_its_rows():
  fed = _build(split="dirichlet", num_clients=4, alpha=0.3, seed=2,
               test_fraction=0.2, sequence_length=40)
  counts = fed.provenance["client_categories"]
  for client, rows in zip(fed.client_ids, fed.train_clients, strict=True):
    decoded = collections.Counter(_category_of_row(fed.train_x[r])
                                  for r in rows)
    assert counts[client] == dict(decoded)


# --------------------------------------------------------------- refusals


@pytest.mark.parametrize("alpha,error", [
    (0, ValueError), (-1.0, ValueError), (float("nan"), ValueError),
    (float("inf"), ValueError), ("0.5", TypeError), (True, TypeError),
    (None, None)])
def test_dirichlet_alpha_must_be_finite_and_positive(alpha, error):
  records = _records()
  if error is None:  # None is the default, 0.5
    assert len(data.split_records(records, "dirichlet", 3, alpha=alpha)) == 3
    return
  with pytest.raises(error, match="alpha"):
    data.split_records(records, "dirichlet", 3, alpha=alpha)
  with pytest.raises(error, match="alpha"):
    _build(split="dirichlet", num_clients=3, alpha=alpha)


@pytest.mark.parametrize("kwargs,error,message", [
    ({"split": "iid", "num_clients": 3, "alpha": 0.5}, ValueError,
     "alpha is the 'dirichlet' split's"),
    ({"split": "shards", "num_clients": 3}, ValueError, "split must be"),
    ({"split": "iid", "num_clients": None}, ValueError, "needs num_clients"),
    ({"split": "iid", "num_clients": 121}, ValueError,
     "num_clients=121 is larger than the 120 records"),
    ({"split": "category", "num_clients": 121}, ValueError,
     "num_clients=121 is larger"),
    ({"split": "dirichlet", "num_clients": 121}, ValueError,
     "num_clients=121 is larger"),
    ({"split": "iid", "num_clients": 0}, ValueError, "num_clients"),
    ({"split": "iid", "num_clients": 2.5}, TypeError, "num_clients"),
    ({"split": "iid", "num_clients": True}, TypeError, "num_clients"),
    ({"split": "iid", "num_clients": 2, "seed": -1}, ValueError, "seed"),
])
def test_bad_split_arguments_are_refused_naming_them(kwargs, error, message):
  with pytest.raises(error, match=message):
    data.split_records(_records(), **kwargs)


def test_more_clients_than_a_categorys_records_is_refused():
  records = _records()[:10]
  counts = collections.Counter(r.category for r in records)
  assert min(counts.values()) == 1  # some category has one record
  with pytest.raises(ValueError, match="more clients than records"):
    data.split_records(records, "category", num_clients=9)


@pytest.mark.parametrize("split", ["category", "dirichlet"])
def test_category_splits_need_every_category(split):
  records = _records()[:10]
  records[6] = records[6]._replace(category=None)
  with pytest.raises(ValueError, match=r"records\[6\] has no category"):
    data.split_records(records, split, 2)
  with pytest.raises(ValueError, match=r"records\[6\] has no category"):
    _build(records, split=split, num_clients=2)
  # The IID split reads no category.
  assert len(data.split_records(records, "iid", 2)) == 2


@pytest.mark.parametrize("kwargs,error,message", [
    ({"sequence_length": 0}, ValueError, "sequence_length"),
    ({"sequence_length": 1.5}, TypeError, "sequence_length"),
    ({"sequence_length": (1 << 17) + 1}, ValueError, "sequence_length"),
    ({"truncation": "left"}, ValueError, "truncation"),
    ({"test_fraction": 1.0}, ValueError, "test_fraction"),
    ({"test_fraction": -0.1}, ValueError, "test_fraction"),
    ({"test_fraction": float("nan")}, ValueError, "test_fraction"),
    ({"pack": "yes"}, TypeError, "pack"),
    ({"append_eos": 1}, TypeError, "append_eos"),
    ({"template": "{instruction.__class__} {output}"}, ValueError,
     "not allowed"),
    ({"template": "{instruction}: {output}"}, ValueError,
     "has an input but the template has no"),
    ({"sequence_length": 4}, ValueError, "no record fits"),
])
def test_bad_federation_arguments_are_refused_naming_them(kwargs, error,
                                                          message):
  with pytest.raises(error, match=message):
    _build(**kwargs)


def test_bad_records_and_tokenizers_are_refused():
  with pytest.raises(TypeError, match=r"records\[1\]: 'output' must be"):
    _build([{"instruction": "a", "output": "b"},
            {"instruction": "a", "output": float("nan")}])
  with pytest.raises(TypeError, match="tokenizer must be a Tokenizer"):
    data.instruction_federation(_records(), "gpt2", num_clients=2)
  backend = _instruction_util.tokenizer().backend
  no_eos = data.Tokenizer(backend, eos_token=None)
  with pytest.raises(ValueError, match="has no EOS token"):
    data.instruction_federation(_records(), no_eos, num_clients=2)
  fed = data.instruction_federation(_records(), no_eos, num_clients=2,
                                    append_eos=False, template=TEMPLATE,
                                    sequence_length=100)
  assert fed.provenance["append_eos"] is False


def test_generated_instructions_are_seeded_and_correct():
  first = data.generated_instructions(300, seed=7)
  assert first == data.generated_instructions(300, seed=7)
  assert first != data.generated_instructions(300, seed=8)
  assert {r.category for r in first} == set(data.INSTRUCTION_CATEGORIES)
  for record in first:
    given, answer = record.input, record.output
    if record.category == "arithmetic":
      a, symbol, b = record.instruction[len("What is "):-1].split(" ")
      want = {"+": int(a) + int(b), "-": int(a) - int(b),
              "*": int(a) * int(b)}[symbol]
      assert answer == str(want) and given == ""
    elif record.category == "reverse":
      assert answer == "".join(reversed(given))
    elif record.category == "capitalise":
      assert answer == given.title()
    elif record.category == "count":
      letter = record.instruction.split("'")[1]
      assert answer == str(sum(ch == letter for ch in given))
    else:
      numbers = [int(v) for v in given.split(", ")]
      assert answer == ", ".join(map(str, sorted(numbers)))
  only = data.generated_instructions(50, weights=[0, 0, 1, 0, 0])
  assert {r.category for r in only} == {"capitalise"}
  for bad in ({"num_records": 0}, {"seed": -1},
              {"weights": [1, 1, float("nan"), 1, 1]},
              {"weights": [0, 0, 0, 0, 0]}, {"weights": [1, 1]}):
    with pytest.raises(ValueError):
      data.generated_instructions(**bad)


# ------------------------------------------------------------------ engine


def test_one_round_of_local_training_runs_on_the_task():
  length = 40
  fed = _build(split="category", num_clients=None, sequence_length=length,
               test_fraction=0.2)
  model = models.get("transformer_lm", num_classes=fed.num_classes,
                     input_shape=(length,), width=8, depth=1, heads=2,
                     max_length=length)
  result = simulation.run(
      model, fed.federated(), fed.test(), aggregators.fedavg(),
      num_rounds=1, participation=1.0, seed=0,
      training=LocalTraining(epochs=1, batch_size=8, learning_rate=0.5),
      execution=Execution(progress=False))
  row = result.history.rows[-1]
  assert np.isfinite(row["train_loss"])
  # The test loss is the mean over the response tokens only (independent
  # of how the library weights rows), recomputed from the final params.
  logits = np.asarray(model.apply(result.state.params, fed.test_x,
                                  False)[0], np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  scored = fed.test_y != PAD_TARGET
  rows, positions = np.nonzero(scored)
  want = -np.mean(log_probs[rows, positions, fed.test_y[scored]])
  np.testing.assert_allclose(row["test_loss"], want, rtol=1e-4)
  assert want < np.log(fed.num_classes)  # it learned something in a round
