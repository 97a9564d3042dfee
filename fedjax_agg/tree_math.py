"""Shared tree math: weighted sums over clients, layers, norms and angles.

Every aggregator and local objective builds on these helpers instead of
re-deriving norms, dot products and weighted means. ``stacked`` trees carry a
leading client axis [K, ...]; plain trees are one model. The chunked
statistics of the client updates (FedAdp, FedLayerWise, FedNNNN) live in
``fedjax_agg.update_stats``.

Layers. A *leaf* is one array of the params tree. A *layer* groups the leaves
that live under the same parent node (a flax module's ``kernel`` and
``bias``). ``layer_structure(params, granularity)`` gives the grouping used
by the per-layer rules (FedLayerWise, FedNNNN's per-layer norms).

Padding. Rows of a cohort with mask 0 (or weight 0) may hold anything, NaN
and inf included; every sum here selects them out (``jnp.where``) rather
than multiplying them by 0, which would keep a NaN.

Scale. Norms and cosines never square raw values: a vector is first divided
by a power of two close to its largest magnitude (``SumOfSquares``), exactly
(no rounding), so updates of any finite float32 magnitude (1e-30 or 1e38)
give the same angles as at magnitude 1, where a plain sum of squares would
underflow to 0 or overflow to inf.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_agg.types import Params, StackedParams

FULL = jax.lax.Precision.HIGHEST
"""The precision of every matrix product of the aggregation math.

On a GPU, XLA computes a float32 matrix product with TF32 (10-bit
mantissas) unless told otherwise, and on a TPU with bfloat16 passes; a
per-layer dot, norm, Gram matrix or weighted mean over clients would then
differ from the CPU's by about 1e-3 relative and could change which
clients a robust rule selects. These products are small next to local
training, so the aggregation math always asks for full float32 precision
(``tests/test_precision.py`` checks every registered rule's jaxpr).
"""

__all__ = ["FULL", "LayerStructure", "MaskedSums", "SAFE_PLAIN_SUM",
    "SumOfSquares",
    "add_update", "broadcast_to_clients", "client_norms", "client_sums",
    "client_updates", "clip_scale", "cosine", "cosines",
    "divide_by_scale", "from_plain_sum", "gather_clients", "is_statistic",
    "leaf_paths", "select_leaves",
    "keep_if_no_clients", "layer_norms", "layer_structure",
    "layer_sums_of_squares", "leaf_sums_of_squares", "max_to_layers",
    "mean_from_sums", "normalize_weights", "plain_sum_is_safe",
    "power_of_two_scale", "scatter_clients", "single_layer_structure",
    "sum_of_squares", "sum_over_clients", "to_layers", "tree_norm",
    "tree_scale", "tree_sub", "vector_norm", "weighted_leaf_sum",
    "weighted_sum"]


def tree_sub(a: Params, b: Params) -> Params:
  """a - b, leaf by leaf (``optax.tree.sub``)."""
  return optax.tree.sub(a, b)


def tree_scale(scalar, tree: Params) -> Params:
  """scalar * tree, every leaf multiplied by ``scalar``
  (``optax.tree.scale``)."""
  return optax.tree.scale(scalar, tree)


def add_update(params: Params, update: Params) -> Params:
  """params + update, leaf by leaf, in the dtypes of ``params``."""
  return jax.tree.map(lambda w, u: (w + u).astype(w.dtype), params, update)


def broadcast_to_clients(tree: Params, num_clients: int) -> StackedParams:
  """Stacks ``num_clients`` copies of ``tree`` along a new leading axis."""
  return jax.tree.map(
      lambda t: jnp.broadcast_to(t, (num_clients,) + t.shape), tree)


def client_updates(client_params: StackedParams, global_params: Params,
                   mask: jax.Array) -> StackedParams:
  """w_k - g for every client, [K, ...]; padding rows (mask 0) are zeros.

  Robust rules compare updates rather than models: they are small next to
  the weights, so distances lose less to rounding, and a padding row (which
  may hold NaN or inf) is selected out here once.
  """
  def leaf(c, g):
    real = (mask > 0).reshape((-1,) + (1,) * g.ndim)
    return jnp.where(real, c - g, jnp.zeros_like(c))
  return jax.tree.map(leaf, client_params, global_params)


def sum_over_clients(stacked: StackedParams) -> Params:
  """Sum over the leading client axis of every leaf: [K, ...] -> [...]."""
  return jax.tree.map(lambda a: jnp.sum(a, axis=0), stacked)


# ---------------------------------------------------------------------------
# Weighted sums over the client axis.


def normalize_weights(weights: jax.Array, mask: jax.Array) -> jax.Array:
  """Masked weights summing to 1 over real clients; [K] -> [K].

  Padded clients (mask 0) get weight 0, whatever their weight was (NaN
  included). If every real weight is 0 the real clients share the weight
  equally; an all-padding cohort gives all zeros.
  """
  weights = jnp.where(mask > 0, weights, 0.0)
  # The inner where divides by 1, not 0, in the discarded branch: jnp.where
  # evaluates both sides, and a 0/0 there, invisible in the value, would
  # still make the gradient NaN.
  total = jnp.sum(weights)
  uniform = jnp.where(mask > 0, 1.0, 0.0) / jnp.maximum(
      jnp.sum(mask > 0), 1)
  return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0),
                   uniform)


def weighted_leaf_sum(leaf: jax.Array, weights: jax.Array) -> jax.Array:
  """sum_k weights[k] leaf[k] over [K, ...]; rows of weight 0 are skipped.

  A skipped row contributes exactly 0 even if it holds NaN or inf (a
  padding row), where ``0 * nan`` would be NaN. Only a non-finite plain sum
  can hold such a product, so the rows are selected out (a copy of the
  leaf) only then.
  """
  weights = weights.astype(leaf.dtype)
  # The plain product is tried first: it needs no copy of the leaf, and a
  # finite total proves that no skipped row held NaN or inf. Under vmap the
  # cond turns into a select and both branches run; the result is the same.
  total = jnp.tensordot(weights, leaf, axes=(0, 0), precision=FULL)

  def without_skipped_rows():
    live = (weights != 0).reshape((-1,) + (1,) * (leaf.ndim - 1))
    return jnp.tensordot(weights, jnp.where(live, leaf, jnp.zeros_like(leaf)),
                         axes=(0, 0), precision=FULL)
  return jax.lax.cond(jnp.all(jnp.isfinite(total)), lambda: total,
                      without_skipped_rows)


def weighted_sum(stacked: StackedParams, weights: jax.Array) -> Params:
  """Sum over the client axis of ``weights[k] * stacked[k]``.

  Args:
    stacked: tree with leaves [K, ...].
    weights: [K] (already normalised by the caller when a mean is wanted);
      rows of weight 0 are skipped (``weighted_leaf_sum``).
  """
  return jax.tree.map(lambda leaf: weighted_leaf_sum(leaf, weights), stacked)


def keep_if_no_clients(mask: jax.Array, new_tree, old_tree):
  """``new_tree`` if the cohort has a real client (mask 1), else ``old_tree``.

  A round whose every row is padding carries no information; rules use this
  to leave the global model (and their state) unchanged then.
  """
  return optax.tree.where(jnp.any(mask > 0), new_tree, old_tree)


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


def leaf_paths(tree: Params) -> list[str]:
  """'/'-joined key path of every leaf ("params/fc1/kernel"), in
  ``jax.tree.leaves`` order."""
  return ["/".join(_path_names(p))
          for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def select_leaves(tree: Params, predicate) -> Params:
  """A tree of Python bools shaped like ``tree``: ``predicate(path)``."""
  return jax.tree.unflatten(jax.tree.structure(tree),
                            [bool(predicate(p)) for p in leaf_paths(tree)])


def is_statistic(path: str) -> bool:
  """Leaves of the ``batch_stats`` collection (BatchNorm running
  statistics): model state, not parameters (they have no gradient)."""
  return path.split("/", 1)[0] == "batch_stats"


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
    # A leaf at the root has no parent node; it becomes a layer of its own
    # under its own name rather than merging with other root leaves under "".
    key = "/".join(path if granularity == "leaf" else path[:-1]) or "/".join(
        path)
    # Layers are numbered in order of first appearance in leaves order, so
    # the same tree always gives the same layer indices; per-layer state
    # (FedLayerWise's [N, L] smoothed angles) is indexed by them.
    if key not in names:
      names.append(key)
    leaf_to_layer.append(names.index(key))
  return LayerStructure(tuple(names), tuple(leaf_to_layer))


def single_layer_structure(params: Params) -> LayerStructure:
  """Every leaf of ``params`` in one layer named "model" (whole-model rules).

  With it, the per-layer helpers compute whole-model quantities: the angle
  of the concatenation of all leaves (FedAdp).
  """
  return LayerStructure(("model",), (0,) * len(jax.tree.leaves(params)))


def to_layers(per_leaf: jax.Array, structure: LayerStructure) -> jax.Array:
  """Sums per-leaf quantities into per-layer ones: [..., P] -> [..., L]."""
  return jnp.matmul(per_leaf,
                    structure.segment_matrix().astype(per_leaf.dtype),
                    precision=FULL)


def max_to_layers(per_leaf: jax.Array, structure: LayerStructure
                  ) -> jax.Array:
  """Largest per-leaf value of each layer, for values >= 0. [..., P] ->
  [..., L]."""
  member = structure.segment_matrix() > 0  # [P, L]
  # The fill value 0 for non-members is only neutral because the values
  # are >= 0 (scales and norms); a general max would need -inf here.
  return jnp.max(jnp.where(member, per_leaf[..., :, None], 0), axis=-2)


# ---------------------------------------------------------------------------
# Scale-safe sums of squares, norms and cosines.


def power_of_two_scale(max_abs: jax.Array) -> jax.Array:
  """A power of two s with max_abs / s in [1, 2) (in [1, 4) from
  2^(maxexp - 1) up, in float32 from 2^127); 0 where max_abs is 0.

  Dividing by s is exact, so a statistic of x / s is the statistic of x
  times a power of two, to the bit, and never overflows.
  """
  # Piecewise constant: no gradient flows through a scale.
  max_abs = jax.lax.stop_gradient(max_abs)
  info = jnp.finfo(max_abs.dtype)
  # frexp gives max_abs = m * 2^e with m in [0.5, 1), so 2^(e-1) leaves a
  # ratio in [1, 2). The clip keeps the scale a normal float: a subnormal
  # max_abs gets 2^minexp (ratio below 1, the division still exact). At the
  # top the scale stops at 2^(maxexp - 2) (ratio below 4): XLA divides by
  # multiplying with the reciprocal, and that of 2^(maxexp - 1) is
  # subnormal, which the CPU flushes to 0 (every norm would read 0).
  _, exponent = jnp.frexp(max_abs)
  exponent = jnp.clip(exponent - 1, info.minexp, info.maxexp - 2)
  scale = jnp.ldexp(jnp.ones_like(max_abs), exponent)
  return jnp.where(max_abs > 0, scale, jnp.zeros_like(max_abs))


def divide_by_scale(x: jax.Array, scale: jax.Array) -> jax.Array:
  """x / scale, with a scale of 0 (x is all zeros there) taken as 1."""
  return x / jnp.where(scale > 0, scale, jnp.ones_like(scale))


class SumOfSquares(NamedTuple):
  """sum_i x_i^2 = scale^2 * scaled, kept apart so that neither overflows.

  Attributes:
    scale: a power of two near max_i |x_i| (``power_of_two_scale``); 0 for
      a zero vector.
    scaled: sum_i (x_i / scale)^2 (0 for a zero vector).
  """
  scale: jax.Array
  scaled: jax.Array

  def norm(self) -> jax.Array:
    """sqrt(sum_i x_i^2) (inf only when the norm exceeds the float range)."""
    return self.scale * jnp.sqrt(self.scaled)


def sum_of_squares(x: jax.Array, axis=-1) -> SumOfSquares:
  """``SumOfSquares`` of ``x`` over ``axis`` (an int or tuple of ints)."""
  scale = power_of_two_scale(jnp.max(jnp.abs(x), axis=axis, keepdims=True))
  scaled = jnp.sum(jnp.square(divide_by_scale(x, scale)), axis=axis)
  return SumOfSquares(jnp.squeeze(scale, axis), scaled)


SAFE_PLAIN_SUM = 2.0**-60
"""The least plain sum of squares taken as exact: one at or above it lost
nothing to underflow that matters (each square below float32's smallest
normal, 1.2e-38, is at most 1e-20 of it per million entries)."""


def from_plain_sum(total: jax.Array) -> SumOfSquares:
  """``SumOfSquares`` of a plain sum of squares known to be finite and 0 or
  at least ``SAFE_PLAIN_SUM`` (scale: a power of two with total / scale^2
  in [1, 8), so again exact)."""
  _, exponent = jnp.frexp(total)
  # Halving the exponent (rounded down) gives scale^2 = 2^(e-1) or 2^(e-2),
  # so total / scale^2 lies in [1, 4) and the division is exact.
  scale = jnp.ldexp(jnp.ones_like(total), (exponent - 1) // 2)
  scale = jnp.where(total > 0, scale, jnp.zeros_like(total))
  return SumOfSquares(scale, divide_by_scale(total, jnp.square(scale)))


def plain_sum_is_safe(total: jax.Array) -> jax.Array:
  """Whether ``from_plain_sum(total)`` is exact enough (finite, no lost
  underflow; an exact 0 may be an underflowed tiny vector, so it is not)."""
  return jnp.isfinite(total) & (total >= SAFE_PLAIN_SUM)


def layer_sums_of_squares(per_leaf: SumOfSquares,
                          structure: LayerStructure) -> SumOfSquares:
  """Per-leaf sums of squares [..., P] combined into per-layer [..., L].

  Each leaf's scaled sum is rescaled to its layer's largest scale (a power
  of two again, so exactly) before the sum over the layer's leaves.
  """
  layer_scale = max_to_layers(per_leaf.scale, structure)
  ratio = divide_by_scale(
      per_leaf.scale,
      jnp.take(layer_scale, jnp.asarray(structure.leaf_to_layer), axis=-1))
  return SumOfSquares(layer_scale,
                      to_layers(jnp.square(ratio) * per_leaf.scaled,
                                structure))


def leaf_sums_of_squares(tree: Params) -> SumOfSquares:
  """Per-leaf ``SumOfSquares`` of one tree. -> [P] each."""
  parts = [sum_of_squares(x, tuple(range(x.ndim)))
           for x in jax.tree.leaves(tree)]
  return SumOfSquares(jnp.stack([p.scale for p in parts]),
                      jnp.stack([p.scaled for p in parts]))


def vector_norm(x: jax.Array, axis=-1) -> jax.Array:
  """L2 norm of ``x`` over ``axis`` without overflow or underflow."""
  return sum_of_squares(x, axis).norm()


def layer_norms(tree: Params, structure: LayerStructure) -> jax.Array:
  """L2 norm of each layer of one tree. -> [L]."""
  return layer_sums_of_squares(leaf_sums_of_squares(tree), structure).norm()


def tree_norm(tree: Params) -> jax.Array:
  """L2 norm of all the leaves of one tree together. -> []."""
  return layer_norms(tree, single_layer_structure(tree))[0]


def cosine(scaled_dot: jax.Array, a: SumOfSquares,
           b: SumOfSquares) -> jax.Array:
  """cos(a, b) = <a/s_a, b/s_b> / (|a/s_a| |b/s_b|), in [-1, 1].

  Args:
    scaled_dot: the dot product of the two vectors each divided by its
      ``SumOfSquares.scale`` (``a.scale``, ``b.scale``).
    a, b: the vectors' sums of squares.

  Returns:
    The cosine; 0 when either vector is zero (no direction: by convention
    orthogonal to everything, angle pi/2, never NaN).
  """
  # Rounding can push the quotient a few ulps past 1 in magnitude; the clip
  # keeps arccos of it finite. The where inside the sqrt keeps a zero vector
  # from dividing by 0 in the discarded branch (NaN gradients otherwise).
  ok = (a.scaled > 0) & (b.scaled > 0)
  denominator = jnp.sqrt(jnp.where(ok, a.scaled * b.scaled, 1.0))
  return jnp.where(ok, jnp.clip(scaled_dot / denominator, -1.0, 1.0), 0.0)


def cosines(a: jax.Array, b: jax.Array, axis=-1) -> jax.Array:
  """Cosine of ``a`` and ``b`` along ``axis`` (e.g. row by row of [R, D]).

  Scale-safe (module docstring); 0 where either vector is zero.
  """
  a_squares, b_squares = sum_of_squares(a, axis), sum_of_squares(b, axis)
  scaled_dot = jnp.sum(
      divide_by_scale(a, jnp.expand_dims(a_squares.scale, axis))
      * divide_by_scale(b, jnp.expand_dims(b_squares.scale, axis)),
      axis=axis)
  return cosine(scaled_dot, a_squares, b_squares)


def client_norms(stacked: StackedParams) -> jax.Array:
  """Whole-model L2 norm of each client's tree (scale-safe). [K, ...] -> [K]."""
  return jax.vmap(tree_norm)(stacked)


def clip_scale(norm: jax.Array, max_norm) -> jax.Array:
  """min(1, max_norm / norm): the factor that clips a vector to ``max_norm``.

  1 where ``norm`` is 0 (nothing to clip) or at most ``max_norm``.
  """
  # The inner where avoids max_norm / 0 in the unused branch: an inf there
  # would not change the value but would make the gradient NaN.
  over = norm > max_norm
  return jnp.where(over, max_norm / jnp.where(over, norm, 1.0), 1.0)


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
  # Index N, not -1: a negative index would wrap onto the last client's row
  # instead of being dropped by mode="drop".
  ids = jnp.where(keep, client_ids, table.shape[0])
  return table.at[ids].set(rows.astype(table.dtype), mode="drop")


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
  # A mask entry that is not > 0 (negative, NaN) is padding everywhere
  # else, so it must add 0 to the count too, not its own value.
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
