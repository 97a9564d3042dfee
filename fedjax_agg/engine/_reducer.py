"""The streaming form of local training: ``make_local_reducer`` runs the
per-client program of ``_trainer`` and keeps only a sum over the cohort of a
per-client statistic (``fedjax_agg.engine`` describes both forms).
"""

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg.chunking import _layout
from fedjax_agg.config import LocalTraining
from fedjax_agg.distributed import by_client as _by_client
from fedjax_agg.distributed import shard_map_unchecked as _shard_map
from fedjax_agg.engine._trainer import _chunk_trainer
from fedjax_agg.engine._trainer import _cohort_rows
from fedjax_agg.engine._trainer import _loop_chunks
from fedjax_agg.engine._trainer import _Row
from fedjax_agg.engine._trainer import rows_finite
from fedjax_agg.federated import FederatedData
from fedjax_agg.types import ClientInfo, Model, Params


class LocalSums(NamedTuple):
  """What streaming local training returns for a cohort of K clients.

  Attributes:
    stats: the sum over the K clients of ``client_stats`` (see
      ``make_local_reducer``); no per-client model survives the call.
    loss_before, loss_after, steps_taken, train_loss: [K], as in
      ``LocalResult``.
    finite: [K] bool, False for a client whose model (or losses, where
      they must be finite) held a non-finite value (always True unless
      ``exclude_nonfinite``).
  """
  stats: Any
  loss_before: jax.Array
  loss_after: jax.Array
  steps_taken: jax.Array
  train_loss: jax.Array
  finite: jax.Array


def make_local_reducer(
    model: Model,
    client_stats: Callable[[Params, Params, ClientInfo], Any],
    training: LocalTraining,
    *,
    exclude_nonfinite: bool = False,
    losses_must_be_finite: bool = False,
    clients_per_step: Optional[int] = None,
    mesh: Optional[jax.sharding.Mesh] = None,
    client_axis: str = "clients",
    chunk_loop: str = "map",
) -> Callable[..., LocalSums]:
  """Local training of a cohort that keeps only a sum over its clients.

  Every client trains exactly as in ``make_local_trainer`` (the same
  per-client program); right after a chunk of ``clients_per_step`` clients
  is trained, ``client_stats`` maps each of its models to a fixed-shape
  pytree and the chunk's sum is added to a running total (the carry of the
  loop over chunks). Client models therefore exist for one chunk at a time:
  memory is bounded by the chunk, not by K. With a mesh each device sums
  the clients of its own slices, then one ``psum`` over ``client_axis``
  gives the total.

  Args:
    model: the network.
    client_stats: ``client_stats(global_params, client_params, info_k) ->
      stats`` for ONE client (e.g. ``aggregator.stream.client_stats``);
      ``info_k`` is that client's ``ClientInfo`` row (scalar fields, with
      its own ``loss_before``/``loss_after``); it must give zeros for rows
      with mask 0 (the engine pads the last chunk with such rows).
    training, clients_per_step, mesh, client_axis, chunk_loop: as in
      ``make_local_trainer``.
    exclude_nonfinite: a client whose trained model (or, with
      ``losses_must_be_finite``, whose losses) holds a NaN/Inf enters the
      sum as a padding row (mask 0, the global model in place of its
      model); ``LocalSums.finite`` flags it.
    losses_must_be_finite: see ``exclude_nonfinite``.

  Returns:
    ``reduce(global_params, data, client_ids, learning_rates, num_steps,
    key, info) -> LocalSums``, jitted; the first six arguments as in
    ``make_local_trainer``'s ``train``; ``info`` is the cohort's
    ``ClientInfo`` as the aggregator will see it ([K] ``num_examples`` and
    ``mask``, the round's ``round`` and ``key``); its ``loss_before`` /
    ``loss_after`` are not read (each client's stats see the losses of its
    own training).
  """
  if not callable(client_stats):
    raise TypeError(
        f"client_stats must be callable, got {type(client_stats).__name__}")
  clients_per_step, train_chunk = _chunk_trainer(
      model, training, clients_per_step=clients_per_step, mesh=mesh,
      client_axis=client_axis, chunk_loop=chunk_loop)

  @jax.jit
  def reduce(global_params, data: FederatedData, client_ids, learning_rates,
             num_steps, key, info: ClientInfo) -> LocalSums:
    layout = _layout(client_ids.shape[0], clients_per_step, mesh,
                     client_axis)
    rows = _cohort_rows(layout, client_ids, learning_rates, num_steps,
                        info.num_examples, info.mask)

    def row_info(row: _Row, per_client, shared) -> ClientInfo:
      loss_before, loss_after, steps_taken = per_client
      return ClientInfo(row.args.client_id, row.num_examples, row.mask,
                        loss_before, loss_after, *shared,
                        num_steps=steps_taken)

    def run_chunks(global_params, data, key, shared, rows):
      def body(total, chunk: _Row):
        params, *per_client = train_chunk(global_params, data, key,
                                          chunk.args)
        rows_info = row_info(chunk, per_client[:3], shared)

        finite = jnp.ones(chunk.mask.shape, bool)
        if exclude_nonfinite:
          finite = rows_finite(params)
          if losses_must_be_finite:
            finite &= jnp.isfinite(per_client[0]) & jnp.isfinite(
                per_client[1])

        def add_client(k, total):
          client_params = jax.tree.map(lambda a: a[k], params)
          info_k = rows_info.row(k)
          if exclude_nonfinite:
            # An excluded client is a padding row: mask 0, and the global
            # model in place of its model, so no NaN reaches the sum.
            ok = finite[k]
            client_params = jax.tree.map(
                lambda c, g: jnp.where(ok, c, g), client_params,
                global_params)
            info_k = info_k._replace(
                mask=jnp.where(ok, info_k.mask, 0.0),
                loss_before=jnp.where(ok, info_k.loss_before, 0.0),
                loss_after=jnp.where(ok, info_k.loss_after, 0.0))
          return jax.tree.map(jnp.add, total, client_stats(
              global_params, client_params, info_k))

        # One client's statistics at a time, added in row order: the chunk's
        # W models are already live, and a vmapped ``client_stats`` would
        # add W model-sized statistics on top of them.
        total = jax.lax.fori_loop(0, chunk.mask.shape[0], add_client, total)
        return total, tuple(per_client) + (finite,)

      # The scan's carry needs the statistics' structure before the first
      # chunk runs: it is read off ``client_stats`` by eval_shape, with the
      # global params standing in for a client model.
      scalar = jax.ShapeDtypeStruct((), jnp.float32)
      steps = jax.ShapeDtypeStruct((), jnp.int32)
      one_row = jax.tree.map(
          lambda a: jax.ShapeDtypeStruct(a.shape[2:], a.dtype), rows)
      zeros = jax.tree.map(
          lambda s: jnp.zeros(s.shape, s.dtype),
          jax.eval_shape(client_stats, global_params, global_params,
                         row_info(one_row, (scalar, scalar, steps), shared)))
      total, per_client = _loop_chunks(body, zeros, rows, chunk_loop)
      if mesh is not None:
        total = jax.lax.psum(total, client_axis)
      return total, per_client

    if mesh is not None:
      replicated = jax.sharding.PartitionSpec()
      run_chunks = _shard_map(
          run_chunks, mesh=mesh,
          in_specs=(replicated,) * 4 + (_by_client(client_axis),),
          out_specs=(replicated, _by_client(client_axis)))
    total, per_client = run_chunks(global_params, data, key,
                                   (info.round, info.key), rows)
    return LocalSums(total, *layout.from_chunks(per_client))

  return reduce
