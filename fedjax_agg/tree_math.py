"""Shared tree math: per-client, per-leaf and per-layer reductions.

Every aggregator and local objective builds on these helpers instead of
re-deriving norms, dot products and weighted means. ``stacked`` trees carry a
leading client axis [K, ...]; plain trees are one model.

Layers. A *leaf* is one array of the params tree. A *layer* groups the leaves
that live under the same parent node (a flax module's ``kernel`` and
``bias``). ``layer_structure(params, granularity)`` gives the grouping used
by the per-layer rules (FedLayerWise, FedNNNN's per-layer norms, FedLap).
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_agg.types import Params, StackedParams

# Norms below this are treated as zero (no direction, angle pi/2).
NORM_EPS = 1e-12


def tree_sub(a: Params, b: Params) -> Params:
  return optax.tree.sub(a, b)


def tree_scale(scalar, tree: Params) -> Params:
  return optax.tree.scale(scalar, tree)


def stacked_sub(stacked: StackedParams, tree: Params) -> StackedParams:
  """[K, ...] - [...] leaf by leaf (broadcast over the client axis)."""
  return jax.tree.map(lambda s, t: s - t[None], stacked, tree)


def broadcast_to_clients(tree: Params, num_clients: int) -> StackedParams:
  """Stacks ``num_clients`` copies of ``tree`` along a new leading axis."""
  return jax.tree.map(
      lambda t: jnp.broadcast_to(t, (num_clients,) + t.shape), tree)


def normalize_weights(weights: jax.Array, mask: jax.Array) -> jax.Array:
  """Masked weights summing to 1 over real clients; [K] -> [K].

  Padded clients (mask 0) get weight 0. If every real weight is 0 the real
  clients share the weight equally; an all-padding cohort gives all zeros.
  """
  weights = jnp.where(mask > 0, weights, 0.0)
  total = jnp.sum(weights)
  uniform = mask / jnp.maximum(jnp.sum(mask), 1.0)
  return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0),
                   uniform)


def weighted_sum(stacked: StackedParams, weights: jax.Array) -> Params:
  """Sum over the client axis of ``weights[k] * stacked[k]``.

  Args:
    stacked: tree with leaves [K, ...].
    weights: [K] (already normalised by the caller when a mean is wanted).
  """
  def leaf_sum(leaf):
    w = weights.astype(leaf.dtype)
    return jnp.tensordot(w, leaf, axes=(0, 0))
  return jax.tree.map(leaf_sum, stacked)


def layer_weighted_sum(stacked: StackedParams, weights: jax.Array,
                       structure: "LayerStructure") -> Params:
  """Per-layer weighted sum: leaf in layer l uses ``weights[:, l]``.

  Args:
    stacked: tree with leaves [K, ...].
    weights: [K, L] client weights per layer.
    structure: the layer grouping of the tree.
  """
  leaves, treedef = jax.tree.flatten(stacked)
  out = [
      jnp.tensordot(weights[:, layer].astype(leaf.dtype), leaf, axes=(0, 0))
      for leaf, layer in zip(leaves, structure.leaf_to_layer, strict=True)
  ]
  return jax.tree.unflatten(treedef, out)


# ---------------------------------------------------------------------------
# Per-leaf reductions over a stacked tree: [K, ...] leaves -> [K, num_leaves].


def stacked_leaf_dots(a: StackedParams, b) -> jax.Array:
  """Per-client, per-leaf dot products; ``b`` stacked or plain. -> [K, P]."""
  def dot(x, y):
    y = jnp.broadcast_to(y, x.shape)
    return jnp.sum((x * y).reshape(x.shape[0], -1), axis=1)
  return jnp.stack(
      [dot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                                 strict=True)],
      axis=1)


def stacked_leaf_sq_norms(a: StackedParams) -> jax.Array:
  """Per-client, per-leaf squared L2 norms. -> [K, P]."""
  return jnp.stack(
      [jnp.sum(jnp.square(x).reshape(x.shape[0], -1), axis=1)
       for x in jax.tree.leaves(a)], axis=1)


def leaf_sq_norms(tree: Params) -> jax.Array:
  """Per-leaf squared L2 norms of one tree. -> [P]."""
  return jnp.stack([jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)])


# ---------------------------------------------------------------------------
# Layers.


class LayerStructure(NamedTuple):
  """How the leaves of a params tree group into layers.

  Attributes:
    names: one name per layer (the '/'-joined path of the parent node for
      granularity "layer", of the leaf for "leaf").
    leaf_to_layer: for each leaf (in ``jax.tree.leaves`` order), its layer.
  """
  names: tuple[str, ...]
  leaf_to_layer: tuple[int, ...]

  @property
  def num_layers(self) -> int:
    return len(self.names)

  def segment_matrix(self) -> jax.Array:
    """[P, L] 0/1 matrix mapping leaves to layers (for per-layer sums)."""
    return jax.nn.one_hot(jnp.asarray(self.leaf_to_layer), self.num_layers)


def _path_names(path) -> list[str]:
  names = []
  for entry in path:
    if isinstance(entry, jax.tree_util.DictKey):
      names.append(str(entry.key))
    elif isinstance(entry, jax.tree_util.GetAttrKey):
      names.append(entry.name)
    elif isinstance(entry, jax.tree_util.SequenceKey):
      names.append(str(entry.idx))
    else:
      names.append(str(entry))
  return names


def layer_structure(params: Params, granularity: str = "layer"
                   ) -> LayerStructure:
  """Groups the leaves of ``params`` into layers.

  Args:
    params: a params tree (plain or stacked: only paths are read).
    granularity: "layer" groups leaves sharing a parent node (kernel + bias
      of one module; BatchNorm statistics of a module form their own layer
      under the 'batch_stats' collection); "leaf" makes every leaf a layer.

  Returns:
    The ``LayerStructure`` (static Python data, safe to close over in jit).
  """
  if granularity not in ("layer", "leaf"):
    raise ValueError(
        f"granularity must be 'layer' or 'leaf', got {granularity!r}")
  paths = [_path_names(p) for p, _ in jax.tree_util.tree_flatten_with_path(
      params)[0]]
  names: list[str] = []
  leaf_to_layer = []
  for path in paths:
    key = "/".join(path if granularity == "leaf" else path[:-1]) or "/".join(
        path)
    if key not in names:
      names.append(key)
    leaf_to_layer.append(names.index(key))
  return LayerStructure(tuple(names), tuple(leaf_to_layer))


def to_layers(per_leaf: jax.Array, structure: LayerStructure) -> jax.Array:
  """Sums per-leaf quantities into per-layer ones: [..., P] -> [..., L]."""
  return per_leaf @ structure.segment_matrix().astype(per_leaf.dtype)


# ---------------------------------------------------------------------------
# Angles.


def safe_cosine(dot: jax.Array, sq_norm_a: jax.Array,
                sq_norm_b: jax.Array) -> jax.Array:
  """cos = dot / (|a| |b|), clipped to [-1, 1]; 0 when either norm is 0.

  A zero vector has no direction; by convention it is orthogonal to
  everything (cosine 0, angle pi/2), which never produces NaN.
  """
  denom_sq = sq_norm_a * sq_norm_b
  ok = denom_sq > NORM_EPS**2
  cos = dot / jnp.sqrt(jnp.where(ok, denom_sq, 1.0))
  return jnp.where(ok, jnp.clip(cos, -1.0, 1.0), 0.0)


def safe_angle(dot, sq_norm_a, sq_norm_b) -> jax.Array:
  """arccos of ``safe_cosine`` in [0, pi]; pi/2 for zero vectors."""
  return jnp.arccos(safe_cosine(dot, sq_norm_a, sq_norm_b))


def flat_size(tree: Params) -> int:
  return sum(x.size for x in jax.tree.leaves(tree))


# ---------------------------------------------------------------------------
# Per-layer norms and angles over a stacked tree.


def single_layer_structure(params: Params) -> LayerStructure:
  """Every leaf of ``params`` in one layer named "model" (whole-model rules).

  With it, the per-layer helpers below compute whole-model quantities: the
  angle of the concatenation of all leaves (FedAdp), the norm of the whole
  update (FedNNNN).
  """
  return LayerStructure(("model",), (0,) * len(jax.tree.leaves(params)))


def layer_norms(tree: Params, structure: LayerStructure) -> jax.Array:
  """L2 norm of each layer of one tree. -> [L]."""
  return jnp.sqrt(to_layers(leaf_sq_norms(tree), structure))


# The client updates u_k = stacked[k] - offset are formed ``chunk`` clients
# at a time inside a loop (exact differences, one reused [chunk, ...]
# buffer) rather than as a [K, ...] array: on CPU that allocation costs more
# than the arithmetic, and it doubles peak memory. ``chunk=None`` picks
# CPU_CLIENT_CHUNK clients on CPU and the whole cohort (one vectorised step)
# on accelerators, where a long loop of small kernels would be the slow part.
CPU_CLIENT_CHUNK = 4


def _chunk_width(chunk, num_clients: int) -> int:
  if chunk is None:
    chunk = (CPU_CLIENT_CHUNK if jax.default_backend() == "cpu"
             else num_clients)
  if not isinstance(chunk, int) or chunk < 1:
    raise ValueError(f"chunk must be a positive int or None, got {chunk!r}")
  return min(chunk, num_clients)


def _over_client_chunks(stacked: StackedParams, offset: Params, chunk,
                        body, carry):
  """Runs ``carry = body(rows, fresh, updates, carry)`` over client chunks.

  ``rows`` [W] are the chunk's client indices, ``fresh`` [W] bool marks the
  rows not seen by an earlier chunk (the last chunk is shifted back to stay
  in range, so it may repeat rows), ``updates`` the list over leaves of
  [W, size] flattened u_k.
  """
  leaves, offsets = jax.tree.leaves(stacked), jax.tree.leaves(offset)
  num_clients = leaves[0].shape[0]
  width = _chunk_width(chunk, num_clients)

  def step_fn(step, carry):
    start = jnp.minimum(step * width, num_clients - width)
    rows = start + jnp.arange(width)
    updates = [
        (jax.lax.dynamic_slice_in_dim(x, start, width) - o[None]).reshape(
            width, -1) for x, o in zip(leaves, offsets, strict=True)]
    return body(rows, rows >= step * width, updates, carry)

  return jax.lax.fori_loop(0, -(-num_clients // width), step_fn, carry)


def stacked_update_moments(stacked: StackedParams, offset: Params,
                           weights: jax.Array, chunk: Optional[int] = None
                           ) -> tuple[Params, jax.Array]:
  """Weighted sum and per-leaf squared norms of u_k = stacked[k] - offset.

  Args:
    stacked: tree with leaves [K, ...].
    offset: plain tree (e.g. the global params).
    weights: [K].
    chunk: clients per loop step (None: see ``CPU_CLIENT_CHUNK``).

  Returns:
    ``(sum_k weights[k] u_k`` (a plain tree), ``|u_k|^2`` [K, P]).
  """
  leaves = jax.tree.leaves(stacked)

  def body(rows, fresh, updates, carry):
    sums, sq_norms = carry
    chunk_weights = jnp.where(fresh, weights[rows], 0.0)
    sums = [s + chunk_weights.astype(u.dtype) @ u
            for s, u in zip(sums, updates, strict=True)]
    chunk_sq = jnp.stack([jnp.sum(jnp.square(u), axis=1) for u in updates],
                         axis=1)
    return sums, sq_norms.at[rows].set(chunk_sq.astype(sq_norms.dtype))

  sums = [jnp.zeros((x[0].size,), x.dtype) for x in leaves]
  sq_norms = jnp.zeros((leaves[0].shape[0], len(leaves)),
                       jnp.result_type(*leaves))
  sums, sq_norms = _over_client_chunks(stacked, offset, chunk, body,
                                       (sums, sq_norms))
  treedef = jax.tree.structure(offset)
  shapes = [o.shape for o in jax.tree.leaves(offset)]
  return jax.tree.unflatten(treedef, [
      s.reshape(shape) for s, shape in zip(sums, shapes, strict=True)
  ]), sq_norms


def stacked_update_dots(stacked: StackedParams, offset: Params,
                        other: Params, chunk: Optional[int] = None
                        ) -> jax.Array:
  """<u_k, other> per client and leaf, u_k = stacked[k] - offset. [K, P]."""
  others = [y.reshape(-1) for y in jax.tree.leaves(other)]
  leaves = jax.tree.leaves(stacked)

  def body(rows, fresh, updates, dots):
    del fresh  # repeated rows get the same values again
    chunk_dots = jnp.stack(
        [u @ y for u, y in zip(updates, others, strict=True)], axis=1)
    return dots.at[rows].set(chunk_dots.astype(dots.dtype))

  dots = jnp.zeros((leaves[0].shape[0], len(leaves)),
                   jnp.result_type(*leaves))
  return _over_client_chunks(stacked, offset, chunk, body, dots)


# ---------------------------------------------------------------------------
# Per-client state: [N, ...] tables indexed by client id.


def _valid_ids(table: jax.Array, client_ids: jax.Array) -> jax.Array:
  return (client_ids >= 0) & (client_ids < table.shape[0])


def gather_clients(table: jax.Array, client_ids: jax.Array,
                   fill_value) -> jax.Array:
  """``table[client_ids[k]]``, or ``fill_value`` for an id outside [0, N).

  Out-of-range ids read as a client never seen (``fill_value``) instead
  of being clamped (or, for negative ids, wrapped) onto another client's
  row.

  Args:
    table: [N, ...] per-client state.
    client_ids: [K] ids.
    fill_value: the row of an unknown client (a scalar).
  """
  valid = _valid_ids(table, client_ids)
  rows = table[jnp.where(valid, client_ids, 0)]
  valid = valid.reshape(valid.shape + (1,) * (rows.ndim - 1))
  return jnp.where(valid, rows, jnp.asarray(fill_value, table.dtype))


def scatter_clients(table: jax.Array, client_ids: jax.Array,
                    mask: jax.Array, rows: jax.Array) -> jax.Array:
  """Writes ``rows[k]`` to ``table[client_ids[k]]`` for real clients only.

  Padding rows (mask 0) may carry any id; they are sent out of bounds and
  dropped, so they never overwrite a real client's row. So is a real row
  whose id is outside [0, N) (under jit such an id cannot raise; see
  ``checks.check_cohort`` for the eager check): it changes no client's
  state.

  Args:
    table: [N, ...] per-client state.
    client_ids: [K] ids in [0, N); real participants have distinct ids.
    mask: [K], 1 for a real participant.
    rows: [K, ...] new values.
  """
  keep = (mask > 0) & _valid_ids(table, client_ids)
  ids = jnp.where(keep, client_ids, table.shape[0])
  return table.at[ids].set(rows.astype(table.dtype), mode="drop")


# ---------------------------------------------------------------------------
# Coordinate-wise order statistics over the real clients.


def _sorted_real_first(leaf: jax.Array, mask: jax.Array) -> jax.Array:
  """Sorts [K, ...] along the client axis with padded rows moved last."""
  mask = mask.reshape((-1,) + (1,) * (leaf.ndim - 1))
  return jnp.sort(jnp.where(mask > 0, leaf, jnp.inf), axis=0)


def masked_median(stacked: StackedParams, mask: jax.Array) -> Params:
  """Coordinate-wise median over the real clients (mask 1).

  An even number m of real clients gives the mean of the two middle values.
  With no real client the result is undefined (the caller handles it).
  """
  num_real = jnp.sum(mask > 0).astype(jnp.int32)
  lower = jnp.maximum(num_real - 1, 0) // 2
  upper = num_real // 2

  def leaf_median(leaf):
    ordered = _sorted_real_first(leaf, mask)
    low = jax.lax.dynamic_index_in_dim(ordered, lower, keepdims=False)
    high = jax.lax.dynamic_index_in_dim(
        ordered, jnp.minimum(upper, leaf.shape[0] - 1), keepdims=False)
    return ((low + high) / 2).astype(leaf.dtype)
  return jax.tree.map(leaf_median, stacked)


def masked_trimmed_mean(stacked: StackedParams, mask: jax.Array,
                        num_trimmed: jax.Array) -> Params:
  """Coordinate-wise mean of the real values left after trimming.

  Per coordinate, the ``num_trimmed`` largest and ``num_trimmed`` smallest
  of the m real values are removed and the other ``m - 2 num_trimmed`` are
  averaged (the caller keeps that count >= 1).
  """
  num_real = jnp.sum(mask > 0).astype(jnp.int32)
  num_kept = jnp.maximum(num_real - 2 * num_trimmed, 1)

  def leaf_mean(leaf):
    ordered = _sorted_real_first(leaf, mask)
    rank = jnp.arange(leaf.shape[0]).reshape(
        (-1,) + (1,) * (leaf.ndim - 1))
    keep = (rank >= num_trimmed) & (rank < num_real - num_trimmed)
    total = jnp.sum(jnp.where(keep, ordered, 0.0), axis=0)
    return (total / num_kept).astype(leaf.dtype)
  return jax.tree.map(leaf_mean, stacked)


def keep_if_no_clients(mask: jax.Array, new_tree, old_tree):
  """``new_tree`` if the cohort has a real client (mask 1), else ``old_tree``.

  A round whose every row is padding carries no information; rules use this
  to leave the global model (and their state) unchanged then.
  """
  has_clients = jnp.any(mask > 0)
  return jax.tree.map(lambda new, old: jnp.where(has_clients, new, old),
                      new_tree, old_tree)


# ---------------------------------------------------------------------------
# Rows of a kernel: the weights leaving one neuron (per-neuron statistics).

KERNEL_ROWS = ("in_channel", "patch", "out_channel")


def kernel_rows(leaf: jax.Array, conv_rows: str = "in_channel") -> jax.Array:
  """Views a kernel as a matrix of rows, one row per neuron. -> [R, D].

  Kernels follow flax's layout: the input axis is second to last, the output
  axis last. A dense kernel [in, out] gives its ``in`` rows (row j holds the
  weights leaving input neuron j). A convolution kernel [kh, kw, in, out]
  (any number of spatial axes) gives, by ``conv_rows``:

  * "in_channel": one row per input channel, [in, kh*kw*out] (the weights
    leaving feature map j, all spatial offsets);
  * "patch": one row per (kh, kw, in) patch element, [kh*kw*in, out] (the
    kernel as the dense matrix it is on im2col patches);
  * "out_channel": one row per filter, [out, kh*kw*in] (the weights entering
    output channel j).

  A vector (bias, normalisation scale) or scalar is one row.
  """
  if conv_rows not in KERNEL_ROWS:
    raise ValueError(
        f"conv_rows must be one of {KERNEL_ROWS}, got {conv_rows!r}")
  if leaf.ndim <= 1:
    return leaf.reshape(1, -1)
  if leaf.ndim == 2 or conv_rows == "patch":
    return leaf.reshape(-1, leaf.shape[-1])
  axis = -2 if conv_rows == "in_channel" else -1
  moved = jnp.moveaxis(leaf, axis, 0)
  return moved.reshape(moved.shape[0], -1)


def row_cosines(a_rows: jax.Array, b_rows: jax.Array) -> jax.Array:
  """Cosine of each row of ``a_rows`` with the same row of ``b_rows``.

  Args:
    a_rows, b_rows: [R, D].

  Returns:
    [R] in [-1, 1]; 0 where either row is zero (see ``safe_cosine``).
  """
  return safe_cosine(jnp.sum(a_rows * b_rows, axis=-1),
                     jnp.sum(jnp.square(a_rows), axis=-1),
                     jnp.sum(jnp.square(b_rows), axis=-1))


# ---------------------------------------------------------------------------
# Weighted means as running sums (streaming aggregation, one client at a
# time): sum_k p_k x_k with p = normalize_weights(raw, mask), from sums that
# the engine accumulates chunk by chunk.


class MaskedSums(NamedTuple):
  """Sums over clients that give a ``normalize_weights`` mean.

  Attributes:
    weighted: sum over real clients of raw_k x_k (a tree like x).
    total: [] sum over real clients of raw_k.
    uniform: sum_k mask_k x_k, the mean's fallback when ``total`` is 0
      (None for uniform raw weights, where ``weighted`` already is it).
    count: [] sum_k mask_k.
  """
  weighted: Params
  total: jax.Array
  uniform: Optional[Params]
  count: jax.Array


def client_sums(x: Params, mask: jax.Array,
                raw_weight: Optional[jax.Array] = None) -> MaskedSums:
  """One client's term of ``MaskedSums`` (zeros for a padding row).

  Args:
    x: the client's quantity (a tree of arrays).
    mask: [] 1 for a real participant, 0 for a padding row (whose ``x`` is
      dropped, NaN or not).
    raw_weight: [] unnormalised weight (e.g. n_k); None for uniform weights.
  """
  real = mask > 0
  mask = jnp.where(real, mask, 0.0).astype(jnp.float32)
  raw = (jnp.ones((), jnp.float32) if raw_weight is None else
         jnp.asarray(raw_weight, jnp.float32))
  raw = jnp.where(real, raw, 0.0)

  def scaled(weight):
    return jax.tree.map(
        lambda a: jnp.where(real, a * weight.astype(a.dtype),
                            jnp.zeros_like(a)), x)
  return MaskedSums(scaled(raw), raw,
                    None if raw_weight is None else scaled(mask), mask)


def mean_from_sums(sums: MaskedSums) -> Params:
  """sum_k p_k x_k, p = ``normalize_weights(raw, mask)``, from summed terms.

  Equals ``weighted_sum(x, normalize_weights(raw, mask))`` (to rounding),
  including its fallbacks: uniform weights when every real raw weight is 0,
  zeros for a cohort of padding rows only.
  """
  ok = sums.total > 0
  inverse = jnp.where(ok, 1.0 / jnp.where(ok, sums.total, 1.0), 0.0)
  mean = jax.tree.map(lambda a: a * inverse.astype(a.dtype), sums.weighted)
  if sums.uniform is None:
    return mean
  inverse_count = 1.0 / jnp.maximum(sums.count, 1.0)
  return jax.tree.map(
      lambda a, u: jnp.where(ok, a, u * inverse_count.astype(u.dtype)),
      mean, sums.uniform)


def add_update(params: Params, update: Params) -> Params:
  """params + update, leaf by leaf, in the dtypes of ``params``."""
  return jax.tree.map(lambda w, u: (w + u).astype(w.dtype), params, update)


def sum_over_clients(stacked: StackedParams) -> Params:
  """Sum over the leading client axis of every leaf: [K, ...] -> [...]."""
  return jax.tree.map(lambda a: jnp.sum(a, axis=0), stacked)
