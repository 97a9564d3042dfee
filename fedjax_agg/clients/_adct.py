"""ADCT: per-client learning rate and local epochs chosen by grid search.

Putra, Utama, Utami, Putra, "Enhancing Federated Learning Performance through
Adaptive Client Optimization with Hyperparameter Tuning", Journal of Applied
Data Sciences 5(2), 2024.

Algorithm 1, for client k at round t (1-based):

  line 16: search if  Acc_k <= mean accuracy  or  t mod s == 0;
  lines 17-22: train one candidate per (lr, epochs) of the grid, in order,
    and keep the first whose accuracy reaches the mean client accuracy of
    the last round (line 10), else the most accurate one;
  otherwise train with the configuration kept from before.

Every candidate of every participant is trained in ONE engine call (K x C
rows, row k*C + c = client k with configuration c; a client's candidates
share its data order) and evaluated in one vmapped pass; the choice above is
then made for all clients at once (``select_configs``), and equals the
sequential loop's.

Interpretation choices (each an option, the default first):

* The trigger of line 16 (``threshold_mode``): "mean", as printed in
  Algorithm 1: Acc_k <= the mean client accuracy of the last round (gamma
  is then unused); the text's gamma reading, "absolute": Acc_k <= gamma /
  100; or "relative": Acc_k <= (gamma / 100) * mean accuracy.
* Round 1 (``round_one``): the success target (the last round's mean
  accuracy) does not exist yet. "best": every client searches the whole
  grid and keeps its most accurate candidate; "first": the target is taken
  as 0, so every client keeps grid[0] (the smallest learning rate of
  Table 1; the earlier reading, kept for comparison).
* Acc_k is, by default, the accuracy of the model client k kept the last
  time it trained (line 18 overwrites it; ``trigger_accuracy="last"``), or,
  with "global", the incoming global model's accuracy on the client's data.
  A client that has no configuration yet always searches.
* Accuracies are measured on ``eval_data``: the held-out part of each
  client's own examples (``validation.holdout_split``), its training data,
  or a balanced validation set held by the server (the same examples for
  every client, ``drivers.run_adct(measure_on="server")``): with one class
  per client a client's own split saturates near 100 % and cannot tell the
  candidates apart.
* The grid (Table 1: lr in {1e-5, 1e-4, 1e-3} x epochs in {1, 2}, batch 32)
  is searched epochs-major: (1e-5, 1), (1e-4, 1), (1e-3, 1), (1e-5, 2), ...
  (pass ``grid=DEFAULT_GRID[::-1]`` for the reversed-order control).
  Table 1's early stopping (patience 1) never stops a run of at most 2
  epochs, so it is not modelled.
"""

from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg.config import LocalTraining, OptimizerFactory
from fedjax_agg import tree_math
from fedjax_agg.validation import client_accuracies
from fedjax_agg.types import LocalObjective, Model

DEFAULT_GRID = tuple((lr, e) for e in (1, 2) for lr in (1e-5, 1e-4, 1e-3))
"""ADCT's default candidate configurations, the paper's Table 1: ``(learning
rate, local epochs)`` pairs, epochs-major (learning rates 1e-5, 1e-4, 1e-3 with
1 epoch, then with 2)."""
THRESHOLD_MODES = ("mean", "absolute", "relative")
ROUND_ONE = ("best", "first")
TRIGGER_ACCURACIES = ("last", "global")


class ADCTState(NamedTuple):
  """Per-client ADCT state, stacked over all N clients.

  Attributes:
    config_index: [N] int32 index into the grid, -1 before the first search.
    accuracy: [N] float32 accuracy of the model each client last kept.
    mean_accuracy: [] float32 mean kept accuracy of the last round's cohort
      (NaN before the first round: no target yet).
  """
  config_index: jax.Array
  accuracy: jax.Array
  mean_accuracy: jax.Array


class ADCTOutput(NamedTuple):
  """One round of ADCT for a cohort of K clients (C grid configurations).

  Attributes:
    local: ``engine.LocalResult`` [K] of the kept configuration.
    config_index: [K] int32 kept configuration.
    learning_rate: [K] its learning rate.
    local_epochs: [K] int32 its local epochs.
    searched: [K] bool, the client ran the grid search this round.
    accuracy: [K] accuracy of the kept model.
    candidate_accuracy: [K, C] accuracy of every trained candidate (NaN
      where a configuration was not trained).
  """
  local: engine.LocalResult
  config_index: jax.Array
  learning_rate: jax.Array
  local_epochs: jax.Array
  searched: jax.Array
  accuracy: jax.Array
  candidate_accuracy: jax.Array


class ADCT(NamedTuple):
  """``init(num_clients) -> ADCTState`` and the jitted client side of a
  round, ``train(state, global_params, data, eval_data, client_ids, mask,
  round, key) -> (ADCTOutput, new_state, metrics)``; ``grid`` the
  (learning rate, epochs) pairs in search order."""
  init: Callable[[int], ADCTState]
  train: Callable[..., tuple[ADCTOutput, ADCTState, dict]]
  grid: tuple[tuple[float, int], ...]


def select_configs(candidate_accuracy: jax.Array, target: jax.Array,
                   searching: jax.Array, previous: jax.Array) -> jax.Array:
  """Lines 17-22 for all clients: the configuration each one keeps.

  Args:
    candidate_accuracy: [K, C] accuracy of each configuration, grid order.
    target: [] mean accuracy to reach (NaN: none; the most accurate is
      kept).
    searching: [K] bool.
    previous: [K] int32 configuration kept so far (used when not searching).

  Returns:
    [K] int32: the first configuration reaching ``target``, else the most
    accurate (first of equals); ``previous`` for clients not searching.
  """
  # A NaN target (no last round yet) compares False everywhere, so every
  # searching client falls back to its most accurate candidate. argmax takes
  # the first maximal index, i.e. the first in grid order, as the sequential
  # loop of Algorithm 1 would stop at.
  reached = candidate_accuracy >= target
  first_reached = jnp.argmax(reached, axis=1)
  best = jnp.argmax(candidate_accuracy, axis=1)
  found = jnp.where(jnp.any(reached, axis=1), first_reached, best)
  return jnp.where(searching, found, previous).astype(jnp.int32)


def search_mask(previous: jax.Array, accuracy: jax.Array,
                mean_accuracy: jax.Array, round_num: jax.Array,
                accuracy_threshold: float, search_step: int,
                threshold_mode: str = "mean") -> jax.Array:
  """Line 16 for all clients: who runs the grid search this round.

  Args:
    previous: [K] int32 kept configuration, -1 for none yet.
    accuracy: [K] the clients' current accuracy Acc_k.
    mean_accuracy: [] mean accuracy of the last round.
    round_num: [] int, t (1-based).
    accuracy_threshold: gamma, in percent.
    search_step: s.
    threshold_mode: "mean" (Acc_k <= mean_accuracy, Algorithm 1),
      "absolute" (Acc_k <= gamma / 100) or "relative" (Acc_k <= gamma /
      100 * mean_accuracy). A NaN mean (before round 1) triggers nothing.

  Returns:
    [K] bool: no configuration yet, or at or below the threshold, or
    t mod s == 0.
  """
  # threshold_mode is a Python string fixed when ADCT is built, so this
  # branch is resolved at trace time and adds nothing to the jitted round.
  if threshold_mode == "mean":
    limit = mean_accuracy
  else:
    limit = accuracy_threshold / 100.0
    if threshold_mode == "relative":
      limit = limit * mean_accuracy
  # A NaN limit (round one, "mean" or "relative") triggers no one by itself;
  # every client still searches then, since none has a configuration yet.
  return ((previous < 0) | (accuracy <= limit)
          | (round_num % search_step == 0))


def _checked_grid(grid) -> tuple[tuple[float, int], ...]:
  """The grid as (float learning rate > 0, int epochs >= 1) pairs."""
  pairs = tuple(grid)
  if not pairs:
    raise ValueError("grid must be a non-empty sequence of (learning_rate, "
                     "epochs) pairs, got an empty one")
  for i, pair in enumerate(pairs):
    if len(pair) != 2:
      raise ValueError(f"grid[{i}] must be a (learning_rate, epochs) pair, "
                       f"got {pair!r}")
    checks.check_range(f"grid[{i}] learning rate", pair[0], 0, low_open=True)
    checks.check_int(f"grid[{i}] epochs", pair[1], 1)
  return tuple((float(lr), int(e)) for lr, e in pairs)


def adct(model: Model, *, accuracy_threshold: float = 50.0,
         search_step: int = 5,
         grid: Sequence[tuple[float, int]] = DEFAULT_GRID,
         batch_size: int = 32, threshold_mode: str = "mean",
         round_one: str = "best", trigger_accuracy: str = "last",
         objective: Optional[LocalObjective] = None,
         client_optimizer: OptimizerFactory = optax.sgd,
         clients_per_step: int = 8, eval_batch_size: int = 256,
         mesh: Optional[jax.sharding.Mesh] = None) -> ADCT:
  """Builds ADCT's client side.

  Args:
    model: the network.
    accuracy_threshold: gamma in percent, in [0, 100] (paper: 25, 50, 75);
      read by the "absolute" and "relative" threshold modes only.
    search_step: s >= 1, every s-th round all participants search.
    grid: (learning rate, local epochs) pairs, in search order.
    batch_size: local minibatch size (Table 1: 32).
    threshold_mode: "mean", "absolute" or "relative" (module docstring).
    round_one: "best" or "first" (module docstring).
    trigger_accuracy: "last" or "global" (see the module docstring).
    objective, client_optimizer, clients_per_step, eval_batch_size, mesh:
      see ``engine.make_local_trainer``; ``clients_per_step`` counts
      (client, configuration) rows.
  """
  checks.check_range("accuracy_threshold", accuracy_threshold, 0, 100,
                     expected="in [0, 100] (percent)")
  checks.check_int("search_step", search_step, 1)
  for name, value in (("batch_size", batch_size),
                      ("clients_per_step", clients_per_step),
                      ("eval_batch_size", eval_batch_size)):
    checks.check_int(name, value, 1)
  grid = _checked_grid(grid)
  checks.check_choice("threshold_mode", threshold_mode, THRESHOLD_MODES)
  checks.check_choice("round_one", round_one, ROUND_ONE)
  checks.check_choice("trigger_accuracy", trigger_accuracy,
                      TRIGGER_ACCURACIES)
  num_configs = len(grid)
  grid_lrs = jnp.array([lr for lr, _ in grid], jnp.float32)
  grid_epochs = jnp.array([e for _, e in grid], jnp.int32)
  # One trainer sized for the longest candidate: a shorter one is the same
  # program with a smaller step budget, so all C candidates share one
  # compilation and run in one call.
  trainer = engine.make_local_trainer(
      model, LocalTraining(epochs=max(e for _, e in grid),
                           batch_size=batch_size, optimizer=client_optimizer,
                           objective=objective,
                           eval_batch_size=eval_batch_size),
      clients_per_step=clients_per_step, mesh=mesh)
  accuracies = lambda params, data, rows: client_accuracies(
      model, params, data, rows, eval_batch_size, clients_per_step)

  def init(num_clients: int) -> ADCTState:
    # The initial target decides round one: NaN means "no target", so each
    # client keeps its most accurate candidate ("best"); 0.0 is reached by
    # every candidate, so each keeps grid[0] ("first").
    return ADCTState(jnp.full((num_clients,), -1, jnp.int32),
                     jnp.zeros((num_clients,), jnp.float32),
                     jnp.full((), jnp.nan if round_one == "best" else 0.0,
                              jnp.float32))

  @jax.jit
  def train(state, global_params, data, eval_data, client_ids, mask,
            round_num, key):
    num_clients = client_ids.shape[0]
    real = mask > 0
    # Padding rows may carry any id: an out-of-range one reads as a client with
    # no configuration, and nothing of a padding row is written back below.
    previous = tree_math.gather_clients(state.config_index, client_ids, -1)
    if trigger_accuracy == "last":
      current = tree_math.gather_clients(state.accuracy, client_ids, 0.0)
    else:
      current = accuracies(
          tree_math.broadcast_to_clients(global_params, num_clients),
          eval_data, client_ids)
    # Line 16.
    searching = search_mask(previous, current, state.mean_accuracy,
                            round_num, accuracy_threshold, search_step,
                            threshold_mode)
    # A client that does not search trains only its kept configuration, and
    # padding rows train none. Rows not needed stay in the [K * C] layout
    # (shapes are fixed under jit) and run 0 steps instead.
    needed = searching[:, None] | (
        jnp.arange(num_configs)[None, :] == previous[:, None])
    needed = needed & real[:, None]
    # Row k * C + c is client k with configuration c: ids repeated, grid
    # tiled. The same id on all C rows gives a client's candidates one data
    # order, so they differ only in learning rate and epochs.
    rows = jnp.repeat(client_ids, num_configs)
    steps = jnp.tile(grid_epochs, num_clients) * engine.steps_per_epoch(
        data.num_examples[rows], batch_size)
    local = trainer(global_params, data, rows, jnp.tile(grid_lrs, num_clients),
                    jnp.where(needed.ravel(), steps, 0), key)
    candidate_accuracy = accuracies(local.client_params, eval_data,
                                    rows).reshape(num_clients, num_configs)
    # Lines 17-22.
    chosen = select_configs(candidate_accuracy, state.mean_accuracy,
                            searching, previous)
    # Row (k, chosen[k]) of every [K * C, ...] leaf: the kept candidate's
    # model, losses and step count.
    pick = lambda a: a.reshape((num_clients, num_configs) + a.shape[1:])[
        jnp.arange(num_clients), chosen]
    kept = jax.tree.map(pick, local)
    accuracy = pick(candidate_accuracy.ravel())
    # Line 10: mean accuracy over this round's participants.
    weights = real.astype(jnp.float32)
    # A cohort of padding only keeps the last target instead of a 0 / 0.
    mean = jnp.where(jnp.any(real), jnp.sum(jnp.where(real, accuracy, 0.0))
                     / jnp.maximum(jnp.sum(weights), 1.0),
                     state.mean_accuracy)
    new_state = ADCTState(
        tree_math.scatter_clients(state.config_index, client_ids, weights,
                                  chosen),
        tree_math.scatter_clients(state.accuracy, client_ids, weights,
                                  accuracy), mean)
    # Candidates that ran 0 steps were evaluated on the global model; NaN
    # marks them as not trained.
    output = ADCTOutput(kept, chosen, grid_lrs[chosen], grid_epochs[chosen],
                        searching & real, accuracy,
                        jnp.where(needed, candidate_accuracy, jnp.nan))
    metrics = {"adct_mean_accuracy": mean,
               "adct_num_searching": jnp.sum(searching & real)}
    return output, new_state, metrics

  return ADCT(init, train, grid)
