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

import functools
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
  # The last block is shorter when ``block`` does not divide N; it compiles
  # once more rather than evaluating padded clients.
  for start in range(0, num_clients, block):
    yield jnp.arange(start, min(start + block, num_clients), dtype=jnp.int32)


# Functions cannot be traced: as static arguments they key the
# compilation cache, so a run's repeated evaluations compile once per
# (model, personalize, block shape).
@functools.partial(jax.jit, static_argnames=("model", "personalize",
                                             "batch_size"))
def _personal_block(client_state, global_params, validation, ids, *, model,
                    personalize, batch_size):
  return client_accuracies(model, personalize(client_state, global_params,
                                              ids), validation, ids,
                           batch_size)


@functools.partial(jax.jit, static_argnames=("model", "train",
                                             "batch_size"))
def _finetuned_block(params, data, ids, learning_rate, steps, key, *, model,
                     train, batch_size):
  count = ids.shape[0]
  local = train(params, data, ids,
                jnp.full((count,), learning_rate, jnp.float32),
                jnp.full((count,), steps, jnp.int32), key)
  return client_accuracies(model, local.client_params, data.validation, ids,
                           batch_size)


def personal_accuracies(model: Model, personalize: Callable[..., Params],
                        client_state, global_params: Params,
                        validation: FederatedData, block: int = 128,
                        batch_size: int = 256) -> np.ndarray:
  """[N] accuracy of each client's personal model on its validation
  examples. Compiled once per (model, personalize, block shape): later
  evaluations of a run reuse it."""
  return np.concatenate([
      np.asarray(_personal_block(client_state, global_params, validation,
                                 ids, model=model, personalize=personalize,
                                 batch_size=batch_size))
      for ids in _blocks(validation.num_clients, block)])


def finetuned_accuracies(model: Model, training: LocalTraining,
                         global_params: Params, data: FederatedData,
                         steps: int, key, block: int = 128,
                         batch_size: int = 256,
                         trainer: Optional[Callable] = None) -> np.ndarray:
  """[N] accuracy on ``data.validation`` of the global model after
  ``steps`` local steps of ``training`` on each client's training data.

  ``trainer``: the engine's trainer for ``training``, built once by a
  caller that evaluates repeatedly (else one is built, and compiled, per
  call)."""
  if data.validation is None:
    raise ValueError("finetuned_accuracies needs data with a validation "
                     "split (FederatedData.with_validation)")
  train = trainer or engine.make_local_trainer(model, training)
  return np.concatenate([
      np.asarray(_finetuned_block(
          global_params, data, ids, training.learning_rate, steps, key,
          model=model, train=train, batch_size=batch_size))
      for ids in _blocks(data.num_clients, block)])


def summarize(prefix: str, accuracies: np.ndarray) -> dict[str, float]:
  """Mean, standard deviation and 10th percentile across clients."""
  return {f"{prefix}_mean": float(np.mean(accuracies)),
          f"{prefix}_std": float(np.std(accuracies)),
          f"{prefix}_p10": float(np.percentile(accuracies, 10))}
