"""The codecs: ``Codec`` and its factories, each compressing one flat
float32 vector with an exact message size (``fedjax_agg.compression``
describes them, their sizes and their range).
"""

import fractions
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.registry import Registry
from fedjax_agg.types import PRNGKey


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
