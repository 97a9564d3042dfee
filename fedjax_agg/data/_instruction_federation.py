"""Instruction tuning as a federated next-token task.

``instruction_federation(records, tokenizer, ...)`` turns instruction
records (``read_instructions``) into a ``NaturalFederation`` of task
"sequence", the form the Shakespeare task has, so the engine's local
training and every rule run on it unchanged. The steps:

1. Each record is rendered (``render``: Alpaca's template by default) and
   its prompt and response are tokenized separately and concatenated,
   after the tokenizer's BOS token if it has one (``Tokenizer.bos_id``:
   Llama's ``<s>``) and followed by its EOS token (``append_eos``).
   Tokenizing the parts apart makes the boundary exact: the response's
   tokens are the ones after the prompt's, whatever merges the tokenizer
   would make across it.
2. The loss is on the response only: a row's inputs are the tokens, its
   targets the tokens shifted by one (``next_token_sequences``), and a
   target that is a prompt token is ``PAD_TARGET``, the mark the text
   tasks use for padding, which the loss, accuracy and per-client counts
   skip. The first response token is scored (predicted from the prompt's
   last token).
3. Truncation to ``sequence_length`` inputs (``sequence_length + 1``
   tokens). ``truncation="right"`` keeps a record's first tokens and cuts
   the end of its response; a record whose prompt alone fills the row
   keeps no response token and is dropped. ``truncation="drop"`` drops
   every record that does not fit. A record whose response has no token
   (the tokenizer's normaliser removed its text, and no EOS is appended)
   is dropped too. The provenance counts the records cut
   (``records_truncated``), the response tokens lost
   (``response_tokens_truncated``) and the records dropped
   (``records_dropped``).
4. The test split: a seeded ``test_fraction`` of the records kept.
5. The federated split of the training records (``split_records``):
   ``"iid"`` (the library's ``partitions.iid``: equal shares, the
   ``M mod N`` remainder left out and counted), ``"category"`` (one client
   per category, or categories spread over clients: with fewer clients
   than categories each client holds whole categories, dealt in a seeded
   order; with more, each client holds one category and a category's
   records are shared equally by its clients, ``partitions.
   classes_per_client`` with ``k=1``), and ``"dirichlet"`` (for every
   category, proportions over the clients drawn from
   ``Dir(alpha 1_N)``: ``partitions.dirichlet`` without balancing,
   redrawn until every client has a record; smaller ``alpha``, more
   skew). These are the IID and category-skewed splits of OpenFedLLM (Ye
   et al., KDD 2024) and FedIT (Zhang et al., "Towards Building the
   Federated GPT: Federated Instruction Tuning", ICASSP 2024).
6. Each client's records become rows of ``sequence_length`` inputs: one
   record a row, padded (inputs with the EOS id, else 0; targets with
   ``PAD_TARGET``), or with ``pack=True`` consecutive records of the client
   packed into a row while they fit whole (attention is not reset at a
   record boundary; the first token of a packed record is a prompt token
   and is not scored). A client's test rows are the test records of its
   categories, each test record given to a client drawn with probability
   its share of the record's category in training (with ``"iid"`` the
   clients share every category; with one client per category, its own).
"""

import math
from typing import Optional, Sequence

import numpy as np

from fedjax_agg import partitions
from fedjax_agg.checks import check_range
from fedjax_agg.data import _instructions
from fedjax_agg.data import _natural
from fedjax_agg.data._tokenizer import Tokenizer
from fedjax_agg.types import PAD_TARGET

INSTRUCTION_SPLITS = ("iid", "category", "dirichlet")
"""The federated splits ``split_records`` makes."""
TRUNCATION = ("right", "drop")
"""What ``instruction_federation`` does with a record that does not fit."""
MAX_SEQUENCE_LENGTH = 1 << 17
"""The longest row accepted (131,072 inputs)."""


def _count(name: str, value, low: int, high: Optional[int] = None) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"{name} must be an int, got {value!r}")
  if value < low or (high is not None and value > high):
    bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
    raise ValueError(f"{name} must be {bound}, got {value}")
  return int(value)


def category_labels(records: Sequence[_instructions.InstructionRecord],
                    where: str = "records") -> tuple[np.ndarray, tuple]:
  """Each record's category as an index into the sorted category names.
  -> (int64 [M], names).

  Raises:
    ValueError: a record without a category (the first is named).
  """
  missing = [i for i, r in enumerate(records) if r.category is None]
  if missing:
    raise ValueError(f"{where}[{missing[0]}] has no category ({len(missing)}"
                     " record(s) lack one); the category splits need it "
                     "(map the file's key with fields={'category': ...})")
  names = tuple(sorted({r.category for r in records}))
  index = {name: i for i, name in enumerate(names)}
  return np.array([index[r.category] for r in records], np.int64), names


def _deal_categories(labels: np.ndarray, num_categories: int,
                     num_clients: int, seed: int) -> list[np.ndarray]:
  """Fewer clients than categories: client i holds the categories
  ``order[i::N]`` of a seeded order, whole."""
  # Dealt round-robin over a seeded order: clients' numbers of categories
  # differ by at most one.
  order = np.random.default_rng(seed).permutation(num_categories)
  return [np.flatnonzero(np.isin(labels, order[i::num_clients]))
          for i in range(num_clients)]


def _split_arguments(split, num_clients, seed, alpha) -> tuple:
  """``split_records``'s arguments checked (names them); alpha's default."""
  if split not in INSTRUCTION_SPLITS:
    raise ValueError(f"split must be one of {INSTRUCTION_SPLITS}, got "
                     f"{split!r}")
  if alpha is not None and split != "dirichlet":
    raise ValueError(f"alpha is the 'dirichlet' split's; split {split!r} "
                     "takes none")
  if split == "dirichlet":
    alpha = 0.5 if alpha is None else alpha
    check_range("alpha", alpha, 0, math.inf, low_open=True, high_open=True)
    alpha = float(alpha)
  if num_clients is None and split != "category":
    raise ValueError(f"split {split!r} needs num_clients")
  if num_clients is not None:
    num_clients = _count("num_clients", num_clients, 1)
  return split, num_clients, _count("seed", seed, 0), alpha


def split_records(records: Sequence[_instructions.InstructionRecord],
                  split: str = "iid", num_clients: Optional[int] = None,
                  seed: int = 0, alpha: Optional[float] = None
                  ) -> list[np.ndarray]:
  """Record indices per client (``ClientIndices``) by ``split``.

  Args:
    records: the (checked) records.
    split: one of ``INSTRUCTION_SPLITS`` (see the module docstring).
    num_clients: N; None only for ``"category"`` (one client per
      category).
    seed: the seed of every draw.
    alpha: ``"dirichlet"``'s concentration (> 0, finite; default 0.5);
      refused with the other splits.

  Returns:
    N sorted int64 index arrays, none empty, no index twice.

  Raises:
    ValueError: an unknown split, N above the records (or, for
      ``"category"``, above the records of a category), a bad ``alpha``
      or ``alpha`` with another split, a record without a category.
  """
  split, num_clients, seed, alpha = _split_arguments(split, num_clients,
                                                     seed, alpha)
  if not records:
    raise ValueError("records holds no record")
  if num_clients is not None and num_clients > len(records):
    raise ValueError(f"num_clients={num_clients} is larger than the "
                     f"{len(records)} records")
  if split == "iid":
    # iid reads only how many labels there are: zeros stand in for records.
    return partitions.iid(np.zeros(len(records), np.int64), num_clients,
                          seed)
  labels, names = category_labels(records)
  if split == "dirichlet":
    return partitions.dirichlet(labels, num_clients, seed,
                                alpha=alpha,
                                min_size=1, balance=False,
                                num_classes=len(names))
  # One client per category: client i holds category i of the sorted names,
  # the names the federation's client ids then carry.
  if num_clients is None or num_clients == len(names):
    return [np.flatnonzero(labels == c) for c in range(len(names))]
  if num_clients < len(names):
    return _deal_categories(labels, len(names), num_clients, seed)
  try:
    return partitions.classes_per_client(labels, num_clients, seed, k=1,
                                         num_classes=len(names))
  except ValueError as error:  # a category with fewer records than holders
    raise ValueError(f"split 'category': {num_clients} clients over "
                     f"{len(names)} categories give some category more "
                     f"clients than records ({error})") from None


class _Encoded:
  """Every record's tokens (truncated) and its response mask, and the
  truncation counts."""

  def __init__(self, records, tokenizer: Tokenizer, template, length: int,
               truncation: str, append_eos: bool):
    self.tokens, self.scored, self.kept = [], [], []
    self.truncated = self.tokens_lost = 0
    eos = [tokenizer.eos_id] if append_eos else []
    bos = [] if tokenizer.bos_id is None else [tokenizer.bos_id]
    for i, record in enumerate(records):
      prompt, response = _instructions.render(record, template,
                                              f"records[{i}]")
      prompt_ids = np.concatenate([np.asarray(bos, np.int32),
                                   tokenizer.encode(prompt)])
      # Tokenized apart and joined: the response's tokens are exactly those
      # after the prompt's, whatever merges the tokenizer would make across.
      ids = np.concatenate([prompt_ids, tokenizer.encode(response),
                            np.asarray(eos, np.int32)])
      is_response = np.arange(ids.size) >= prompt_ids.size
      if ids.size == prompt_ids.size:
        continue  # a response of no token (its text normalised away)
      # ``length`` inputs need length + 1 tokens (each input predicts the next).
      # A prompt that fills the row would keep no scored token, so the record
      # is dropped rather than cut.
      if ids.size > length + 1:
        if truncation == "drop" or prompt_ids.size >= length + 1:
          continue
        self.truncated += 1
        self.tokens_lost += ids.size - (length + 1)
        ids, is_response = ids[:length + 1], is_response[:length + 1]
      self.tokens.append(ids.astype(np.int32))
      self.scored.append(is_response)
      self.kept.append(i)


def _rows(tokens: list, scored: list, length: int, pack: bool,
          pad_input: int) -> tuple[np.ndarray, np.ndarray]:
  """Rows of ``length`` inputs and targets (prompt targets ``PAD_TARGET``)
  of records in order, one a row or packed whole."""
  groups: list[list[int]] = []
  # Starts "full", so the first record always opens a row.
  used = length + 1
  for i, ids in enumerate(tokens):
    if pack and groups and used + ids.size <= length + 1:
      groups[-1].append(i)
      used += ids.size
    else:
      groups.append([i])
      used = ids.size
  x = np.full((len(groups), length), pad_input, np.int32)
  y = np.full((len(groups), length), PAD_TARGET, np.int32)
  for row, group in enumerate(groups):
    ids = np.concatenate([tokens[i] for i in group])
    keep = np.concatenate([scored[i] for i in group])
    # Inputs are every token but the last; a target is kept only where the
    # token it predicts is a response token (``keep[1:]``).
    x[row, :ids.size - 1] = ids[:-1]
    y[row, :ids.size - 1] = np.where(keep[1:], ids[1:], PAD_TARGET)
  return x, y


def _test_owners(train_labels, test_labels, train_parts, num_categories,
                 rng) -> list[np.ndarray]:
  """Test record positions per client: each drawn with probability its
  client's share of the record's category in training."""
  counts = np.zeros((len(train_parts), num_categories))
  for client, part in enumerate(train_parts):
    counts[client] = np.bincount(train_labels[part], minlength=num_categories)
  owners = np.full(test_labels.size, -1)
  for position, category in enumerate(test_labels):
    holders = counts[:, category]
    # A test record of a category no training client holds stays unowned (-1)
    # and goes to no client's test rows.
    if holders.sum() > 0:
      owners[position] = rng.choice(holders.size, p=holders / holders.sum())
  return [np.flatnonzero(owners == client) for client in range(len(counts))]


def _template(template):
  if template is None:
    return None
  if isinstance(template, _instructions.Template):
    template = template.text  # checked again: its parts may be edited
  return _instructions.parse_template(template)


def _pool(parts) -> tuple[np.ndarray, np.ndarray, tuple]:
  """Per-client (x, y) stacked, with each client's row indices."""
  starts = np.cumsum([0] + [x.shape[0] for x, _ in parts])
  return (np.concatenate([x for x, _ in parts]),
          np.concatenate([y for _, y in parts]),
          tuple(np.arange(starts[i], starts[i + 1], dtype=np.int32)
                for i in range(len(parts))))


def instruction_federation(
    records: Sequence, tokenizer: Tokenizer, *, sequence_length: int = 256,
    split: str = "iid", num_clients: Optional[int] = None,
    alpha: Optional[float] = None, seed: int = 0, test_fraction: float = 0.1,
    template: Optional[str] = None, truncation: str = "right",
    pack: bool = False, append_eos: bool = True,
    name: str = "instructions") -> _natural.NaturalFederation:
  """Instruction records as a federated next-token task on the response.

  Args:
    records: instruction records (``read_instructions``,
      ``generated_instructions``, or mappings, checked here).
    tokenizer: a ``Tokenizer`` (``load_tokenizer``, ``train_bpe``).
    sequence_length: inputs (and targets) per row.
    split: ``"iid"``, ``"category"`` or ``"dirichlet"``
      (``INSTRUCTION_SPLITS``).
    num_clients: N (None: one client per category, ``"category"`` only).
    alpha: the Dirichlet concentration (``"dirichlet"`` only; default 0.5).
    seed: seed of the test split, the client split and the test rows'
      clients.
    test_fraction: share of the records kept for testing, in [0, 1).
    template: a template string (``{instruction}``, ``{input}``,
      ``{output}``); None: Alpaca's (with or without input by record).
    truncation: ``"right"`` (cut the response's end) or ``"drop"``.
    pack: pack a client's records into rows while they fit whole.
    append_eos: end every response with the tokenizer's EOS token.
    name: the federation's name.

  Returns:
    A ``NaturalFederation`` of task "sequence": x [R, sequence_length]
    int32 tokens, y [R, sequence_length] next tokens with ``PAD_TARGET``
    on prompt and padding positions; ``num_classes`` is the tokenizer's
    ``vocab_size``; client ids are the category names with one client per
    category, else ``client_<i>``. The provenance gives the tokenizer, the
    template, the counts of step 3, the split and each client's records
    by category (``client_categories``, training records).

  Raises:
    TypeError, ValueError: a bad argument (named) or record (see
      ``check_record``, ``parse_template``, ``split_records``); every
      record dropped; no EOS token while ``append_eos``.
  """
  if not isinstance(tokenizer, Tokenizer):
    raise TypeError(f"tokenizer must be a Tokenizer (load_tokenizer), got "
                    f"{type(tokenizer).__name__}")
  length = _count("sequence_length", sequence_length, 1, MAX_SEQUENCE_LENGTH)
  if truncation not in TRUNCATION:
    raise ValueError(f"truncation must be one of {TRUNCATION}, got "
                     f"{truncation!r}")
  for flag, value in (("pack", pack), ("append_eos", append_eos)):
    if not isinstance(value, bool):
      raise TypeError(f"{flag} must be a bool, got {value!r}")
  if isinstance(test_fraction, bool) or not isinstance(
      test_fraction, (int, float)) or not 0.0 <= test_fraction < 1.0:
    raise ValueError(f"test_fraction must be a number in [0, 1), got "
                     f"{test_fraction!r}")
  if append_eos and tokenizer.eos_id is None:
    raise ValueError(f"tokenizer {tokenizer.source} has no EOS token: name "
                     "it (load_tokenizer(..., eos_token=...)) or pass "
                     "append_eos=False")
  records = _instructions.check_records(records)
  parsed = _template(template)
  split, num_clients, seed, alpha = _split_arguments(split, num_clients,
                                                     seed, alpha)
  if split != "iid":
    category_labels(records)  # refused before the work of tokenizing
  encoded = _Encoded(records, tokenizer, parsed, length, truncation,
                     append_eos)
  kept = [records[i] for i in encoded.kept]
  if not kept:
    raise ValueError(f"no record fits sequence_length={length} (all "
                     f"{len(records)} dropped)")
  # Separate streams of one seed: [seed, 1] the test split, [seed, 2] the
  # test records' owners, seed itself the client split, so changing one
  # draw leaves the others as they were.
  order = np.random.default_rng([seed, 1]).permutation(len(kept))
  num_test = int(round(test_fraction * len(kept)))
  test, train = np.sort(order[:num_test]), np.sort(order[num_test:])
  if not train.size:
    raise ValueError(f"test_fraction={test_fraction} leaves no training "
                     "record")
  train_records = [kept[i] for i in train]
  train_parts = split_records(train_records, split, num_clients, seed, alpha)
  if split == "iid":
    labels, names = np.zeros(len(kept), np.int64), ("all",)
  else:
    # Indices over all kept records, so test and training records index
    # categories alike; train_names are the categories training holds (the
    # client ids with one client per category).
    labels, names = category_labels(kept)
    train_names = category_labels(train_records)[1]
  test_parts = _test_owners(labels[train], labels[test], train_parts,
                            len(names), np.random.default_rng([seed, 2]))
  pad_input = 0 if tokenizer.eos_id is None else tokenizer.eos_id
  built = {}
  for split_name, rows_of, parts in (("train", train, train_parts),
                                     ("test", test, test_parts)):
    built[split_name] = _pool([_rows(
        [encoded.tokens[rows_of[i]] for i in part],
        [encoded.scored[rows_of[i]] for i in part], length, pack, pad_input)
        for part in parts])
  train_x, train_y, train_clients = built["train"]
  test_x, test_y, test_clients = built["test"]
  one_per_category = split == "category" and num_clients in (
      None, len(train_names))
  client_ids = (train_names if one_per_category else
                tuple(f"client_{i}" for i in range(len(train_parts))))
  provenance = {
      "source": name, **tokenizer.provenance(),
      "template": "alpaca" if parsed is None else parsed.text,
      "sequence_length": length, "truncation": truncation, "pack": pack,
      "append_eos": append_eos, "records": len(records),
      "records_truncated": encoded.truncated,
      "response_tokens_truncated": encoded.tokens_lost,
      "records_dropped": len(records) - len(kept),
      "train_records": int(train.size), "test_records": int(test.size),
      "records_left_out": int(train.size - sum(p.size for p in train_parts)),
      "split": split, "num_clients": len(train_parts), "seed": seed,
      "test_fraction": test_fraction,
      "train_rows": int(train_x.shape[0]), "test_rows": int(test_x.shape[0]),
      "train_tokens": int(np.sum(train_y != PAD_TARGET)),
      "test_tokens": int(np.sum(test_y != PAD_TARGET))}
  if split == "dirichlet":
    provenance["alpha"] = alpha
  if split != "iid":
    train_labels = labels[train]
    provenance["client_categories"] = {
        client: {names[c]: int(n) for c, n in enumerate(
            np.bincount(train_labels[part], minlength=len(names))) if n}
        for client, part in zip(client_ids, train_parts, strict=True)}
  return _natural.check_federation(_natural.NaturalFederation(
      name=name, train_x=train_x, train_y=train_y,
      train_clients=train_clients, test_x=test_x, test_y=test_y,
      test_clients=test_clients, client_ids=tuple(client_ids),
      num_classes=tokenizer.vocab_size, input_shape=(length,),
      task="sequence", provenance=provenance))
