"""Rounds whose local training is ADCT's per-client grid search.

``make_round_fn`` is ``simulation.make_round_fn`` with the client side
replaced by ``ADCT.train`` (which needs each client's validation split and
carries per-client state between rounds); ``run`` drives R rounds and
records, per round, every participant's chosen learning rate and epochs.
"""

import time
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import tqdm.auto as tqdm

from fedjax_agg import aggregators
from fedjax_agg import simulation
from fedjax_agg import validation
from fedjax_agg.client_selection._adct import ADCT, ADCTState
from fedjax_agg.federated import FederatedData
from fedjax_agg.types import Aggregator, ClientInfo, Model, Params

MEASURE_ON = ("validation", "train")


def make_round_fn(aggregator: Aggregator, tuner: ADCT):
  """Builds one jitted FL round with ADCT clients.

  Returns:
    ``round_fn(state, adct_state, data, eval_data, cohort, mask) ->
    (new_state, new_adct_state, simulation.RoundOutput)``; the output's
    metrics hold the aggregator's metrics and, per client [K],
    ``adct_learning_rate``, ``adct_local_epochs``, ``adct_searched`` and
    ``adct_accuracy`` (plus scalar ``adct_mean_accuracy``,
    ``adct_num_searching``).
  """

  @jax.jit
  def round_fn(state: simulation.ServerState, adct_state: ADCTState,
               data: FederatedData, eval_data: FederatedData, cohort, mask):
    key, train_key, agg_key = jax.random.split(state.key, 3)
    mask = mask.astype(jnp.float32)
    round_num = state.round + 1
    out, adct_state, adct_metrics = tuner.train(
        adct_state, state.params, data, eval_data, cohort, mask, round_num,
        train_key)
    local = out.local
    info = ClientInfo(
        client_ids=cohort,
        num_examples=data.num_examples[cohort].astype(jnp.float32),
        mask=mask, loss_before=local.loss_before,
        loss_after=local.loss_after, round=round_num, key=agg_key)
    new_params, agg_state, metrics = aggregator.aggregate(
        state.params, local.client_params, info, state.aggregator_state)
    metrics = {**metrics, **adct_metrics,
               "adct_learning_rate": out.learning_rate,
               "adct_local_epochs": out.local_epochs,
               "adct_searched": out.searched, "adct_accuracy": out.accuracy}
    train_loss = jnp.sum(local.train_loss * mask) / jnp.maximum(
        jnp.sum(mask), 1.0)
    new_state = simulation.ServerState(new_params, agg_state, round_num, key)
    return new_state, adct_state, simulation.RoundOutput(
        cohort, mask, local.loss_before, local.loss_after, local.steps_taken,
        train_loss, metrics)

  return round_fn


class ADCTRunResult(NamedTuple):
  history: simulation.History
  state: simulation.ServerState
  adct_state: ADCTState


def run(model: Model, data: FederatedData, test_data: tuple[Any, Any],
        aggregator: Aggregator, tuner: ADCT, *, num_rounds: int,
        num_classes: int, participation: float = 1.0,
        measure_on: str = "validation", validation_fraction: float = 0.2,
        split_seed: int = 0, seed: int = 0,
        init_params: Optional[Params] = None, eval_every: int = 1,
        progress: bool = True, config: Optional[dict] = None
        ) -> ADCTRunResult:
  """Runs ``num_rounds`` rounds of FL with ADCT clients.

  Args:
    model, data, test_data, aggregator, num_rounds, num_classes,
      participation, seed, init_params, eval_every, progress, config: as in
      ``simulation.run``.
    tuner: the ADCT client side (``adct.adct(model, ...)``).
    measure_on: where client accuracy is measured: "validation" (a held-out
      ``validation_fraction`` of each client's examples, split with
      ``split_seed``, not used for training) or "train" (its training data).

  Returns:
    ``ADCTRunResult(history, state, adct_state)``; each of
    ``history.client_rows`` holds the cohort's ``adct_learning_rate``,
    ``adct_local_epochs``, ``adct_searched`` and ``adct_accuracy``.
  """
  if not isinstance(num_rounds, int) or num_rounds < 0:
    raise ValueError(f"num_rounds must be an int >= 0, got {num_rounds!r}")
  if not isinstance(eval_every, int) or eval_every < 1:
    raise ValueError(f"eval_every must be an int >= 1, got {eval_every!r}")
  if measure_on not in MEASURE_ON:
    raise ValueError(
        f"measure_on must be one of {MEASURE_ON}, got {measure_on!r}")
  if measure_on == "validation":
    data, eval_data = validation.holdout_split(data, validation_fraction,
                                               split_seed)
  else:
    eval_data = data
  cohort_size = simulation.num_sampled(data.num_clients, participation)
  init_key, run_key = jax.random.split(jax.random.key(seed))
  params = model.init(init_key) if init_params is None else init_params
  state = simulation.init_state(params, aggregator)._replace(key=run_key)
  adct_state = tuner.init(data.num_clients)
  round_fn = make_round_fn(aggregator, tuner)
  test_x, test_y = (jnp.asarray(a) for a in test_data)
  sample_keys = jax.random.split(jax.random.fold_in(run_key, 1),
                                 max(num_rounds, 1))
  mask = jnp.ones((cohort_size,), jnp.float32)

  def evaluate(state):
    params = aggregators.eval_params(state.aggregator_state, state.params)
    metrics = simulation.evaluate(model, params, test_x, test_y, num_classes)
    return {f"test_{k}": v for k, v in metrics.items()}

  rows = [{"round": 0, "time_s": 0.0, **evaluate(state)}]
  client_rows = []
  for r in tqdm.trange(num_rounds, disable=not progress, desc="rounds"):
    start = time.perf_counter()
    cohort = simulation.sample_cohort(sample_keys[r], data.num_clients,
                                      cohort_size)
    state, adct_state, out = round_fn(state, adct_state, data, eval_data,
                                      cohort, mask)
    jax.block_until_ready(state.params)
    row = {"round": r + 1, "time_s": time.perf_counter() - start,
           "train_loss": float(out.train_loss)}
    if (r + 1) % eval_every == 0 or r + 1 == num_rounds:
      row.update(evaluate(state))
    row.update({k: float(v) for k, v in out.metrics.items()
                if jnp.ndim(v) == 0})
    rows.append(row)
    client_rows.append({"round": r + 1,
                        "client_ids": np.asarray(out.client_ids),
                        "steps_taken": np.asarray(out.steps_taken),
                        **{k: np.asarray(v) for k, v in out.metrics.items()
                           if jnp.ndim(v) > 0}})
  run_config = {"num_rounds": num_rounds, "participation": participation,
                "cohort_size": cohort_size, "measure_on": measure_on,
                "validation_fraction": validation_fraction, "seed": seed,
                "grid": tuner.grid, "num_clients": data.num_clients}
  run_config.update(config or {})
  return ADCTRunResult(
      simulation.History(rows, client_rows, run_config), state, adct_state)
