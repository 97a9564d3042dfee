"""The data loss and the composition of a local objective with a model."""

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_agg.types import Batch, LocalObjective, Model, Params
from fedjax_agg.types import target_counts


def masked_cross_entropy(logits: jax.Array, labels: jax.Array,
                         mask: jax.Array) -> jax.Array:
  """Mean softmax cross-entropy over the real examples of a batch.

  Args:
    logits: [B, C].
    labels: [B] int.
    mask: [B], 1 for a real example, 0 for padding.

  Returns:
    [] sum(mask * ce) / max(sum(mask), 1).
  """
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def cross_entropy() -> LocalObjective:
  """Plain local empirical risk (FedAvg's local objective): no penalty."""

  def prepare(params, global_params):
    del params, global_params
    return ()

  def penalty(params, global_params, context):
    del params, global_params, context
    return jnp.zeros(())

  # proximal_mu=0 declares that there is no proximal term, which a run
  # needs before it pairs this objective with FedNova's normaliser.
  return LocalObjective(prepare, penalty, proximal_mu=0.0)


def local_loss(model: Model, objective: LocalObjective
              ) -> Callable[..., tuple[jax.Array, Params]]:
  """The full local objective as one pure function of one client's params.

  Returns:
    ``loss(params, batch, global_params, context) -> (loss, new_params)``
    with ``batch = {'x': [B, ...], 'y': [B] (or [B, T] per-token
    targets), 'mask': [B]}``; ``new_params``
    carries updated non-trainable collections (BatchNorm statistics).
  """

  def loss(params: Params, batch: Batch, global_params: Params, context):
    outputs, new_params = model.apply(params, batch["x"], True)
    # The model's task loss, averaged over the batch's real examples (for
    # per-token targets: over their real tokens).
    weights = batch["mask"] * target_counts(batch["y"])
    data_loss = jnp.sum(model.loss(outputs, batch["y"]) * weights) / (
        jnp.maximum(jnp.sum(weights), 1.0))
    return data_loss + objective.penalty(params, global_params,
                                         context), new_params

  return loss
