"""Evaluation of global models: test metrics and per-client losses.

Every function here reads the model's task loss (``Model.loss``) and its
prediction ``argmax(outputs, -1)``; batches have a fixed size (the last one
padded) so each function compiles once per model and batch size.

* ``evaluate``: test loss, accuracy and macro-F1 of one model;
* ``client_losses``: one model's mean loss on every client's training data;
* ``per_example_fn`` / ``map_batches``: the batched pieces, also vmapped
  over the members of a sweep (``stacked_per_example_fn``).
"""

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg.federated import FederatedData
from fedjax_agg.types import Model, Params

__all__ = ["classification_metrics", "client_losses", "evaluate",
           "map_batches", "per_client_mean", "per_example_fn",
           "per_example_losses", "stacked_per_example_fn"]

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
  compiles once) and concatenates along the last axis: [..., M] each (a
  leading axis is kept, e.g. the members of a sweep). ``sharding``: where
  each batch goes (e.g. split over the devices of a mesh, ``params``
  replicated there): the forward passes then run on every device.
  """
  if sharding is not None:
    devices = len(sharding.device_set)
    batch_size = -(-batch_size // devices) * devices
  total = x.shape[0]
  losses, preds = [], []
  for start in range(0, total, batch_size):
    xb = x[start:start + batch_size]
    yb = y[start:start + batch_size]
    short = batch_size - xb.shape[0]
    if short:  # pad the last batch so the function compiles once
      xb = jnp.concatenate([xb, jnp.zeros((short,) + xb.shape[1:], xb.dtype)])
      yb = jnp.concatenate([yb, jnp.zeros((short,), yb.dtype)])
    if sharding is not None:
      xb, yb = jax.device_put((xb, yb), sharding)
    loss_b, pred_b = fn(params, xb, yb)
    losses.append(loss_b[..., :batch_size - short])
    preds.append(pred_b[..., :batch_size - short])
  return jnp.concatenate(losses, -1), jnp.concatenate(preds, -1)


def per_example_losses(model: Model, params: Params, x, y,
                       batch_size: int = 2048, sharding=None):
  """Per-example loss and prediction of ``params`` on (x, y). -> [M], [M].

  ``sharding``: see ``map_batches``."""
  return map_batches(per_example_fn(model), params, x, y, batch_size,
                     sharding)


def classification_metrics(labels, predictions, num_classes: int
                           ) -> dict[str, float]:
  """Accuracy and macro-F1 (mean over classes present in labels or preds)."""
  labels = np.asarray(labels)
  predictions = np.asarray(predictions)
  confusion = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(confusion, (labels, predictions), 1)
  tp = np.diag(confusion).astype(np.float64)
  fp = confusion.sum(0) - tp
  fn = confusion.sum(1) - tp
  present = (tp + fp + fn) > 0
  denom = 2 * tp + fp + fn
  f1 = np.where(denom > 0, 2 * tp / np.where(denom > 0, denom, 1), 0.0)
  return {"accuracy": float(np.mean(labels == predictions)),
          "macro_f1": float(f1[present].mean()) if present.any() else 0.0}


def evaluate(model: Model, params: Params, x, y, num_classes: int,
             batch_size: int = 2048, sharding=None) -> dict[str, float]:
  """Test loss, accuracy and macro-F1 of ``params`` on (x, y).

  ``sharding``: see ``map_batches``."""
  losses, preds = per_example_losses(model, params, x, y, batch_size,
                                     sharding)
  out = classification_metrics(y, preds, num_classes)
  out["loss"] = float(jnp.mean(losses))
  return out


def client_losses(model: Model, params: Params, data: FederatedData,
                  batch_size: int = 2048, sharding=None) -> jax.Array:
  """Mean loss of ``params`` on each client's training data. -> [N].

  Computes each pooled example's loss once, then averages per client.
  ``sharding``: see ``map_batches``.
  """
  losses, _ = per_example_losses(model, params, data.x, data.y, batch_size,
                                 sharding)
  losses = jax.device_put(losses, data.client_indices.sharding
                          if hasattr(data.client_indices, "sharding")
                          else None)
  return per_client_mean(losses, data.client_indices, data.num_examples)


def per_client_mean(losses, client_indices, num_examples) -> jax.Array:
  """[M] pooled per-example values -> [N] mean over each client's rows."""
  positions = jnp.arange(client_indices.shape[1])[None]
  mask = positions < num_examples[:, None]
  per_client = jnp.sum(jnp.where(mask, losses[client_indices], 0.0), 1)
  return per_client / num_examples
