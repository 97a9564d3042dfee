"""Compressed client updates: codecs with exact message sizes.

A *codec* compresses one flat float32 vector x [d] (one leaf of a client's
update w_k - g, flattened): ``encode(x, key) -> payload`` on the client,
``decode(payload, d) -> x_hat`` [d] on the server, and ``bits(d)``, the
exact size of one message (a static Python int: 32 bits per float32 field,
b bits per b-bit integer field). Randomness that client and server both
derive from a shared seed (the round and the client id) is free.

=====================  ===========================  ========  ==========
codec                  bits(d)                      unbiased  reference
=====================  ===========================  ========  ==========
``identity()``         32 d                         exact
``uniform(b)``         b d + 64                     yes
``qsgd(b)``            32 + b d                     yes       [1]
``top_k(f)``           k (32 + ceil(log2 d))        no
``random_k(f)``        32 k + 32                    yes
``sign()``             d + 32                       no        [2]
``hadamard(inner)``    inner.bits(next pow2 >= d)   = inner   [3]
=====================  ===========================  ========  ==========

k = max(1, ceil(f d)). [1] Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD:
Communication-Efficient SGD via Gradient Quantization and Encoding",
NeurIPS 2017 (sent with fixed-width fields, not its Elias coding). [2]
Karimireddy, Rebjock, Stich, Jaggi, "Error Feedback Fixes SignSGD and other
Gradient Compression Schemes", ICML 2019. [3] Vargaftik, Ben-Basat,
Portnoy, Mendelson, Ben-Itzhak, Mitzenmacher, "DRIVE: One-bit Distributed
Mean Estimation", NeurIPS 2021 (and EDEN, ICML 2022): the random rotation.

Scale. The quantisers work on x divided by a power of two near max |x_i|
(``tree_math.power_of_two_scale``, exact), the rotation too once max |x_i|
> 2^64, so scaling x by a power of two scales x_hat by it exactly (entries
below float32's normal range, 1.2e-38, are flushed to 0 on CPU). Range:
for finite x with ||x||_2 <= float32's max (3.4e38), every codec's
decode(encode(x, key), d) is finite, for any key, jitted or not. Values
past the range saturate at +-3.4e38: random_k's x_i d / k (biased there),
and entries that rounding, or hadamard's inverse rotation, takes past it.

Non-finite updates. The codecs are defined for finite x (a NaN may vanish,
e.g. when top_k does not pick it); ``compress_tree`` decodes a leaf with a
non-finite entry as all NaN, so the round's non-finite exclusion still
sees a diverged client. ``with_codec`` compresses every client's update in
the jitted round, optionally with error feedback; message sizes are
host-side numbers (``message_bytes(codec, params)`` per client).
"""

import fractions
import math
from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg import rounds
from fedjax_agg import tree_math
from fedjax_agg.registry import Registry
from fedjax_agg.types import LocalUpdate, Params, PRNGKey, StackedParams

__all__ = ["CODECS", "CODEC_STREAM", "Codec", "CompressionState",
           "compress_tree", "compress_updates", "get", "hadamard",
           "identity", "message_bits", "message_bytes", "qsgd", "random_k",
           "rotate", "sign", "top_k", "uniform", "unrotate",
           "walsh_hadamard", "with_codec"]

_MAX = np.finfo(np.float32).max
_SAFE_MAGNITUDE = np.float32(2.0**64)  # H x of 2^64 such entries fits.
CODEC_STREAM = 2**31 - 2
"""The ``fold_in`` data of the codecs' key stream in the round: neither a client
id (< N) nor the attacks' stream (2^31 - 1), so training keys are unchanged."""


class Codec(NamedTuple):
  """An update compressor for one flat float32 vector.

  Attributes:
    name: what it is, with its arguments ("uniform(bits=2)").
    encode: ``encode(x, key) -> payload``, x [d] float32, the payload a
      pytree of arrays (what the client sends, plus shared randomness).
    decode: ``decode(payload, d) -> x_hat`` [d] float32.
    bits: ``bits(d) -> int``, the exact size of one message for d >= 1.
    unbiased: whether E[decode(encode(x, key))] = x over the keys.
  """
  name: str
  encode: Callable[[jax.Array, PRNGKey], Any]
  decode: Callable[[Any, int], jax.Array]
  bits: Callable[[int], int]
  unbiased: bool


def _checked_size(d) -> int:
  checks.check_int("d", d, low=1)
  return int(d)


def _index_bits(d: int) -> int:
  """ceil(log2 d): bits of an index into d entries (0 for d = 1)."""
  return (d - 1).bit_length()


def _padded_size(d: int) -> int:
  """The next power of two >= d."""
  return 1 << _index_bits(d)


def _num_kept(fraction: float, d: int) -> int:
  """k = max(1, ceil(fraction d)), with ``fraction`` read as the decimal it
  prints as (0.07 of 100 is 7, not the 8 of float rounding)."""
  exact = fractions.Fraction(repr(float(fraction)))
  return min(d, max(1, math.ceil(exact * d)))


def _top_level(num_levels: int) -> np.float32:
  """The largest float32 <= ``num_levels``: a level above would not fit in
  its field (float32(2^32 - 1) rounds up to 2^32)."""
  top = np.float32(num_levels)
  return top if int(top) <= num_levels else np.nextafter(top, np.float32(0))


def _stochastic_round(t: jax.Array, top: np.float32, key: PRNGKey
                      ) -> jax.Array:
  """floor(t) + 1 with probability t - floor(t), else floor(t): E = t."""
  low = jnp.floor(t)
  up = jax.random.uniform(key, t.shape) < t - low
  return jnp.minimum(low + up.astype(t.dtype), top).astype(jnp.uint32)


def _in_scale(low: jax.Array, high: jax.Array):
  """(s, low / s, (high - low) / s), s a power of two near max(|low|,
  |high|) (0 when both are 0: then the others are 0 too)."""
  scale = tree_math.power_of_two_scale(jnp.maximum(jnp.abs(low),
                                                   jnp.abs(high)))
  z_low = tree_math.divide_by_scale(low, scale)
  return scale, z_low, tree_math.divide_by_scale(high, scale) - z_low


def identity() -> Codec:
  """x sent as it is (32 d bits)."""
  def encode(x, key):
    del key
    return x

  def decode(payload, d):
    del d
    return payload
  return Codec("identity", encode, decode, lambda d: 32 * _checked_size(d),
               True)


def uniform(bits: int = 8) -> Codec:
  """Stochastic uniform quantisation to 2^bits levels in [min x, max x].

  Level j of L = 2^bits - 1 stands for min + (j / L)(max - min); x_i is
  rounded to one of its two neighbouring levels with the probabilities
  that make the expectation x_i. Payload: min, max (float32), levels
  (uint32). A constant vector (max = min) is sent exactly.

  Args:
    bits: bits per coordinate, an int in [1, 32].
  """
  checks.check_int("bits", bits, 1, 32)
  num = np.float32(2**bits - 1)
  top = _top_level(2**bits - 1)

  def encode(x, key):
    low, high = jnp.min(x), jnp.max(x)
    scale, z_low, span = _in_scale(low, high)
    unit = ((tree_math.divide_by_scale(x, scale) - z_low)
            / jnp.where(span > 0, span, 1.0))
    return low, high, _stochastic_round(unit * num, top, key)

  def decode(payload, d):
    del d
    low, high, levels = payload
    scale, z_low, span = _in_scale(low, high)
    x_hat = (z_low + (levels.astype(jnp.float32) / num) * span) * scale
    return jnp.clip(x_hat, -_MAX, _MAX)  # Rounded past 3.4e38: max.
  return Codec(f"uniform(bits={bits})", encode, decode,
               lambda d: bits * _checked_size(d) + 64, True)


def qsgd(bits: int = 8) -> Codec:
  """QSGD: x_hat_i = ||x||_2 sign(x_i) l_i / s, l_i in {0, ..., s}.

  s = 2^(bits-1) - 1; l_i is |x_i| / ||x||_2 * s rounded stochastically
  (E[l_i] = |x_i| s / ||x||_2, so the codec is unbiased). Payload: the
  norm (float32), the signs (bool), the levels (uint32). A zero vector
  decodes to zeros.

  Args:
    bits: bits per coordinate, sign included, an int in [2, 32].
  """
  checks.check_int("bits", bits, 2, 32)
  num = np.float32(2**(bits - 1) - 1)
  top = _top_level(2**(bits - 1) - 1)

  def encode(x, key):
    squares = tree_math.sum_of_squares(x)
    scaled_norm = jnp.sqrt(squares.scaled)
    unit = (jnp.abs(tree_math.divide_by_scale(x, squares.scale))
            / jnp.where(scaled_norm > 0, scaled_norm, 1.0))
    norm = jnp.minimum(squares.norm(), _MAX)  # Rounded past 3.4e38: max.
    return norm, x < 0, _stochastic_round(unit * num, top, key)

  def decode(payload, d):
    del d
    norm, negative, levels = payload
    # The barrier keeps XLA from computing norm / num first, which is
    # below float32's normal range (and flushed to 0) for tiny norms.
    unit = jax.lax.optimization_barrier(levels.astype(jnp.float32) / num)
    magnitude = norm * unit
    return jnp.where(negative, -magnitude, magnitude)
  return Codec(f"qsgd(bits={bits})", encode, decode,
               lambda d: 32 + bits * _checked_size(d), True)


def _check_fraction(fraction) -> None:
  checks.check_range("fraction", fraction, 0.0, 1.0, low_open=True)


def top_k(fraction: float = 0.1) -> Codec:
  """The k = max(1, ceil(fraction d)) largest |x_i| (ties: lower index).

  Payload: the values (float32) and their indices (int32, ceil(log2 d)
  bits each).

  Args:
    fraction: the share of coordinates kept, in (0, 1].
  """
  _check_fraction(fraction)

  def encode(x, key):
    del key
    _, index = jax.lax.top_k(jnp.abs(x), _num_kept(fraction, x.shape[0]))
    return x[index], index.astype(jnp.int32)

  def decode(payload, d):
    values, index = payload
    return jnp.zeros((d,), jnp.float32).at[index].set(values)

  def bits(d):
    d = _checked_size(d)
    return _num_kept(fraction, d) * (32 + _index_bits(d))
  return Codec(f"top_k(fraction={fraction})", encode, decode, bits, False)


def _random_index(seed: jax.Array, d: int, k: int) -> jax.Array:
  return jax.random.choice(jax.random.PRNGKey(seed), d, (k,), replace=False)


def random_k(fraction: float = 0.1) -> Codec:
  """k = max(1, ceil(fraction d)) coordinates drawn uniformly without
  replacement, times d / k (each is kept with probability k / d), sent
  as +-3.4e38 where x_i d / k is past float32's range (biased there).

  Payload: the k scaled values (float32) and the 32-bit seed the server
  redraws the indices from.

  Args:
    fraction: the share of coordinates sent, in (0, 1].
  """
  _check_fraction(fraction)

  def encode(x, key):
    d = x.shape[0]
    k = _num_kept(fraction, d)
    seed = jax.random.bits(key, (), jnp.uint32)
    values = x[_random_index(seed, d, k)] * np.float32(d / k)
    return jnp.clip(values, -_MAX, _MAX), seed  # Saturates past 3.4e38.

  def decode(payload, d):
    values, seed = payload
    index = _random_index(seed, d, values.shape[0])
    return jnp.zeros((d,), jnp.float32).at[index].set(values)

  def bits(d):
    return 32 * _num_kept(fraction, _checked_size(d)) + 32
  return Codec(f"random_k(fraction={fraction})", encode, decode, bits, True)


def sign() -> Codec:
  """Scaled sign: x_hat = (||x||_1 / d) sign(x), zero coordinates as +.

  Payload: the scale (float32) and one sign bit per coordinate.
  """
  def encode(x, key):
    del key
    scale = tree_math.power_of_two_scale(jnp.max(jnp.abs(x)))
    mean_abs = jnp.mean(jnp.abs(tree_math.divide_by_scale(x, scale)))
    return mean_abs * scale, x < 0

  def decode(payload, d):
    del d
    mean_abs, negative = payload
    return jnp.where(negative, -mean_abs, mean_abs)
  return Codec("sign", encode, decode, lambda d: _checked_size(d) + 32,
               False)


def walsh_hadamard(x: jax.Array) -> jax.Array:
  """H x for x [n], n a power of two, H Sylvester's Hadamard matrix
  (H_1 = [1], H_2m = [[H_m, H_m], [H_m, -H_m]]), in O(n log n) by
  butterflies on reshapes, never building H."""
  n = x.shape[0]
  if x.ndim != 1 or n & (n - 1):
    raise ValueError(f"x must be a vector of power-of-two length, got shape "
                     f"{x.shape}")
  half = 1
  while half < n:
    pairs = x.reshape(-1, 2, half)
    x = jnp.stack([pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]],
                  axis=1).reshape(n)
    half *= 2
  return x


def _transform_scale(x: jax.Array) -> jax.Array:
  """1, or a power of two near max |x_i| > 2^64 (H x / s fits; exact)."""
  top = jnp.max(jnp.abs(x))
  return jnp.where(top > _SAFE_MAGNITUDE, tree_math.power_of_two_scale(top),
                   np.float32(1))


def rotate(x: jax.Array, key: PRNGKey) -> jax.Array:
  """y = H D x / sqrt(n): x [d] zero-padded to n (the next power of two),
  D the diagonal of +-1 signs drawn from ``key``. -> [n], ||y|| = ||x||."""
  d = x.shape[0]
  n = _padded_size(d)
  padded = jnp.pad(x.astype(jnp.float32), (0, n - d))
  signs = jax.random.rademacher(key, (n,), jnp.float32)
  scale = _transform_scale(padded)
  y = walsh_hadamard(signs * (padded / scale)) / np.float32(math.sqrt(n))
  return jnp.clip(y * scale, -_MAX, _MAX)


def unrotate(y: jax.Array, key: PRNGKey, d: int) -> jax.Array:
  """The inverse of ``rotate``: D H y / sqrt(n), its first ``d`` entries."""
  n = y.shape[0]
  signs = jax.random.rademacher(key, (n,), jnp.float32)
  scale = _transform_scale(y)
  x = signs * walsh_hadamard(y / scale) / np.float32(math.sqrt(n))
  return jnp.clip(x[:d] * scale, -_MAX, _MAX)


def hadamard(inner: Codec | str = "uniform", **inner_args) -> Codec:
  """``inner`` applied to the randomised Hadamard rotation of x ([3]).

  x [d] is sent as ``inner``'s message for ``rotate(x)`` [n]; the server
  decodes and ``unrotate``s it. ``inner.bits(n)`` bits: the signs D are
  shared randomness (their key rides in the payload for ``decode`` but is
  not counted).

  Args:
    inner: the codec of the rotated, padded vector [n], or its registered
      name (built with ``inner_args``, e.g. ``hadamard("uniform",
      bits=2)``, as a config or the command line names it).
    **inner_args: the arguments of a named ``inner``.
  """
  if isinstance(inner, str):
    if inner == "hadamard":
      raise ValueError("inner: a rotation of a rotation is a rotation; name "
                       "a quantiser or sparsifier")
    inner = get(inner, **inner_args)
  elif inner_args:
    raise ValueError(f"inner_args {sorted(inner_args)}: only for an inner "
                     "codec given by name")
  if not isinstance(inner, Codec):
    raise TypeError(f"inner must be a Codec or a codec name, got "
                    f"{type(inner).__name__}")

  def encode(x, key):
    sign_key, inner_key = jax.random.split(key)
    # The sign key travels with the payload for decode, but it is shared
    # randomness: it costs no bits.
    return sign_key, inner.encode(rotate(x, sign_key), inner_key)

  def decode(payload, d):
    sign_key, inner_payload = payload
    return unrotate(inner.decode(inner_payload, _padded_size(d)), sign_key,
                    d)

  def bits(d):
    return inner.bits(_padded_size(_checked_size(d)))
  return Codec(f"hadamard({inner.name})", encode, decode, bits,
               inner.unbiased)


CODECS = Registry("codec", {
    "identity": identity,
    "uniform": uniform,
    "qsgd": qsgd,
    "top_k": top_k,
    "random_k": random_k,
    "sign": sign,
    "hadamard": hadamard,
})
"""The update codecs by name: name -> factory of a ``Codec`` (``get`` builds
one)."""


def get(name: str, **kwargs) -> Codec:
  """Builds the registered codec ``name`` (ValueError listing the names)."""
  return CODECS.build(name, **kwargs)


def _shape(leaf) -> tuple[int, ...]:
  return tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf)


def compress_tree(codec: Codec, tree: Params, key: PRNGKey) -> Params:
  """Every leaf of ``tree`` flattened, sent through ``codec`` and decoded.

  Leaf i uses ``jax.random.fold_in(key, i)``; the result has the leaf's
  shape and dtype. A leaf with a non-finite entry decodes as all NaN (see
  the module docstring); empty leaves are kept as they are.
  """
  leaves, treedef = jax.tree.flatten(tree)
  decoded = []
  for i, leaf in enumerate(leaves):
    leaf = jnp.asarray(leaf)
    if leaf.size == 0:
      decoded.append(leaf)
      continue
    x = leaf.reshape(-1).astype(jnp.float32)
    x_hat = codec.decode(codec.encode(x, jax.random.fold_in(key, i)), x.size)
    x_hat = jnp.where(jnp.all(jnp.isfinite(x)), x_hat, jnp.nan)
    decoded.append(x_hat.reshape(leaf.shape).astype(leaf.dtype))
  return jax.tree.unflatten(treedef, decoded)


def compress_updates(codec: Codec, updates: StackedParams,
                     client_ids: jax.Array, key: PRNGKey) -> StackedParams:
  """The cohort's updates, each sent through ``codec`` and decoded.

  Row k goes through ``compress_tree`` with the key fold_in(fold_in(key,
  CODEC_STREAM), client_ids[k]): a client's draw depends on the round's
  key and its id, not on its row.

  Args:
    codec: the compressor.
    updates: [K, ...] one update per row.
    client_ids: [K] int, the client of each row.
    key: the round's key.

  Returns:
    [K, ...] the decoded updates, shaped and typed as ``updates``.
  """
  keys = jax.vmap(jax.random.fold_in, (None, 0))(
      jax.random.fold_in(key, CODEC_STREAM), client_ids)
  return jax.vmap(lambda u, k: compress_tree(codec, u, k))(updates, keys)


def message_bits(codec: Codec, tree: Any) -> int:
  """Bits of one client's message: the sum of ``codec.bits`` over the
  non-empty leaves of ``tree`` (arrays or ``jax.ShapeDtypeStruct``s)."""
  sizes = [math.prod(_shape(leaf)) for leaf in jax.tree.leaves(tree)]
  return sum(codec.bits(size) for size in sizes if size > 0)


def message_bytes(codec: Codec, tree: Any) -> int:
  """``message_bits`` rounded up to whole bytes."""
  return -(-message_bits(codec, tree) // 8)


class CompressionState(NamedTuple):
  """The client state of ``with_codec``.

  Attributes:
    inner: the wrapped update's client state.
    residuals: with error feedback, e_i per client: a tree like the model
      of float32 [N, ...] leaves (zeros at first); else ``()``.
  """
  inner: Any
  residuals: Any


def _relative_error(sent, decoded, rows: jax.Array) -> jax.Array:
  """Mean over ``rows`` of ||decoded - sent||^2 / max(||sent||^2, tiny)."""
  error = jax.vmap(tree_math.tree_norm)(
      jax.tree.map(jnp.subtract, decoded, sent))
  norm = jax.vmap(tree_math.tree_norm)(sent)
  ratio = jnp.square(error / jnp.maximum(norm, jnp.finfo(jnp.float32).tiny))
  total = jnp.sum(jnp.where(rows, ratio, 0.0))
  return total / jnp.maximum(jnp.sum(rows), 1).astype(jnp.float32)


def with_codec(codec: Codec, local_update: LocalUpdate | Callable[..., Any],
               *, error_feedback: bool = False,
               model_template: Optional[Params] = None) -> LocalUpdate:
  """``local_update`` whose clients send their updates through ``codec``.

  After the inner update, row k (client i) sends u = w_k - g, plus e_i
  with error feedback (EF-SGD of Karimireddy et al., ICML 2019),
  through ``compress_updates`` (the key fold_in(fold_in(round key,
  CODEC_STREAM), i)); its model becomes g + C(u). With error feedback
  e_i <- u - C(u) for the real rows (mask > 0) whose u and C(u) are
  finite; other rows change no residual. The result's losses are the
  inner update's (of the uncompressed models).

  Args:
    codec: the compressor (``compression.get(...)``).
    local_update: the clients' training: a ``LocalUpdate`` (its state and
      ``personalize`` are kept) or a function with the engine's interface
      ``(global_params, data, client_ids, learning_rates, num_steps, key)
      -> LocalResult``.
    error_feedback: keep a residual per client (a model-sized [N, ...]
      table: N x the model in memory).
    model_template: the model's params (or their ``jax.ShapeDtypeStruct``),
      needed for the residual table; when given, the round's global params
      are checked against its shapes.

  Returns:
    A ``LocalUpdate`` whose state is a ``CompressionState``. Metrics: the
    inner update's and ``compression_error`` (mean over the real rows of
    ||C(u) - u||^2 / ||u||^2).

  Raises:
    TypeError: an argument of the wrong kind.
    ValueError: ``error_feedback`` without ``model_template``; (traced)
      global params shaped unlike ``model_template``.
  """
  if not isinstance(codec, Codec):
    raise TypeError(f"codec must be a Codec, got {type(codec).__name__}")
  checks.check_bool("error_feedback", error_feedback)
  if error_feedback and model_template is None:
    raise ValueError("model_template: error_feedback=True keeps a residual "
                     "per client shaped like the model; pass the model's "
                     "params (or their jax.ShapeDtypeStruct) as "
                     "model_template")
  inner = rounds.as_local_update(local_update)
  template = None if model_template is None else jax.tree.map(
      lambda leaf: jax.ShapeDtypeStruct(_shape(leaf), jnp.float32),
      model_template)

  def init(num_clients):
    checks.check_int("num_clients", num_clients, low=1)
    residuals = ()
    if error_feedback:
      residuals = jax.tree.map(
          lambda s: jnp.zeros((num_clients,) + s.shape, jnp.float32),
          template)
    return CompressionState(inner.init(num_clients), residuals)

  def check_template(global_params):
    want = jax.tree.map(lambda s: s.shape, template)
    got = jax.tree.map(_shape, global_params)
    if template is not None and (
        jax.tree.structure(template) != jax.tree.structure(global_params)
        or jax.tree.leaves(want) != jax.tree.leaves(got)):
      raise ValueError(f"model_template: its shapes {want} differ from the "
                       f"round's global params {got}")

  def update(client_state, global_params, data, client_ids, mask,
             learning_rates, num_steps, round_num, key):
    chex.assert_rank([client_ids, mask], 1)
    check_template(global_params)
    result, inner_state, metrics = inner.update(
        client_state.inner, global_params, data, client_ids, mask,
        learning_rates, num_steps, round_num, key)
    trained = result.client_params
    chex.assert_tree_shape_prefix(trained, client_ids.shape)
    update_of = jax.tree.map(
        lambda w, g: w.astype(jnp.float32) - g.astype(jnp.float32)[None],
        trained, global_params)
    sent = update_of
    residuals = client_state.residuals
    if error_feedback:
      sent = jax.tree.map(
          lambda u, table: u + tree_math.gather_clients(table, client_ids,
                                                        0.0),
          sent, residuals)
    decoded = compress_updates(codec, sent, client_ids, key)
    # Where the decoded update is the client's own (w - g), the server has
    # w: g + (w - g) may round away from it, so the identity codec (and a
    # coordinate sent exactly) changes nothing, bit for bit.
    client_params = jax.tree.map(
        lambda g, x, u, w: jnp.where(
            x == u, w, (g.astype(jnp.float32)[None] + x).astype(w.dtype)),
        global_params, decoded, update_of, trained)
    written = ((mask > 0) & engine.rows_finite(sent)
               & engine.rows_finite(decoded))
    if error_feedback:
      residuals = jax.tree.map(
          lambda table, u, x: tree_math.scatter_clients(
              table, client_ids, written.astype(jnp.float32), u - x),
          residuals, sent, decoded)
    metrics = {**metrics,
               "compression_error": _relative_error(sent, decoded, written)}
    return (result._replace(client_params=client_params),
            CompressionState(inner_state, residuals), metrics)

  personalize = None
  if inner.personalize is not None:
    def personalize(client_state, global_params, client_ids):
      return inner.personalize(client_state.inner, global_params, client_ids)
  return LocalUpdate(init=init, update=update, personalize=personalize)
