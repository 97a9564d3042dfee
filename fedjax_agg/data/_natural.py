"""Natural federations: data whose clients are its own speakers or writers.

A ``NaturalFederation`` keeps the pooled-arrays + one-index-row-per-client
layout of ``fedjax_agg.federated`` and the data's own client ids. Its
targets are either class labels ``[M]`` (FEMNIST, Sent140, CIFAR-100) or
per-token targets ``[M, T]`` for sequence tasks, where ``PAD_TARGET`` (-1)
marks a padded position: the loss, accuracy and per-client means skip it.
"""

from typing import NamedTuple, Optional

import numpy as np

from fedjax_agg import federated
from fedjax_agg.types import PAD_TARGET
TASKS = ("classification", "sequence")
"""What a federation's targets are: one class label per example, or one
target per position ([M, T], ``PAD_TARGET`` where padded)."""


class NaturalFederation(NamedTuple):
  """A federated dataset split by its own clients, with train and test rows.

  Attributes:
    name: what the federation is (``shakespeare``, ``leaf:femnist``, ...).
    train_x: [M, ...] pooled training inputs (float32 images or int32
      tokens).
    train_y: [M] int32 labels, or [M, T] int32 per-token targets
      (``PAD_TARGET`` where padded).
    train_clients: one int index array into ``train_x`` per client.
    test_x, test_y: the pooled test rows, as ``train_*``.
    test_clients: one index array into ``test_x`` per client (may be
      empty: a client with no test rows).
    client_ids: the data's own client names, in client order.
    num_classes: classes, or the vocabulary size for token targets.
    input_shape: the shape of one example's input.
    task: one of ``TASKS``.
    provenance: JSON-able description of where the data came from (files
      or package and version, counts), written beside a run's results.
  """
  name: str
  train_x: np.ndarray
  train_y: np.ndarray
  train_clients: tuple
  test_x: np.ndarray
  test_y: np.ndarray
  test_clients: tuple
  client_ids: tuple
  num_classes: int
  input_shape: tuple
  task: str
  provenance: dict

  @property
  def num_clients(self) -> int:
    """Number of clients."""
    return len(self.client_ids)

  def federated(self, device=None) -> federated.FederatedData:
    """The training rows as ``FederatedData`` (one row per client)."""
    return federated.from_partition(self.train_x, self.train_y,
                                    self.train_clients, device=device)

  def test(self) -> tuple[np.ndarray, np.ndarray]:
    """The pooled test rows ``(x, y)`` of every client."""
    return self.test_x, self.test_y


def check_federation(fed: NaturalFederation,
                     where: Optional[str] = None) -> NaturalFederation:
  """Checks a federation's arrays agree; returns it.

  Raises:
    ValueError: naming ``where`` (default the federation's name) and what
      disagrees: lengths, index ranges, a client without training rows,
      targets outside ``[0, num_classes)`` (or ``PAD_TARGET`` for sequence
      targets), duplicate client ids.
  """
  where = where or fed.name
  if fed.task not in TASKS:
    raise ValueError(f"{where}: task must be one of {TASKS}, got "
                     f"{fed.task!r}")
  if len(set(fed.client_ids)) != len(fed.client_ids):
    raise ValueError(f"{where}: client ids must be unique")
  if not (len(fed.client_ids) == len(fed.train_clients)
          == len(fed.test_clients)):
    raise ValueError(
        f"{where}: {len(fed.client_ids)} client ids but "
        f"{len(fed.train_clients)} training and {len(fed.test_clients)} "
        "test index rows")
  if not fed.client_ids:
    raise ValueError(f"{where}: no clients")
  for split in ("train", "test"):
    x, y = getattr(fed, f"{split}_x"), getattr(fed, f"{split}_y")
    if x.shape[0] != y.shape[0]:
      raise ValueError(f"{where}: {split}_x has {x.shape[0]} rows but "
                       f"{split}_y {y.shape[0]}")
    if x.shape[0] and tuple(x.shape[1:]) != tuple(fed.input_shape):
      raise ValueError(f"{where}: {split}_x rows have shape "
                       f"{tuple(x.shape[1:])}, not {tuple(fed.input_shape)}")
    want_ndim = 1 if fed.task == "classification" else 2
    if y.ndim != want_ndim:
      raise ValueError(f"{where}: {split}_y must have {want_ndim} "
                       f"dimension(s) for a {fed.task} task, got {y.shape}")
    if y.size:
      low = PAD_TARGET if fed.task == "sequence" else 0
      if y.min() < low or y.max() >= fed.num_classes:
        raise ValueError(
            f"{where}: {split}_y holds values in [{y.min()}, {y.max()}], "
            f"outside [{low}, {fed.num_classes})")
    for i, rows in enumerate(getattr(fed, f"{split}_clients")):
      rows = np.asarray(rows)
      if rows.size and (rows.min() < 0 or rows.max() >= x.shape[0]):
        raise ValueError(f"{where}: {split} rows of client "
                         f"{fed.client_ids[i]!r} index outside "
                         f"[0, {x.shape[0]})")
      if split == "train" and rows.size == 0:
        raise ValueError(f"{where}: client {fed.client_ids[i]!r} has no "
                         "training rows")
  return fed


def summary(fed: NaturalFederation) -> dict:
  """Client sizes and the target distribution of a federation (JSON-able).

  Sizes are rows per client (train and test); for sequence tasks also the
  scored tokens per client. ``targets`` is the share of each class or
  token among the scored training targets, and ``top_targets`` the ten
  most frequent.
  """
  def stats(values):
    values = np.asarray(values, np.float64)
    return {"min": int(values.min()), "median": float(np.median(values)),
            "mean": float(values.mean()), "max": int(values.max()),
            "total": int(values.sum())}

  train_sizes = [len(rows) for rows in fed.train_clients]
  test_sizes = [len(rows) for rows in fed.test_clients]
  out = {"name": fed.name, "task": fed.task, "clients": fed.num_clients,
         "train_rows": stats(train_sizes), "test_rows": stats(test_sizes),
         "clients_without_test_rows": int(sum(s == 0 for s in test_sizes))}
  scored = fed.train_y[fed.train_y != PAD_TARGET] if fed.task == "sequence" \
      else fed.train_y
  if fed.task == "sequence":
    per_row = np.sum(fed.train_y != PAD_TARGET, axis=1)
    out["train_tokens"] = stats([per_row[np.asarray(rows)].sum()
                                 for rows in fed.train_clients])
  # ``scored`` leaves out PAD_TARGET (-1), which bincount would refuse.
  counts = np.bincount(scored.ravel(), minlength=fed.num_classes)
  shares = counts / max(counts.sum(), 1)
  out["targets"] = [float(s) for s in shares]
  # A stable sort: equal counts keep target order, so the summary is the
  # same on every run.
  top = np.argsort(-counts, kind="stable")[:10]
  out["top_targets"] = [[int(t), float(shares[t])] for t in top]
  return out
