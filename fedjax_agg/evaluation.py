"""Evaluation of global models: test metrics and per-client losses.

Every function here reads the model's task loss (``Model.loss``) and its
prediction ``argmax(outputs, -1)``; batches have a fixed size (the last one
padded) so each function compiles once per model and batch size.

* ``evaluate``: test loss, accuracy and macro-F1 of one model;
* ``client_losses``: one model's mean loss on every client's training data;
* ``member_rows``: a run's evaluation row (test metrics, the clients'
  losses, the accuracy on extra sets) of one model or of each of S
  stacked members of a sweep, the one evaluation both forms of a run
  use;
* ``per_example_fn`` / ``map_batches``: the batched pieces, also vmapped
  over the members of a sweep (``stacked_per_example_fn``);
* ``EvalSet``: a labelled set scored besides the test set
  (``config.Evaluation.extra``).
"""

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg.federated import FederatedData
from fedjax_agg.types import Model, PAD_TARGET, Params, target_counts

__all__ = ["EvalSet", "check_eval_sets", "classification_metrics",
           "client_losses", "evaluate", "example_weights", "map_batches",
           "mean_client_loss", "mean_loss", "member_rows",
           "per_client_mean",
           "per_example_fn", "per_example_losses", "stacked_per_example_fn"]


class EvalSet(NamedTuple):
  """A labelled set the global model is scored on besides the test set.

  At every test evaluation the run records, in column ``name``, the
  fraction of ``x`` the global model classifies as ``y`` (a backdoor's
  attack success: the triggered test images labelled with the target,
  ``attacks.backdoor``).

  Attributes:
    name: the history column (an identifier, not a column the run writes
      itself).
    x: [M, ...] inputs shaped like the test inputs.
    y: [M] int labels.
  """
  name: str
  x: Any
  y: Any


# Columns of a history row an EvalSet may not take.
_RESERVED_PREFIXES = ("test_", "client_", "cohort_", "personal_",
                      "finetuned_", "global_")


def check_eval_sets(extra) -> None:
  """Refuses ``Evaluation.extra`` unless it is a tuple of ``EvalSet``s with
  free identifier names, [M, ...] finite inputs and [M] int labels."""
  if not isinstance(extra, tuple):
    raise TypeError(f"extra must be a tuple of EvalSet, got "
                    f"{type(extra).__name__}")
  names = set()
  for i, item in enumerate(extra):
    if not isinstance(item, EvalSet):
      raise TypeError(f"extra[{i}] must be an EvalSet, got "
                      f"{type(item).__name__}")
    if not (isinstance(item.name, str) and item.name.isidentifier()):
      raise ValueError(f"extra[{i}].name must be an identifier, got "
                       f"{item.name!r}")
    if item.name.startswith(_RESERVED_PREFIXES) or item.name in (
        "round", "time_s", "epsilon") or item.name in names:
      raise ValueError(f"extra[{i}].name {item.name!r} is taken (by the "
                       "run's own columns or another EvalSet)")
    names.add(item.name)
    x_shape, y_shape = getattr(item.x, "shape", None), getattr(
        item.y, "shape", None)
    if x_shape is None or y_shape is None or len(y_shape) != 1 or (
        not x_shape or x_shape[0] != y_shape[0] or y_shape[0] == 0):
      raise ValueError(f"extra[{i}] ({item.name}): x must be [M, ...] and "
                       f"y [M] arrays with M >= 1, got shapes {x_shape} "
                       f"and {y_shape}")
    if not np.issubdtype(np.asarray(item.y).dtype, np.integer):
      raise TypeError(f"extra[{i}] ({item.name}): y must hold int labels, "
                      f"got dtype {np.asarray(item.y).dtype}")
    if not np.all(np.isfinite(np.asarray(item.x))):
      raise ValueError(f"extra[{i}] ({item.name}): x holds non-finite "
                       "values")


# A fresh jax.jit per call would compile again at every evaluation; one function
# per model keeps the compilation cache across rounds.
_FNS = {}  # (model, stacked) -> jitted per-batch evaluation


def per_example_fn(model: Model) -> Callable:
  """Jitted ``fn(params, x [B, ...], y [B]) -> (losses [B], preds [B])``."""
  key = (model, False)
  if key not in _FNS:
    def batch_stats(params, x, y):
      outputs, _ = model.apply(params, x, False)
      return model.loss(outputs, y), jnp.argmax(outputs, axis=-1)
    _FNS[key] = jax.jit(batch_stats)
  return _FNS[key]


def stacked_per_example_fn(model: Model) -> Callable:
  """``per_example_fn`` of S stacked models: -> ([S, B], [S, B])."""
  key = (model, True)
  if key not in _FNS:
    _FNS[key] = jax.jit(jax.vmap(per_example_fn(model).__wrapped__,
                                 in_axes=(0, None, None)))
  return _FNS[key]


def map_batches(fn, params, x, y, batch_size: int, sharding=None):
  """``fn(params, x_batch, y_batch) -> (losses, preds)`` over (x, y).

  Runs ``fn`` on batches of ``batch_size`` (the last one padded, so ``fn``
  compiles once; a set smaller than a batch is one batch of its size)
  and concatenates along the example axis: losses [..., M] and
  predictions [..., M] ([..., M, T] for per-token targets); a leading
  axis is kept, e.g. the members of a sweep. ``sharding``: where each
  batch goes (e.g. split over the devices of a mesh, ``params`` replicated
  there): the forward passes then run on every device.
  """
  total = x.shape[0]
  # A set smaller than one batch is one batch of its own size: padding
  # 200 test examples to 2,048 would compute 10x the forward passes.
  batch_size = max(1, min(batch_size, total))
  if sharding is not None:
    devices = len(sharding.device_set)
    # Rounded up to a multiple of the devices so each batch splits evenly.
    batch_size = -(-batch_size // devices) * devices
  losses, preds = [], []
  for start in range(0, total, batch_size):
    xb = x[start:start + batch_size]
    yb = y[start:start + batch_size]
    short = batch_size - xb.shape[0]
    if short:  # pad the last batch so the function compiles once
      xb = jnp.concatenate([xb, jnp.zeros((short,) + xb.shape[1:], xb.dtype)])
      yb = jnp.concatenate([yb, jnp.zeros((short,) + yb.shape[1:], yb.dtype)])
    if sharding is not None:
      xb, yb = jax.device_put((xb, yb), sharding)
    loss_b, pred_b = fn(params, xb, yb)
    axis = loss_b.ndim - 1  # the example axis, after any leading ones
    losses.append(jax.lax.slice_in_dim(loss_b, 0, batch_size - short,
                                       axis=axis))
    preds.append(jax.lax.slice_in_dim(pred_b, 0, batch_size - short,
                                      axis=axis))
  axis = losses[0].ndim - 1
  return jnp.concatenate(losses, axis), jnp.concatenate(preds, axis)


def per_example_losses(model: Model, params: Params, x, y,
                       batch_size: int = 2048, sharding=None):
  """Per-example loss and prediction of ``params`` on (x, y). -> [M], [M].

  ``sharding``: see ``map_batches``."""
  return map_batches(per_example_fn(model), params, x, y, batch_size,
                     sharding)


def classification_metrics(labels, predictions, num_classes: int
                           ) -> dict[str, float]:
  """Accuracy and macro-F1 (mean over classes present in labels or preds).

  Per-token targets [M, T] are scored at their positions that are not
  ``PAD_TARGET`` (token accuracy and macro-F1 over the vocabulary).
  """
  labels = np.asarray(labels)
  predictions = np.asarray(predictions)
  if labels.ndim > 1:
    scored = labels != PAD_TARGET
    labels, predictions = labels[scored], predictions[scored]
  confusion = np.zeros((num_classes, num_classes), np.int64)
  # np.add.at counts repeated (label, prediction) pairs; a fancy-indexed ``+=``
  # would count each pair once.
  np.add.at(confusion, (labels, predictions), 1)
  tp = np.diag(confusion).astype(np.float64)
  fp = confusion.sum(0) - tp
  fn = confusion.sum(1) - tp
  # A class absent from both labels and predictions has no defined F1: it is
  # left out of the macro mean rather than counted as 0.
  present = (tp + fp + fn) > 0
  denom = 2 * tp + fp + fn
  f1 = np.where(denom > 0, 2 * tp / np.where(denom > 0, denom, 1), 0.0)
  return {"accuracy": float(np.mean(labels == predictions))
                      if labels.size else 0.0,
          "macro_f1": float(f1[present].mean()) if present.any() else 0.0}


def example_weights(labels) -> Optional[jax.Array]:
  """[M] weights of per-example values for their means: the scored tokens
  of per-token targets ``target_counts``; None for class labels (every
  example weighs 1)."""
  return target_counts(labels) if labels.ndim > 1 else None


def mean_loss(losses, labels) -> jax.Array:
  """Mean of per-example losses [..., M], each weighted by its scored
  targets (``target_counts``: 1 per class label, the real tokens of a
  sequence). -> [...]."""
  weights = example_weights(jnp.asarray(labels))
  if weights is None:
    return jnp.mean(losses, axis=-1)
  return jnp.sum(losses * weights, axis=-1) / jnp.maximum(jnp.sum(weights),
                                                          1.0)


def evaluate(model: Model, params: Params, x, y, num_classes: int,
             batch_size: int = 2048, sharding=None) -> dict[str, float]:
  """Test loss, accuracy and macro-F1 of ``params`` on (x, y).

  ``sharding``: see ``map_batches``."""
  row, = member_rows(model, params, (x, y), num_classes, batch_size,
                     sharding=sharding)
  return {name.removeprefix("test_"): value for name, value in row.items()}


def client_losses(model: Model, params: Params, data: FederatedData,
                  batch_size: int = 2048, sharding=None) -> jax.Array:
  """Mean loss of ``params`` on each client's training data. -> [N].

  Computes each pooled example's loss once, then averages per client.
  ``sharding``: see ``map_batches``.
  """
  losses, _ = per_example_losses(model, params, data.x, data.y, batch_size,
                                 sharding)
  # The gather by client indices runs where the indices live (split by rows over
  # a mesh when the table is sharded).
  losses = jax.device_put(losses, data.client_indices.sharding
                          if hasattr(data.client_indices, "sharding")
                          else None)
  return per_client_mean(losses, data.client_indices, data.num_examples,
                         example_weights(data.y))


def member_rows(model: Model, params, test, num_classes: int,
                batch_size: int, *, stacked: bool = False, clients=None,
                clients_stacked: bool = False, extra=(),
                sharding=None) -> list[dict[str, float]]:
  """A run's evaluation rows: one per model.

  Args:
    model: the network.
    params: one model's params, or (``stacked``) S members' stacked along
      a leading axis.
    test: (x, y), scored as ``test_loss``, ``test_accuracy``,
      ``test_macro_f1`` (and ``test_perplexity``, exp of ``test_loss``,
      for per-token targets [M, T]).
    num_classes: of the labels.
    batch_size: examples per forward pass.
    stacked: ``params`` hold S members (one vmapped forward pass each
      batch).
    clients: a ``FederatedData`` whose clients' mean losses give
      ``client_loss_mean`` and ``client_loss_var``; None: not computed.
    clients_stacked: ``clients`` has a member axis on its indices and
      counts (each member's own partition).
    extra: ``(name, x, y)`` sets, each scored as the accuracy ``name``.
    sharding: where each batch goes (``map_batches``; one model only).

  Returns:
    One row per member (one row for one model).
  """
  fn = stacked_per_example_fn(model) if stacked else per_example_fn(model)

  def scored(x, y):
    losses, preds = map_batches(fn, params, x, y, batch_size, sharding)
    if not stacked:  # the same member axis for one model
      losses, preds = losses[None], preds[None]
    return losses, np.asarray(preds)

  test_losses, test_preds = scored(*test)
  mean = np.asarray(mean_loss(test_losses, test[1]))
  rows = []
  for m in range(mean.shape[0]):
    test_row = classification_metrics(test[1], test_preds[m], num_classes)
    test_row["loss"] = float(mean[m])
    if np.ndim(test[1]) == 2:  # per-token targets: a language model's
      # perplexity, exp of the mean token cross-entropy (inf past float).
      test_row["perplexity"] = (math.exp(test_row["loss"])
                                if test_row["loss"] < 709.0 else math.inf)
    rows.append({f"test_{k}": v for k, v in test_row.items()})
  if clients is not None:
    if stacked:
      losses, _ = scored(clients.x, clients.y)
      axis = 0 if clients_stacked else None
      per_client = jax.vmap(per_client_mean, in_axes=(0, axis, axis, None))(
          losses, clients.client_indices, clients.num_examples,
          example_weights(clients.y))
    else:
      per_client = client_losses(model, params, clients, batch_size,
                                 sharding)[None]
    per_client = np.asarray(per_client)
    for row, member in zip(rows, per_client, strict=True):
      row["client_loss_mean"] = float(member.mean())
      row["client_loss_var"] = float(member.var())
  for name, x, y in extra:
    _, preds = scored(jnp.asarray(x), jnp.asarray(y))
    for row, member in zip(rows, preds, strict=True):
      row[name] = classification_metrics(y, member, num_classes)["accuracy"]
  return rows


def per_client_mean(losses, client_indices, num_examples,
                    weights=None) -> jax.Array:
  """[M] pooled per-example values -> [N] mean over each client's rows.

  ``weights``: [M] per-example weights (``target_counts`` of the targets,
  so that a sequence client's mean is over its real tokens); None: every
  row weighs 1.
  """
  positions = jnp.arange(client_indices.shape[1])[None]
  # Padded index entries point at a real pooled example (0): they are masked by
  # position, never by what they index.
  mask = positions < num_examples[:, None]
  if weights is None:
    per_client = jnp.sum(jnp.where(mask, losses[client_indices], 0.0), 1)
    # num_examples >= 1 for every client (``FederatedData``), so no guard.
    return per_client / num_examples
  row_weights = jnp.where(mask, weights[client_indices], 0.0)
  per_client = jnp.sum(row_weights * losses[client_indices], 1)
  return per_client / jnp.maximum(jnp.sum(row_weights, 1), 1.0)


def mean_client_loss(model: Model, params: Params, x_all, y_all, indices,
                     num_examples, batch_size: int) -> jax.Array:
  """Mean task loss of ``params`` over one client's examples. -> [].

  Only the client's own batches are computed: ``indices`` is padded to the
  federation's largest client, and a loop over all of it would cost every
  client as much as the largest (on a natural federation of very unequal
  clients, many times the local training). The batches it skips are all
  padding, which weighs 0, so the value is the same.
  """
  width = indices.shape[0]
  batch_size = max(1, min(batch_size, width))  # no padding past one batch
  num_batches = -(-width // batch_size)
  padded = jnp.pad(indices, (0, num_batches * batch_size - width))
  positions = jnp.arange(num_batches * batch_size)
  # A traced trip count: a while_loop, since a scan's length must be static.
  own_batches = jnp.minimum(
      (jnp.asarray(num_examples, jnp.int32) + batch_size - 1) // batch_size,
      num_batches)

  def batch_loss(state):
    b, (total, weight) = state
    idx = jax.lax.dynamic_slice_in_dim(padded, b * batch_size, batch_size)
    pos = jax.lax.dynamic_slice_in_dim(positions, b * batch_size, batch_size)
    # Each example weighs its scored targets (1 for a class label).
    weights = (pos < num_examples).astype(jnp.float32) * target_counts(
        y_all[idx])
    logits, _ = model.apply(params, x_all[idx], False)
    losses = model.loss(logits, y_all[idx])
    return b + 1, (total + jnp.sum(losses * weights),
                   weight + jnp.sum(weights))

  _, (total, weight) = jax.lax.while_loop(
      lambda state: state[0] < own_batches, batch_loss,
      (jnp.int32(0), (jnp.zeros(()), jnp.zeros(()))))
  return total / jnp.maximum(weight, 1.0)
