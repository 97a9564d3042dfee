"""One client's local training, vmapped over a chunk of clients and looped
over the cohort's chunks in one jitted call: ``make_local_trainer`` and its
shared per-client program (``fedjax_agg.engine`` describes both forms).
"""

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import objectives as objectives_lib
from fedjax_agg.chunking import _Layout
from fedjax_agg.chunking import _layout
from fedjax_agg.distributed import by_client as _by_client
from fedjax_agg.distributed import check_execution
from fedjax_agg.distributed import shard_map_unchecked as _shard_map
from fedjax_agg.evaluation import mean_client_loss
from fedjax_agg.config import LocalTraining
from fedjax_agg.federated import FederatedData
from fedjax_agg.models import layers
from fedjax_agg.models import mixed
from fedjax_agg.types import Model, Params
from fedjax_agg.types import PRNGKey



ROWS_INDEPENDENT = "rows_independent"
"""An attribute of a model's ``apply``: True where each row's output
depends on that row only, in training too (no batch statistics). Local
training then leaves the rows that only pad out of an epoch's last batch
(40 examples in batches of 16: a last step of 8 rows, not 16 with 8
masked): the same loss and step, fewer products, the float sums in
another order. ``models.lora``'s adapted networks say so."""


class LocalResult(NamedTuple):
  """What local training returns for a cohort of K clients.

  Attributes:
    client_params: [K, ...] trained params.
    loss_before: [K] mean loss on each client's training data of the model
      it starts from (the global model unless the trainer is given
      per-client ``start``); 0 when losses are not computed.
    loss_after: [K] trained model's mean loss on the client's training data.
    steps_taken: [K] int32 real optimisation steps performed.
    train_loss: [K] mean minibatch loss over the steps taken.
  """
  client_params: Params
  loss_before: jax.Array
  loss_after: jax.Array
  steps_taken: jax.Array
  train_loss: jax.Array


def steps_per_epoch(num_examples, batch_size: int):
  """ceil(n / B): steps of one local epoch over n examples."""
  return (num_examples + batch_size - 1) // batch_size


def epoch_order(key: PRNGKey, num_examples, width: int) -> jax.Array:
  """A random order of positions [0, n) followed by the padding [n, width).

  Uses one uniform draw per position; with jax's partitionable threefry the
  draws at positions < n do not depend on ``width``, so a client's shuffle is
  the same whether or not it is padded.
  """
  positions = jnp.arange(width)
  draws = jax.random.uniform(key, (width,))
  # Padding positions get keys above every uniform draw, increasing with
  # the position, so the sort puts them last and in their own order.
  draws = jnp.where(positions < num_examples, draws, 2.0 + positions)
  return jnp.argsort(draws, stable=True).astype(jnp.int32)


class _ClientArgs(NamedTuple):
  client_id: jax.Array  # []
  learning_rate: jax.Array  # []
  num_steps: jax.Array  # []
  start: Any = None  # the client's own starting params (None: global)
  reference: Any = None  # what its objective reads (None: global params)


class _Row(NamedTuple):
  """One cohort row as the chunk loop sees it (padding rows appended)."""
  args: _ClientArgs
  num_examples: jax.Array  # [] as the aggregator sees it (ClientInfo)
  mask: jax.Array  # [] 0 for the rows that pad the last chunk


def _client_trainer(model: Model, training: LocalTraining):
  """``train_one(global_params, data, key, args)`` for ONE client.

  Returns ``(params, loss_before, loss_after, steps_taken, train_loss)``.
  """
  batch_size, num_epochs = training.batch_size, training.epochs
  objective = training.objective or objectives_lib.cross_entropy()
  short_last_batch = bool(getattr(model.apply, ROWS_INDEPENDENT, False))
  if training.matmul_precision == "bfloat16":
    model = mixed.bfloat16_compute(model)  # master weights stay float32
  loss_fn = objectives_lib.local_loss(model, objective)
  make_optimizer = optax.inject_hyperparams(training.optimizer)

  def train_one(global_params, data: FederatedData, key,
                args: _ClientArgs):
    start = global_params if args.start is None else args.start
    reference = global_params if args.reference is None else args.reference
    x_all, y_all = data.x, data.y
    indices = data.client_indices[args.client_id]
    num_examples = data.num_examples[args.client_id]
    client_key = jax.random.fold_in(key, args.client_id)
    width = indices.shape[0]
    # ``width`` (the padded per-client row count) is static, so the step
    # count of the scan is too; the client's own ``client_steps`` is traced
    # and only masks steps.
    epoch_steps = -(-width // batch_size)
    client_steps = steps_per_epoch(num_examples, batch_size)
    # The rows of an epoch's last step past ``width`` only ever pad; a
    # model whose rows are independent leaves them out (its last step
    # takes ``last_rows`` rows).
    last_rows = width - (epoch_steps - 1) * batch_size
    if not short_last_batch or last_rows == batch_size:
      last_rows = None
    optimizer = make_optimizer(learning_rate=args.learning_rate)
    padded = jnp.pad(indices, (0, epoch_steps * batch_size - width))

    def epoch(carry, epoch_index):
      params, opt_state, steps_done, loss_sum = carry
      # The objective's per-epoch quantities (e.g. FedLap's row
      # dissimilarities) are frozen for the epoch: constants of its loss.
      context = jax.lax.stop_gradient(objective.prepare(params, reference))
      order = epoch_order(jax.random.fold_in(client_key, epoch_index),
                          num_examples, width)
      order = jnp.pad(order, (0, epoch_steps * batch_size - width),
                      constant_values=width)

      def step(carry, step_index, rows=batch_size):
        params, opt_state, steps_done, loss_sum = carry
        pos = jax.lax.dynamic_slice_in_dim(order, step_index * batch_size,
                                           rows)
        mask = (pos < num_examples).astype(jnp.float32)
        # Padding positions are clamped to a real index so the gather stays
        # in bounds; their rows carry mask 0 and add nothing to the loss.
        idx = padded[jnp.minimum(pos, width - 1)]
        batch = {"x": x_all[idx], "y": y_all[idx], "mask": mask}
        (loss, new_params), grads = jax.value_and_grad(
            loss_fn, has_aux=True)(params, batch, reference, context)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(
            jax.lax.stop_gradient(new_params), updates)
        if objective.proximal is not None:
          new_params = objective.proximal(new_params, reference,
                                          args.learning_rate)
        # An inactive step is computed anyway (fixed shapes under vmap) and
        # then discarded by jnp.where, so state is left bit-identical.
        active = (step_index < client_steps) & (steps_done < args.num_steps)
        keep = lambda new, old: jax.tree.map(
            lambda a, b: jnp.where(active, a, b), new, old)
        return (keep(new_params, params), keep(new_opt_state, opt_state),
                steps_done + active.astype(jnp.int32),
                loss_sum + jnp.where(active, loss, 0.0)), None

      carry = (params, opt_state, steps_done, loss_sum)
      full_steps = epoch_steps - (last_rows is not None)
      # ``True == 1`` in Python: unroll=True (fully unrolled scan) must not
      # take the while_loop branch.
      if training.unroll is not True and training.unroll == 1:
        # Only the client's own steps run: the loop stops at its last
        # batch (or its step budget) instead of padding every client to
        # the federation's largest; in a vmapped chunk it runs the chunk's
        # longest client, the others' extra steps keep their state.
        def loop(carry, first, end, rows):
          def more(state):
            step_index, (_, _, done, _) = state
            return ((step_index < end) & (step_index < client_steps)
                    & (done < args.num_steps))

          def body(state):
            step_index, inner = state
            inner, _ = step(inner, step_index, rows)
            return step_index + 1, inner

          return jax.lax.while_loop(more, body, (first, carry))

        step_index, carry = loop(carry, jnp.int32(0), full_steps,
                                 batch_size)
        if last_rows is not None:
          # At most one step, run while a client of the chunk needs it.
          _, carry = loop(carry, step_index, epoch_steps, last_rows)
      else:
        carry, _ = jax.lax.scan(step, carry, jnp.arange(full_steps),
                                unroll=training.unroll)
        if last_rows is not None:
          carry, _ = step(carry, jnp.int32(full_steps), last_rows)
      return carry, None

    init = (start, optimizer.init(start),
            jnp.zeros((), jnp.int32), jnp.zeros(()))
    (params, _, steps_done, loss_sum), _ = jax.lax.scan(
        epoch, init, jnp.arange(num_epochs))
    if training.compute_losses is not False:
      losses = functools.partial(mean_client_loss, model, x_all=x_all,
                                 y_all=y_all, indices=indices,
                                 num_examples=num_examples,
                                 batch_size=training.eval_batch_size)
      loss_before = losses(start)
      loss_after = losses(params)
    else:
      loss_before = loss_after = jnp.zeros(())
    # A client that took no step (a padding row, num_steps 0) reports 0,
    # not 0/0.
    train_loss = loss_sum / jnp.maximum(steps_done, 1)
    return params, loss_before, loss_after, steps_done, train_loss

  return train_one


def _chunk_trainer(model, training, *, clients_per_step, chunk_loop, mesh,
                   client_axis):
  """Checks the options; -> (clients_per_step, the vmapped trainer of a
  chunk: ``train_chunk(global_params, data, key, args [W])``)."""
  if not isinstance(training, LocalTraining):
    raise TypeError(f"training must be a config.LocalTraining, got "
                    f"{type(training).__name__}")
  clients_per_step = check_execution(clients_per_step, chunk_loop, mesh,
                                     client_axis, model.num_params)
  # Params, data and key are shared by the chunk; only the per-client
  # arguments are mapped.
  train_chunk = jax.vmap(_client_trainer(model, training),
                         in_axes=(None, None, None, 0))

  def traced(*args):
    # Both decide what is traced: the precision of every product of local
    # training, and the per-client convolution lowering of "auto".
    with layers.per_client_training(), training.precision():
      return train_chunk(*args)
  return clients_per_step, traced


def _cohort_rows(layout: _Layout, client_ids, learning_rates, num_steps,
                 num_examples, mask, start=None, reference=None) -> _Row:
  """The cohort's rows cut into chunks. Padding rows take 0 steps (they
  cost compute but change nothing) and carry mask 0."""
  num_clients = layout.num_clients
  return layout.to_chunks(_Row(
      _ClientArgs(
          client_id=client_ids,
          learning_rate=jnp.broadcast_to(learning_rates, (num_clients,)
                                         ).astype(jnp.float32),
          num_steps=jnp.broadcast_to(num_steps, (num_clients,)
                                     ).astype(jnp.int32),
          start=start, reference=reference),
      num_examples=jnp.broadcast_to(num_examples, (num_clients,)
                                    ).astype(jnp.float32),
      mask=jnp.broadcast_to(mask, (num_clients,)).astype(jnp.float32)))


def _by_steps(data: FederatedData, client_ids, num_steps,
              training: LocalTraining) -> jax.Array:
  """The cohort's positions from the most local steps to the fewest."""
  steps = jnp.minimum(
      num_steps, training.epochs * steps_per_epoch(
          data.num_examples[client_ids], training.batch_size))
  return jnp.argsort(-steps, stable=True)


def _loop_chunks(body, carry, chunks, chunk_loop: str):
  """``lax.scan(body, carry, chunks)``, or a Python loop ("unroll", or a
  single chunk)."""
  # The chunk count is a static shape, so this Python branch is resolved
  # at trace time.
  count = jax.tree.leaves(chunks)[0].shape[0]
  if count > 1 and chunk_loop == "map":
    return jax.lax.scan(body, carry, chunks)
  outputs = []
  for c in range(count):
    carry, out = body(carry, jax.tree.map(lambda a, c=c: a[c], chunks))
    outputs.append(out)
  return carry, jax.tree.map(lambda *a: jnp.stack(a), *outputs)


def make_local_trainer(
    model: Model,
    training: LocalTraining,
    *,
    clients_per_step: Optional[int] = None,
    mesh: Optional[jax.sharding.Mesh] = None,
    client_axis: str = "clients",
    chunk_loop: str = "map",
) -> Callable[..., LocalResult]:
  """Builds the jitted local-training function for a cohort.

  Args:
    model: the network (``fedjax_agg.types.Model``).
    training: what each client does (``config.LocalTraining``: epochs,
      batch size, optimizer, objective, unroll, per-client losses). The
      learning rate is an argument of the returned function, per client;
      ``training.learning_rate`` is not read here. The engine knows no
      aggregator: ``compute_losses`` "auto" (which the round resolves from
      the rule) computes the losses here; only False skips them.
    clients_per_step: W, the most clients trained side by side (vmap width);
      a cohort of K is cut into ceil(K / W) chunks of equal width. None:
      ``default_clients_per_step`` (``distributed.choose_clients_per_step``:
      on CPU one client per device and chunk, at least 2, since side by
      side clients gain nothing from batching there and padding a chunk
      costs full clients; on a GPU/TPU up to 128 a device, as many as the
      model's size and the device's free memory allow).
    mesh: optional device mesh; the clients of each chunk are sharded over
      its ``client_axis`` (``clients_per_step`` must be a multiple of that
      axis' size), params and pooled data are replicated, and the stacked
      client params come back sharded over the same axis.
    client_axis: name of the mesh axis that carries clients.
    chunk_loop: how the chunks of ``clients_per_step`` clients are looped
      over inside the jitted call: "map" (``lax.scan``, one compiled chunk,
      compile time independent of K) or "unroll" (one copy of the chunk
      program per chunk; compile time grows with K/W).

  Returns:
    ``train(global_params, data, client_ids, learning_rates, num_steps, key,
    start=None, reference=None) -> LocalResult``, jitted: ``client_ids``
    [K] int, ``learning_rates`` [K] float, ``num_steps`` [K] int (a large
    value, e.g. ``full_steps(...)``, means "all epochs"), ``key`` a PRNG
    key. Stateful clients pass per-client trees with a leading [K] axis:
    ``start``, the params each client starts from (its personal model, or
    the global model with its own BatchNorm leaves; None: the global
    model, also what ``loss_before`` is measured on otherwise), and
    ``reference``, what the local objective reads in place of the global
    params (``LocalObjective.prepare/penalty``'s second argument; e.g.
    SCAFFOLD's per-client gradient correction; None: the global params).
    The stacked client params of the whole cohort are an output;
    ``make_local_reducer`` avoids them.
  """
  clients_per_step, train_chunk = _chunk_trainer(
      model, training, clients_per_step=clients_per_step, mesh=mesh,
      client_axis=client_axis, chunk_loop=chunk_loop)

  @jax.jit
  def train(global_params, data: FederatedData, client_ids, learning_rates,
            num_steps, key, start=None, reference=None) -> LocalResult:
    layout = _layout(client_ids.shape[0], clients_per_step, mesh,
                     client_axis)
    # Clients side by side run as long as the longest of them: chunks of
    # clients with similar step counts waste least (unbalanced, e.g.
    # natural, federations). Each client's training is its own, so the
    # order changes no result; the outputs come back in cohort order.
    # Only lanes of one device wait for each other; with one client per
    # device and chunk each device runs its own clients in turn.
    lanes = clients_per_step // (1 if mesh is None
                                 else mesh.shape[client_axis])
    cohort = (client_ids, learning_rates, num_steps, start, reference)
    if lanes > 1:
      order = _by_steps(data, client_ids, num_steps, training)
      cohort = jax.tree.map(lambda a: None if a is None else a[order],
                            cohort, is_leaf=lambda a: a is None)
    rows = _cohort_rows(layout, *cohort[:3], 0, 0, *cohort[3:])

    def run_chunks(global_params, data, key, args):
      def body(carry, chunk_args):
        return carry, train_chunk(global_params, data, key, chunk_args)
      return _loop_chunks(body, (), args, chunk_loop)[1]

    if mesh is not None:
      # Each device runs the whole chunk loop on its own slice of every
      # chunk (shard_map, no communication): the per-client computation is
      # exactly the unsharded one, whatever the model's batching rules.
      replicated = jax.sharding.PartitionSpec()
      run_chunks = _shard_map(
          run_chunks, mesh=mesh,
          in_specs=(replicated,) * 3 + (_by_client(client_axis),),
          out_specs=_by_client(client_axis))
    outputs = layout.from_chunks(run_chunks(global_params, data, key,
                                            rows.args))
    if lanes > 1:
      # argsort of a permutation is its inverse: back to cohort order.
      back = jnp.argsort(order)
      outputs = jax.tree.map(lambda a: a[back], outputs)
    # Once trimmed to K rows the outputs split evenly over the devices only
    # when D divides K; otherwise their layout is left to the compiler.
    if mesh is not None and layout.num_clients % layout.devices == 0:
      outputs = jax.lax.with_sharding_constraint(
          outputs, jax.sharding.NamedSharding(
              mesh, jax.sharding.PartitionSpec(client_axis)))
    return LocalResult(*outputs)

  return train


def rows_finite(stacked: Any) -> jax.Array:
  """[K] True where every entry of row k of every leaf is finite."""
  def leaf_rows(leaf):
    # Integer leaves (e.g. step counters) cannot hold NaN or Inf.
    if not jnp.issubdtype(leaf.dtype, jnp.inexact):
      return jnp.ones(leaf.shape[:1], bool)
    return jnp.all(jnp.isfinite(leaf.reshape(leaf.shape[0], -1)), axis=1)
  rows = [leaf_rows(leaf) for leaf in jax.tree.leaves(stacked)]
  return functools.reduce(jnp.logical_and, rows)


def full_steps(data: FederatedData, client_ids, batch_size: int,
               num_epochs: int) -> jax.Array:
  """[K] steps that make each client run all ``num_epochs`` epochs."""
  return num_epochs * steps_per_epoch(data.num_examples[client_ids],
                                      batch_size)
