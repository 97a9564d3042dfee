"""Heterogeneous LoRA ranks on the clients: truncation and self-pruning.

Cho, Liu, Xu, Fahrezi, Joshi, "Heterogeneous LoRA for Federated
Fine-tuning of On-Device Foundation Models", EMNLP 2024 (HetLoRA); the
same truncation serves FLoRA's heterogeneous ranks (Wang et al., NeurIPS
2024).

Client k has rank r_k <= r_max (the model's rank, ``models.lora``). Round
t, client k of the cohort:

  start_k = trunc(W_t, r_k)           (rows of A, columns of B past r_k
                                       zero)                          # Eq. (1)
  W_k = local training from start_k;  sent_k = trunc(W_k, r_k)        # Eq. (2)

Zero components of both A and B receive no gradient, so the client trains
exactly its r_k components; the truncation of what it sends removes what a
local objective (FedProx's pull, weight decay) could have moved past r_k.
The local objective reads the client's own start (``reference``), not the
global adapters it never holds.

Rank self-pruning (``self_pruning=gamma``, HetLoRA's Sec. 3.2, as
reconstructed here): the local loss gains the regulariser

  lambda sum_l ||B_l[:, T]||_F ||A_l[T, :]||_F,
  T = [floor(gamma r_k), r_k)  (the last components)                  # Eq. (3)

and after local training the client prunes them, r_k <- max(floor(gamma
r_k), 1), when that norm ended smaller than it started (the regulariser
won over the data), zeroing them before it sends (Eq. (2) with the new
rank). Pruned ranks are the client's state (``LoRARanksState.ranks``,
[N] by client id); they only decrease.

Every client scales its update by alpha / r_max (the model's scale), not
by alpha / r_k. A rank-1 client never prunes: max(floor(gamma), 1) = 1,
though the regulariser of Eq. (3) (T = [0, 1)) still acts on its one
component.

Interpretation choices: the paper's exact pruning test is not restated
here; "smaller at the end of local training than at its start" is the
reading taken (a client that has never moved its tail, B = 0 at the start,
cannot prune). ``loss_after`` is that of the trained model before pruning.
"""

import dataclasses
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg import registry
from fedjax_agg import tree_math
from fedjax_agg.clients import _common
from fedjax_agg.config import LocalTraining
from fedjax_agg.models import lora
from fedjax_agg.types import LocalObjective, LocalUpdate, Model

__all__ = ["LoRARanksState", "lora_ranks"]


class LoRARanksState(NamedTuple):
  """The clients' ranks: ``ranks`` [N] int32, by client id."""
  ranks: jax.Array


def _norm(x):
  # ||x||_F with a finite gradient at x = 0.
  total = jnp.sum(jnp.square(x))
  positive = total > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, total, 1.0)), 0.0)


def tail_masks(adapters, tail):
  """1 on the components of ``tail`` ([r] 0/1) of every A (rows) and B
  (columns), 0 elsewhere: a tree shaped like ``adapters`` (one client)."""
  nodes = {}
  for path, node in lora.check_adapters(adapters, "lora_ranks").items():
    # Leaves other than A and B (FLoRA's "merged") hold no rank component:
    # their masks stay zero.
    masks = {name: jnp.zeros_like(leaf) for name, leaf in node.items()}
    masks["b"] = jnp.broadcast_to(tail[None, :], node["b"].shape)
    masks["a"] = jnp.broadcast_to(tail[:, None], node["a"].shape)
    nodes[path] = masks
  return {lora.ADAPTERS: nodes}


def tail_norm(adapters, masks) -> jax.Array:
  """Eq. (3)'s sum_l ||B_l[:, T]||_F ||A_l[T, :]||_F, T given by
  ``tail_masks``."""
  total = 0.0
  for path, node in lora.check_adapters(adapters, "lora_ranks",
                                        need=("a", "b")).items():
    mask = masks[lora.ADAPTERS][path]
    total = total + _norm(node["b"] * mask["b"]) * _norm(
        node["a"] * mask["a"])
  return total


def _tail(rank, r_max: int, gamma: float):
  # A 0/1 vector over all r_max components rather than a slice: ``rank`` is
  # traced (one per client under vmap), and shapes cannot depend on it.
  keep = jnp.floor(gamma * rank).astype(jnp.int32)
  components = jnp.arange(r_max)
  return ((components >= keep) & (components < rank)).astype(jnp.float32)


def _pruning_objective(strength: float) -> LocalObjective:
  """Eq. (3) as a local objective whose reference is the tail mask."""
  def prepare(params, reference):
    del params, reference
    return ()

  def penalty(params, reference, context):
    del context
    return strength * tail_norm(params, reference)

  # The tail mask travels as the trainer's per-client reference, so one
  # compiled objective serves every client's rank.
  return LocalObjective(prepare, penalty)


def _no_term(objective) -> bool:
  """Whether a local objective declares that it adds nothing to the loss
  (``proximal_mu`` 0 and no proximal step: plain cross-entropy)."""
  return (isinstance(objective, LocalObjective)
          and objective.proximal is None
          and isinstance(objective.proximal_mu, (int, float))
          and objective.proximal_mu == 0)


def check_arguments(arguments, run) -> None:
  """The capability that checks a description's ``client_args`` of
  ``lora_ranks`` against the run (``registry.Capabilities``): ``ranks``,
  one int in [1, rank] per client id of the federation's N; with
  ``self_pruning``, gamma in (0, 1) and the plain "cross_entropy"
  objective (Eq. (3) is the local objective); ``pruning_strength`` > 0.

  Raises:
    registry.ArgumentError: naming the key, relative to the algorithm.
  """
  num_clients, rank = run["num_clients"], run["rank"]
  key = "client_args.ranks"
  expected = f"a list of {num_clients} ints in [1, {rank}]"
  if "ranks" not in arguments:
    raise registry.ArgumentError(
        key, f"{key}: required: the rank of every client id, {expected} "
        "(e.g. --client-arg ranks=[1,2,...])")
  ranks = arguments["ranks"]
  if not isinstance(ranks, (list, tuple)):
    raise registry.ArgumentTypeError(
        key, f"{key} must be {expected} (one per client id), got "
        f"{ranks!r}")
  if len(ranks) != num_clients:
    raise registry.ArgumentError(
        key, f"{key} must give one rank per client id: {num_clients} "
        f"(partition.num_clients), got {len(ranks)}")
  for i, value in enumerate(ranks):
    registry.argument(f"{key}[{i}]", checks.check_int, value, 1, rank)
  if arguments.get("self_pruning") is not None:
    registry.argument("client_args.self_pruning", checks.check_number,
                      arguments["self_pruning"], 0, 1, low_open=True,
                      high_open=True)
    if run["objective"] != "cross_entropy":
      raise registry.ArgumentError(
          "objective", "objective: lora_ranks with self_pruning sets its "
          "own local objective (Eq. (3)); got "
          f"{run['objective']!r} (leave it cross_entropy)")
  if "pruning_strength" in arguments:
    registry.argument("client_args.pruning_strength", checks.check_number,
                      arguments["pruning_strength"], 0, low_open=True)


def lora_ranks(model: Model, ranks: Sequence[int],
               training: LocalTraining = LocalTraining(), *,
               self_pruning: Optional[float] = None,
               pruning_strength: float = 1e-3, **options) -> LocalUpdate:
  """Clients of heterogeneous LoRA ranks as the round's ``LocalUpdate``
  (pair it with ``aggregators.hetlora()`` or ``aggregators.flora()``).

  Args:
    model: a LoRA model (``models.lora.lora``, A trained).
    ranks: r_k for every client id [N], ints in [1, r_max] (r_max the
      model's rank).
    training: the local training (with ``self_pruning`` its objective
      must be None or one that adds no term, plain cross-entropy: Eq. (3)
      is the local objective).
    self_pruning: gamma in (0, 1), the fraction of its components a
      client keeps when it prunes; None: no pruning.
    pruning_strength: lambda of Eq. (3), > 0.
    **options: ``clients.ClientOptions`` (the local training's chunking and
      devices; the ranks live in the server state, placement "device").

  Returns:
    A ``LocalUpdate`` whose state is ``LoRARanksState``. Metrics:
    ``client_ranks`` [K] (after pruning).
  """
  options = _common.client_options("lora_ranks", options)
  if options.placement != "device":
    raise ValueError("lora_ranks: placement must be 'device' (the ranks "
                     "are one int per client)")
  r_max = lora.spec(model).rank
  lora.check_adapters(jax.eval_shape(model.init, jax.random.key(0)),
                      "lora_ranks", "model's adapters", need=("a", "b"))
  # Checked here with numpy: inside the jitted round an out-of-range rank
  # could not raise, only truncate wrongly.
  table = np.asarray(ranks)
  if table.ndim != 1 or table.size == 0 or not np.issubdtype(
      table.dtype, np.integer):
    raise TypeError(f"ranks must be a non-empty sequence of ints (one per "
                    f"client id), got {ranks!r}")
  if table.min() < 1 or table.max() > r_max:
    raise ValueError(f"ranks must lie in [1, r_max={r_max}] (the model's "
                     f"rank), got min {table.min()}, max {table.max()}")
  if self_pruning is not None:
    checks.check_range("self_pruning", self_pruning, 0, 1, low_open=True,
                       high_open=True)
    checks.check_range("pruning_strength", pruning_strength, 0,
                       low_open=True)
    if _no_term(training.objective):
      # The plain loss (a config's "cross_entropy") is no objective of
      # its own: Eq. (3) takes its place.
      training = dataclasses.replace(training, objective=None)
    training = _common.with_own_objective(
        "training", training, _pruning_objective(pruning_strength),
        "lora_ranks(self_pruning=...)")
  train = engine.make_local_trainer(model, training, **options.trainer())

  def init(num_clients: int):
    if num_clients != table.size:
      raise ValueError(f"ranks has {table.size} entries; the federation "
                       f"has num_clients={num_clients}")
    return LoRARanksState(jnp.asarray(table, jnp.int32))

  def update(client_state, global_params, data, client_ids, mask,
             learning_rates, num_steps, round_num, key):
    del round_num
    # Padding rows may carry any id: they read rank 1 and write nothing.
    rank = tree_math.gather_clients(client_state.ranks, client_ids, 1)
    # Eq. (1): each client starts from its truncation of the global.
    start = jax.vmap(lora.truncate, in_axes=(None, 0))(global_params, rank)
    if self_pruning is None:
      # The reference is the client's own start: a proximal objective pulls
      # towards the truncated adapters the client holds, not the global ones.
      trained = train(global_params, data, client_ids, learning_rates,
                      num_steps, key, start, start)
      new_rank = rank
    else:
      tail = jax.vmap(lambda r: _tail(r, r_max, self_pruning))(rank)
      masks = jax.vmap(tail_masks, in_axes=(None, 0))(global_params, tail)
      trained = train(global_params, data, client_ids, learning_rates,
                      num_steps, key, start, masks)
      # A tail that was zero at the start (B = 0 there) has norm 0 and cannot
      # shrink: such a client does not prune.
      before = jax.vmap(tail_norm)(start, masks)
      after = jax.vmap(tail_norm)(trained.client_params, masks)
      # Eq. (3): prune the tail when local training shrank it.
      pruned = jnp.maximum(jnp.floor(self_pruning * rank).astype(jnp.int32),
                           1)
      new_rank = jnp.where((after < before) & (mask > 0), pruned, rank)
      client_state = LoRARanksState(tree_math.scatter_clients(
          client_state.ranks, client_ids, mask, new_rank))
    # Eq. (2): only the client's own components are sent.
    sent = jax.vmap(lora.truncate)(trained.client_params, new_rank)
    return trained._replace(client_params=sent), client_state, {
        "client_ranks": new_rank.astype(jnp.float32)}

  return LocalUpdate(init=init, update=update)

