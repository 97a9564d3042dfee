"""Personalised evaluation: each client's own model on its held-out split.

Two kinds of "own model":

* the client algorithm's personal model (``LocalUpdate.personalize``:
  Ditto's v_k, FedBN's global model with the client's BatchNorm leaves);
* the global model fine-tuned for ``steps`` local steps on the client's
  training data (any algorithm; the same engine program as local training,
  at the given learning rate).

Either is evaluated on the client's examples in ``validation`` (see
``validation.holdout_split``), every client of the federation, in blocks of
``block`` clients so that at most ``block`` models exist at a time.
"""

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import engine
from fedjax_agg.config import LocalTraining
from fedjax_agg.federated import FederatedData
from fedjax_agg.types import Model, Params
from fedjax_agg.validation import client_accuracies

__all__ = ["finetuned_accuracies", "personal_accuracies", "summarize"]


def _blocks(num_clients: int, block: int):
  for start in range(0, num_clients, block):
    yield jnp.arange(start, min(start + block, num_clients), dtype=jnp.int32)


def personal_accuracies(model: Model, personalize: Callable[..., Params],
                        client_state, global_params: Params,
                        validation: FederatedData, block: int = 128,
                        batch_size: int = 256) -> np.ndarray:
  """[N] accuracy of each client's personal model on its validation
  examples."""
  accuracy = jax.jit(lambda state, params, ids: client_accuracies(
      model, personalize(state, params, ids), validation, ids, batch_size))
  return np.concatenate([
      np.asarray(accuracy(client_state, global_params, ids))
      for ids in _blocks(validation.num_clients, block)])


def finetuned_accuracies(model: Model, training: LocalTraining,
                         global_params: Params, data: FederatedData,
                         steps: int, key, block: int = 128,
                         batch_size: int = 256,
                         trainer: Optional[Callable] = None) -> np.ndarray:
  """[N] accuracy on ``data.validation`` of the global model after
  ``steps`` local steps of ``training`` on each client's training data."""
  if data.validation is None:
    raise ValueError("finetuned_accuracies needs data with a validation "
                     "split (FederatedData.with_validation)")
  train = trainer or engine.make_local_trainer(model, training)

  @jax.jit
  def accuracy(params, ids):
    count = ids.shape[0]
    local = train(params, data, ids,
                  jnp.full((count,), training.learning_rate, jnp.float32),
                  jnp.full((count,), steps, jnp.int32), key)
    return client_accuracies(model, local.client_params, data.validation,
                             ids, batch_size)
  return np.concatenate([np.asarray(accuracy(global_params, ids))
                         for ids in _blocks(data.num_clients, block)])


def summarize(prefix: str, accuracies: np.ndarray) -> dict[str, float]:
  """Mean, standard deviation and 10th percentile across clients."""
  return {f"{prefix}_mean": float(np.mean(accuracies)),
          f"{prefix}_std": float(np.std(accuracies)),
          f"{prefix}_p10": float(np.percentile(accuracies, 10))}
