"""Statistics of the client updates u_k = w_k - w of a stacked cohort.

FedAdp and FedLayerWise weigh each client by the angle between u_k and the
weighted mean update; FedNNNN by the norms of u_k and of the mean update.
Both read the stacked client models [K, ...] through the two passes here:

* ``update_moments``: the weighted mean update sum_k p_k u_k and the
  per-client, per-leaf sums of squares of u_k;
* ``update_cosines``: the per-client, per-layer cosine of u_k with another
  tree (the mean update).

Chunks. The updates are formed ``chunk`` clients at a time inside a loop
(exact differences, one reused [chunk, ...] buffer) rather than as a
[K, ...] array: on CPU that allocation costs more than the arithmetic, and
it doubles peak memory. ``chunk=None`` picks ``CPU_CLIENT_CHUNK`` clients on
CPU and the whole cohort (one vectorised step) on accelerators, where a long
loop of small kernels would be the slow part.

Padding. Rows with mask 0 read as zero updates whatever they hold (NaN and
inf included), so they add nothing to any sum and get zero norms.

Scale. Sums of squares and dot products are those of power-of-two rescaled
updates (``tree_math.SumOfSquares``): cosines do not overflow for updates of
magnitude 1e38 nor underflow at 1e-30. A chunk first takes the plain sums
(one pass, as fast as without rescaling) and rescales them exactly; only a
chunk where a plain sum overflowed or came close to underflow is redone
from rescaled updates (``jax.lax.cond``; under ``vmap`` both run). At
ordinary magnitudes the results are bit for bit the unscaled formulas'.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import tree_math
from fedjax_agg.types import Params, StackedParams

__all__ = ["CPU_CLIENT_CHUNK", "UpdateMoments", "update_cosines",
    "update_moments"]

CPU_CLIENT_CHUNK = 4
"""Clients per loop step on CPU when ``chunk`` is None (on accelerators the
whole cohort is one step)."""


def _chunk_width(chunk, num_clients: int) -> int:
  if chunk is None:
    chunk = (CPU_CLIENT_CHUNK if jax.default_backend() == "cpu"
             else num_clients)
  # The width is a static shape of the loop body, so a bad value is refused
  # here, while tracing, rather than surfacing as an XLA shape error.
  if not isinstance(chunk, int) or chunk < 1:
    raise ValueError(f"chunk must be a positive int or None, got {chunk!r}")
  return min(chunk, num_clients)


def _over_client_chunks(stacked: StackedParams, offset: Params,
                        mask: Optional[jax.Array], chunk, body, carry):
  """Runs ``carry = body(rows, fresh, real, updates, carry)`` over chunks.

  ``rows`` [W] are the chunk's client indices, ``fresh`` [W] bool marks the
  rows not seen by an earlier chunk (the last chunk is shifted back to stay
  in range, so it may repeat rows), ``real`` [W] bool the rows of mask 1,
  ``updates`` the list over leaves of [W, size] flattened u_k, zero for the
  rows of mask 0.
  """
  leaves, offsets = jax.tree.leaves(stacked), jax.tree.leaves(offset)
  num_clients = leaves[0].shape[0]
  width = _chunk_width(chunk, num_clients)

  def step_fn(step, carry):
    # Every step slices exactly ``width`` rows (a static shape under
    # fori_loop); the last step starts early instead of running off the end,
    # and ``fresh`` below tells its body which rows it already saw.
    start = jnp.minimum(step * width, num_clients - width)
    rows = start + jnp.arange(width)
    updates = [
        (jax.lax.dynamic_slice_in_dim(x, start, width) - o[None]).reshape(
            width, -1) for x, o in zip(leaves, offsets, strict=True)]
    real = jnp.ones((width,), bool) if mask is None else mask[rows] > 0
    if mask is not None:
      updates = [jnp.where(real[:, None], u, jnp.zeros((), u.dtype))
                 for u in updates]
    return body(rows, rows >= step * width, real, updates, carry)

  # ceil(K / width) steps; a loop rather than a Python for keeps the traced
  # program one step long whatever the cohort size.
  return jax.lax.fori_loop(0, -(-num_clients // width), step_fn, carry)


class UpdateMoments(NamedTuple):
  """First and second moments of the client updates.

  Attributes:
    weighted_sum: sum_k weights[k] u_k (a plain tree like the params).
    squares: ``tree_math.SumOfSquares`` of every u_k per leaf, [K, P] each
      (``.norm()`` gives |u_k| per leaf; ``tree_math.layer_sums_of_squares``
      combines leaves into layers).
  """
  weighted_sum: Params
  squares: tree_math.SumOfSquares


def update_moments(stacked: StackedParams, offset: Params,
                   weights: jax.Array, mask: Optional[jax.Array] = None,
                   chunk: Optional[int] = None) -> UpdateMoments:
  """Weighted sum and per-leaf sums of squares of u_k = stacked[k] - offset.

  Args:
    stacked: tree with leaves [K, ...].
    offset: plain tree (e.g. the global params).
    weights: [K].
    mask: [K]; rows with mask 0 are zero updates (None: every row real).
    chunk: clients per loop step (None: see ``CPU_CLIENT_CHUNK``).
  """
  leaves = jax.tree.leaves(stacked)
  num_clients, num_leaves = leaves[0].shape[0], len(leaves)
  dtype = jnp.result_type(*leaves)

  def rescaled_squares(updates):
    squares = [tree_math.sum_of_squares(u, axis=1) for u in updates]
    return tree_math.SumOfSquares(
        jnp.stack([q.scale for q in squares], axis=1).astype(dtype),
        jnp.stack([q.scaled for q in squares], axis=1).astype(dtype))

  def body(rows, fresh, real, updates, carry):
    sums, scales, scaled = carry
    # A row repeated by the shifted last chunk must not enter the weighted sum
    # twice; its sums of squares are simply written again with the same value.
    chunk_weights = jnp.where(fresh, weights[rows], 0.0)
    sums = [s + jnp.matmul(chunk_weights.astype(u.dtype), u,
                           precision=tree_math.FULL)
            for s, u in zip(sums, updates, strict=True)]
    plain = jnp.stack([jnp.sum(jnp.square(u), axis=1) for u in updates],
                      axis=1).astype(dtype)
    # A padding row's plain sum is an exact 0, which plain_sum_is_safe rejects
    # (a 0 may hide underflow); such rows are left out of the test so that a
    # padded cohort of ordinary magnitude keeps the fast path.
    safe = jnp.all(tree_math.plain_sum_is_safe(plain) | ~real[:, None])
    squares = jax.lax.cond(safe, lambda: tree_math.from_plain_sum(plain),
                           lambda: rescaled_squares(updates))
    return (sums, scales.at[rows].set(squares.scale),
            scaled.at[rows].set(squares.scaled))

  zeros = jnp.zeros((num_clients, num_leaves), dtype)
  sums = [jnp.zeros((x[0].size,), x.dtype) for x in leaves]
  sums, scales, scaled = _over_client_chunks(stacked, offset, mask, chunk,
                                             body, (sums, zeros, zeros))
  offsets, treedef = jax.tree.flatten(offset)
  weighted = jax.tree.unflatten(treedef, [
      s.reshape(o.shape) for s, o in zip(sums, offsets, strict=True)])
  return UpdateMoments(weighted, tree_math.SumOfSquares(scales, scaled))


def update_cosines(stacked: StackedParams, offset: Params, other: Params,
                   squares: tree_math.SumOfSquares,
                   structure: tree_math.LayerStructure,
                   mask: Optional[jax.Array] = None,
                   chunk: Optional[int] = None) -> jax.Array:
  """cos(u_k, other) per client and layer, u_k = stacked[k] - offset.

  Args:
    stacked: tree with leaves [K, ...].
    offset: plain tree.
    other: plain tree (e.g. the mean update).
    squares: ``update_moments(stacked, offset, ..., mask).squares``.
    structure: the layer grouping (``tree_math.single_layer_structure``
      for whole-model cosines).
    mask: [K], as given to ``update_moments``.
    chunk: clients per loop step.

  Returns:
    [K, L] cosines in [-1, 1]; 0 where u_k or ``other`` is zero on a layer.
  """
  # ``other`` is the same for every client: it is rescaled once, outside the
  # loop, and only each client's own scale is applied per chunk.
  other_squares = tree_math.leaf_sums_of_squares(other)
  others = [tree_math.divide_by_scale(y.reshape(-1), scale) for y, scale in
            zip(jax.tree.leaves(other), other_squares.scale, strict=True)]
  leaves = jax.tree.leaves(stacked)

  def body(rows, fresh, real, updates, dots):
    del fresh  # repeated rows get the same values again
    scales = squares.scale[rows]  # [W, P]
    plain = jnp.stack([jnp.matmul(u, y, precision=tree_math.FULL)
                       for u, y in zip(updates, others, strict=True)],
                      axis=1)
    # Dividing the plain dot by the client's power-of-two scale afterwards
    # gives the rescaled dot; only a plain dot that overflowed (inf or NaN)
    # forces the products of the rescaled updates.
    safe = jnp.all(jnp.isfinite(plain) | ~real[:, None])
    chunk_dots = jax.lax.cond(
        safe, lambda: tree_math.divide_by_scale(plain, scales),
        lambda: jnp.stack(
            [jnp.matmul(tree_math.divide_by_scale(u, scales[:, p, None]), y,
                        precision=tree_math.FULL)
             for p, (u, y) in enumerate(zip(updates, others, strict=True))],
            axis=1))
    return dots.at[rows].set(chunk_dots.astype(dots.dtype))

  dots = jnp.zeros((leaves[0].shape[0], len(leaves)),
                   jnp.result_type(*leaves))
  dots = _over_client_chunks(stacked, offset, mask, chunk, body, dots)
  # Rescale every leaf's dot to its layer's scales, then sum the layer.
  client_layers = tree_math.layer_sums_of_squares(squares, structure)
  other_layers = tree_math.layer_sums_of_squares(other_squares, structure)
  layer_of = jnp.asarray(structure.leaf_to_layer)
  ratio = (tree_math.divide_by_scale(
      squares.scale, jnp.take(client_layers.scale, layer_of, axis=-1))
           * tree_math.divide_by_scale(
               other_squares.scale, other_layers.scale[layer_of]))
  scaled_dots = tree_math.to_layers(ratio * dots, structure)
  return tree_math.cosine(scaled_dots, client_layers,
                          jax.tree.map(lambda a: a[None], other_layers))
