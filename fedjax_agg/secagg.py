"""Simulated secure aggregation around any rule that is a sum over clients.

Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal and
Seth, "Practical Secure Aggregation for Privacy-Preserving Machine
Learning", CCS 2017.

In the protocol each client masks a vector of b-bit integers with pairwise
masks that cancel in the sum, so the server learns only the sum modulo 2^b
of the inputs of the clients that survive the round (the masks of dropped
clients are unmasked by the others). This module simulates its numerics,
not its cryptography:

1. Client k clips its update coordinate-wise, w_k' = g + clip(w_k - g,
   -clip, clip), and computes the wrapped rule's statistics
   ``stats_k = aggregator.stream.client_stats(g, w_k', info_k)``.
2. Each statistic x (a leaf of ``stats_k``) with public range R becomes
   fixed point: q = SR(clip(x, -R, R) L / R), an integer in [-L, L], where
   SR is stochastic rounding (floor, plus 1 with the probability of the
   fractional part) with a key of the round and the client id.
3. The server sees s = sum_k q_k mod 2^b, read as a signed integer in
   [-2^(b-1), 2^(b-1)), summed over the survivors only: padding and dropped
   rows (mask 0) contribute exactly 0, as in the protocol.
4. It decodes s R / L and hands the result to the wrapped rule's
   ``finalize``.

The price is quantisation error: bounded (less than one level, R / L, per
client and coordinate, plus float32 rounding) and unbiased
(E[decode(encode(x))] = clip(x, -R, R)).

Levels. L = floor((2^(b-1) - 1) / cohort_size), so the sum of
``cohort_size`` values in [-L, L] never leaves the signed b-bit range: with
at most ``cohort_size`` survivors the modular sum equals the true sum and
no overflow can happen. Exact values of L:

=====  ===========  ============  ============
bits   cohort 10    cohort 100    cohort 1000
=====  ===========  ============  ============
8      12           1             (needs 11)
16     3276         327           32
20     52428        5242          524
32     214748364    21474836      2147483
=====  ===========  ============  ============

A client's decoded statistic is off by less than R (1 / L + 2^-22): one
level, plus float32's rounding of x L / R (relative 2^-23, and up to 2^-24
more where L exceeds the largest float32 below it). The float term matters
only above about 2^23 levels, where float32 cannot hold a fraction of a
level (32 bits): there the error is float32's own, and the rounding is
unbiased up to it.

Ranges. They are public, derived from the wrapped rule without testing
its name: the statistics of a zero update of the largest client,
``probe = client_stats(g, g, info with num_examples=max_examples, mask 1,
losses 0)``, give the largest raw weight any client can have, W = max(1,
max |scalar leaves of probe|) (n_max for example-weighted FedAvg, 1 for
uniform weights). Scalar (0-d) leaves get R = W, every other leaf R = clip
W. A statistic still outside its range (a client with more than
``max_examples`` examples, a norm of the whole update such as FedNNNN's,
an infinity; a NaN encodes as 0) is clipped by ``encode`` and counted in
the metric "secagg_clipped". Statistics must be floating point: a rule
whose statistics hold an integer leaf is refused (TypeError naming the
leaf) when the wrapper is first traced, since passing it through would
leave it outside the secure sum.

Keys. Client k's rounding draws one uniform vector, over all its
statistics flattened (``jax.tree.leaves`` order), from fold_in(fold_in(
info.key, ``SECAGG_STREAM``), client id): it depends on the round and the
client, not on the client's row, so the stacked and the streaming forms
(and any order or padding of the cohort) draw the same numbers.

Forms. ``stream.client_stats`` returns the encoded int32 statistics; the
engine sums them in int32, which wraps modulo 2^32, a multiple of 2^b, and
``stream.finalize`` reduces the sum to b bits, decodes and calls the
wrapped rule's finalize. The stacked ``aggregate`` encodes every row with
the same function and sums with ``modular_sum``: both forms hand the
server the same integers, to the bit, and decode them to the same floats.
What the wrapped rule's finalize computes from them is float arithmetic
that XLA compiles per program (it may fuse a * b + c into one FMA in one
program and not in another), so the two forms' outputs agree to float32
rounding. Overflow is never silent: ``aggregate`` counts, exactly, the
coordinates whose true integer sum left the b-bit range (metric
"secagg_overflow"; 0 by construction of L while at most ``cohort_size``
clients are real). The streaming form only ever holds the wrapped sum, so
it cannot count overflowing coordinates: it reports 0 when at most
``cohort_size`` clients are real (overflow is then impossible) and -1
(unknown) otherwise. Outside jit both forms refuse such a cohort.

The wrapped rule's noise, if any (DP-FedAvg), is added by its finalize
after decoding, i.e. centrally by the server.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.types import (Aggregator, ClientInfo, INFO_AXES, PRNGKey,
                              StreamingForm)

__all__ = ["MAX_SUMMANDS", "SECAGG_STREAM", "SecAggStats", "decode",
           "encode", "levels", "message_bytes", "modular_sum",
           "secure_aggregation"]

SECAGG_STREAM = 2**31 - 3
"""The ``fold_in`` data of the rounding keys in the round's aggregation key:
neither a client id (< N), nor the streams of the attacks (2^31 - 1) and codecs
(2^31 - 2)."""

MAX_SUMMANDS = 2**15
"""The most rows ``modular_sum`` sums exactly: K sums of 16-bit halves (at most
65535 each) stay below 2^31."""



class SecAggStats(NamedTuple):
  """One client's (or the cohort's summed) secure-aggregation statistics.

  Attributes:
    encoded: the wrapped rule's statistics, every leaf int32 fixed point
      (one client: in [-L, L]; summed: the sum modulo 2^32).
    num_clipped: [] int32, real clients with a statistic clipped to its
      range.
    num_update_clipped: [] int32, real clients with an update coordinate
      clipped to [-clip, clip].
  """
  encoded: Any
  num_clipped: jax.Array
  num_update_clipped: jax.Array


def _static_int(name: str, value) -> None:
  if checks.is_traced(value):
    raise TypeError(f"{name} must be a static Python int, got a traced "
                    "value")


def levels(bits: int, cohort_size: int) -> int:
  """L, the fixed-point levels per unit range for b-bit sums of K clients.

  L = floor((2^(bits-1) - 1) / cohort_size): a sum of ``cohort_size``
  integers in [-L, L] stays in [-(2^(bits-1) - 1), 2^(bits-1) - 1].

  Args:
    bits: b, an int in [1, 32].
    cohort_size: K, an int >= 1, the most clients summed.

  Returns:
    L >= 1 (a Python int).

  Raises:
    TypeError: ``bits`` or ``cohort_size`` is not an int (bools refused).
    ValueError: either is out of range, or L < 1 (the message gives the
      smallest bits that works for ``cohort_size``).
  """
  # L is computed in Python (it sets the encoder's float constants), so a
  # traced argument is refused here rather than failing later with a
  # concretisation error.
  _static_int("bits", bits)
  _static_int("cohort_size", cohort_size)
  checks.check_int("bits", bits, 1, 32)
  checks.check_int("cohort_size", cohort_size, 1)
  num_levels = (2**(int(bits) - 1) - 1) // int(cohort_size)
  if num_levels < 1:
    smallest = next((b for b in range(1, 33)
                     if 2**(b - 1) - 1 >= cohort_size), None)
    fix = ("no bits <= 32 suffices" if smallest is None
           else f"the smallest bits that works is {smallest}")
    raise ValueError(
        f"bits={bits} leaves no fixed-point level for cohort_size="
        f"{cohort_size} (2^(bits-1) - 1 < cohort_size); {fix}")
  return num_levels


def _top_level(num_levels: int) -> float:
  """The largest float32 <= L (float32 rounds large L up, e.g. 2^31 - 1)."""
  top = np.float32(num_levels)
  if float(top) > num_levels:
    top = np.nextafter(top, np.float32(0))
  return float(top)


def encode(x: jax.Array, bound, num_levels: int, key: PRNGKey) -> jax.Array:
  """Fixed point with stochastic rounding: int32 in [-L, L], shape of x.

  y = clip(x, -bound, bound) L / bound, then floor(y) + Bernoulli(y -
  floor(y)), so E[decode(encode(x))] = clip(x, -bound, bound) (up to the
  float32 rounding of y). A value on a level (x = j bound / L with
  bound / L a power of two) is encoded exactly. NaN encodes as 0.

  Args:
    x: [...] float array.
    bound: R > 0, a scalar or an array broadcastable to x (one range per
      coordinate); may be traced.
    num_levels: L >= 1, a static Python int (``levels``).
    key: the PRNG key of the rounding.

  Returns:
    [...] int32.
  """
  _static_int("num_levels", num_levels)
  checks.check_int("num_levels", num_levels, 1)
  checks.check_range("bound", bound, 0, low_open=True)
  x = jnp.asarray(x, jnp.float32)
  top = _top_level(num_levels)
  scale = jnp.float32(num_levels) / jnp.asarray(bound, jnp.float32)
  # The second clip is needed because clip(x) * scale may round above L;
  # with y <= top <= L, floor(y) + 1 never exceeds L and the sum of
  # cohort_size codes stays inside b bits.
  y = jnp.clip(jnp.clip(x, -bound, bound) * scale, -top, top)
  # Casting NaN to int32 has no portable value; a NaN statistic becomes 0
  # here and is counted as clipped by the caller.
  y = jnp.where(jnp.isnan(y), 0.0, y)
  low = jnp.floor(y)
  # P(up) is the fractional part: an exact level (fraction 0) never rounds
  # up, which is what makes the encoding of such a value exact.
  up = jax.random.uniform(key, y.shape, jnp.float32) < y - low
  return (low + up.astype(jnp.float32)).astype(jnp.int32)


def decode(s: jax.Array, bound, num_levels: int) -> jax.Array:
  """s R / L as float32 (computed as s (R / L)); [...] -> [...]."""
  return jnp.asarray(s).astype(jnp.float32) * (
      jnp.asarray(bound, jnp.float32) / jnp.float32(num_levels))


def _wrap(total: jax.Array, bits: int) -> jax.Array:
  """int32 total (mod 2^32) -> its value mod 2^bits, signed, int32."""
  unsigned = jax.lax.bitcast_convert_type(total, jnp.uint32)
  half = jnp.uint32(2**(bits - 1))
  low_bits = unsigned & jnp.uint32(2**bits - 1)
  # Sign extension of a b-bit value in uint32: (v xor h) - h, mod 2^32.
  return jax.lax.bitcast_convert_type((low_bits ^ half) - half, jnp.int32)


def _count_outside(q: jax.Array, bits: int) -> jax.Array:
  """Coordinates whose exact sum over axis 0 leaves [-2^(b-1), 2^(b-1))."""
  # sum q = high 2^16 + low with 0 <= low < 2^16, from the 16-bit halves
  # summed apart: no partial sum leaves int32 for K <= MAX_SUMMANDS.
  # ``>>`` is an arithmetic shift on int32 (floor division by 2^16), so
  # q = (q >> 16) 2^16 + (q & 0xFFFF) holds for negative q as well.
  low_sum = jnp.sum(q & 0xFFFF, axis=0)
  high = jnp.sum(q >> 16, axis=0) + (low_sum >> 16)
  low = low_sum & 0xFFFF
  # For b >= 17 both ends of the range are multiples of 2^16, so ``high``
  # alone decides; for smaller b they fall inside the blocks high = 0 and
  # high = -1, and ``low`` must be compared too.
  if bits >= 17:
    edge = 2**(bits - 17)
    inside = (high >= -edge) & (high < edge)
  else:
    half = 2**(bits - 1)
    inside = (((high == 0) & (low < half))
              | ((high == -1) & (low >= 2**16 - half)))
  return jnp.sum(~inside).astype(jnp.int32)


def modular_sum(q: jax.Array, bits: int) -> tuple[jax.Array, jax.Array]:
  """The sum over clients modulo 2^bits, and its exact overflow count.

  Args:
    q: [K, ...] int32 signed fixed-point integers, K <= ``MAX_SUMMANDS``
      (2^15; the exact count sums 16-bit halves in int32).
    bits: b in [1, 32] (static).

  Returns:
    ``(s, overflow)``: s [...] int32, sum_k q_k mod 2^b read as a signed
    value in [-2^(b-1), 2^(b-1)); overflow [] int32, the number of
    coordinates whose true integer sum lies outside that range.

  Raises:
    TypeError: ``q`` is not int32, or ``bits`` not an int.
    ValueError: ``bits`` out of range, or K > ``MAX_SUMMANDS``.
  """
  _static_int("bits", bits)
  checks.check_int("bits", bits, 1, 32)
  q = jnp.asarray(q)
  if q.dtype != jnp.int32:
    raise TypeError(f"q must be int32, got {q.dtype}")
  if q.ndim < 1 or q.shape[0] > MAX_SUMMANDS:
    raise ValueError(f"q must be [K, ...] with 1 <= K <= {MAX_SUMMANDS} "
                     f"(exact overflow count), got shape {q.shape}")
  # int32 addition wraps modulo 2^32 in XLA, a multiple of 2^b.
  return _wrap(jnp.sum(q, axis=0), bits), _count_outside(q, bits)


def _probe_info(info: ClientInfo, max_examples) -> ClientInfo:
  """A real client with ``max_examples`` examples, losses 0, of the round."""
  return ClientInfo(
      client_ids=jnp.zeros((), info.client_ids.dtype),
      num_examples=jnp.asarray(max_examples, info.num_examples.dtype),
      mask=jnp.ones((), info.mask.dtype),
      loss_before=jnp.zeros((), info.loss_before.dtype),
      loss_after=jnp.zeros((), info.loss_after.dtype),
      round=info.round, key=info.key)


def message_bytes(aggregator: Aggregator, params, bits: int) -> int:
  """Bytes of one client's masked message: ``bits`` for each coordinate
  of the wrapped rule's statistics, packed, ceil(b n / 8).

  What a client sends in the protocol is its b-bit integers plus the
  pairwise masks' key agreement; the keys (a few hundred bytes a client
  a round, independent of the model) are not counted.

  Args:
    aggregator: the rule secure aggregation wraps (with a streaming form).
    params: the global model (arrays or ``jax.ShapeDtypeStruct``).
    bits: b in [1, 32].
  """
  checks.check_int("bits", bits, 1, 32)
  if aggregator.stream is None:
    raise ValueError("secure aggregation needs a rule with a streaming "
                     "form (aggregator.stream)")
  scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype)
  info = ClientInfo(client_ids=scalar(jnp.int32),
                    num_examples=scalar(jnp.float32),
                    mask=scalar(jnp.float32),
                    loss_before=scalar(jnp.float32),
                    loss_after=scalar(jnp.float32), round=scalar(jnp.int32),
                    key=jax.ShapeDtypeStruct((2,), jnp.uint32),
                    num_steps=scalar(jnp.int32))
  stats = jax.eval_shape(aggregator.stream.client_stats, params, params,
                         info)
  count = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(stats))
  return -(-count * bits // 8)


def _check_float_leaves(stats) -> None:
  for path, leaf in zip(tree_math.leaf_paths(stats), jax.tree.leaves(stats),
                        strict=True):
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
      raise TypeError(
          "secure_aggregation encodes floating-point client statistics; "
          f"the wrapped rule's statistic {path or '<root>'} is {leaf.dtype}")


def _clip_update(client_leaf, global_leaf, clip):
  """w_k' = g + clip(w_k - g) where |w_k - g| > clip; and where it was.

  A clipped coordinate is moved one float step toward g if needed, so
  that the rule's own w_k' - g (rounded) is at most ``clip`` too.
  """
  # An integer leaf has no continuous update to bound: it passes through
  # unchanged and never counts as clipped.
  if not jnp.issubdtype(client_leaf.dtype, jnp.inexact):
    return client_leaf, jnp.zeros((), bool)
  bound = jnp.asarray(clip, client_leaf.dtype)
  update = client_leaf - global_leaf
  over = jnp.abs(update) > bound
  target = global_leaf + jnp.clip(update, -bound, bound)
  target = jnp.where(jnp.abs(target - global_leaf) > bound,
                     jnp.nextafter(target, global_leaf), target)
  return jnp.where(over, target, client_leaf), jnp.any(over)


def secure_aggregation(aggregator: Aggregator, *, bits: int, clip: float,
                       cohort_size: int, max_examples: float) -> Aggregator:
  """Runs ``aggregator`` on a simulated secure sum (module docstring).

  Args:
    aggregator: a rule with a streaming form (``Aggregator.stream``), e.g.
      ``fedavg()``, ``dp_fedavg()``, ``fednnnn()``.
    bits: b in [1, 32], the width of the modular sum.
    clip: > 0, finite, the bound of every coordinate of a client's update.
    cohort_size: the most real clients of a round (an int >= 1).
    max_examples: > 0, finite, the most examples a client holds (sets the
      range of the statistics weighted by the number of examples).

  Returns:
    An ``Aggregator`` with the wrapped rule's state and fields
    (``uses_losses``, ``noise_multiplier``, ``expected_clients``) and a
    streaming form whose summed statistics are ``SecAggStats``; metrics
    are the wrapped rule's plus "secagg_clipped", "secagg_update_clipped"
    ([] int32, real clients) and "secagg_overflow" ([] int32, see the
    module docstring).

  Raises:
    TypeError: ``aggregator`` is not an ``Aggregator``, or an argument is
      of the wrong kind.
    ValueError: ``aggregator`` has no streaming form, or an argument is
      out of range (naming it).
  """
  if not isinstance(aggregator, Aggregator):
    raise TypeError(
        f"aggregator must be an Aggregator, got {type(aggregator).__name__}")
  if aggregator.stream is None:
    raise ValueError(
        "secure aggregation needs a rule that is a sum over clients (an "
        "Aggregator with a streaming form, aggregator.stream): the server "
        "sees only the sum of the clients' statistics. Rules that need "
        "the individual updates (median, trimmed mean, Krum, Bulyan, "
        "FedAdp, FedLayerWise, ...) cannot run under it")
  checks.check_range("clip", clip, 0, low_open=True)
  checks.check_range("max_examples", max_examples, 0, low_open=True)
  num_levels = levels(bits, cohort_size)
  inner = aggregator.stream

  def ranges(global_params, info):
    probe = inner.client_stats(global_params, global_params,
                               _probe_info(info, max_examples))
    _check_float_leaves(probe)
    scalars = [jnp.abs(leaf).astype(jnp.float32)
               for leaf in jax.tree.leaves(probe) if leaf.ndim == 0]
    weight = jnp.float32(1.0)
    if scalars:
      weight = jnp.maximum(weight, jnp.max(jnp.stack(scalars)))
    scaled = jnp.asarray(clip, jnp.float32) * weight
    return probe, jax.tree.map(
        lambda leaf: weight if leaf.ndim == 0 else scaled, probe)

  def client_stats(global_params, client_params, info_k):
    real = info_k.mask > 0
    client_leaves, params_def = jax.tree.flatten(client_params)
    pairs = [_clip_update(c, g, clip) for c, g in zip(
        client_leaves, jax.tree.leaves(global_params), strict=True)]
    clipped_params = params_def.unflatten([p[0] for p in pairs])
    update_clipped = jnp.any(jnp.stack([p[1] for p in pairs]))
    stats = inner.client_stats(global_params, clipped_params, info_k)
    probe, bounds = ranges(global_params, info_k)
    if jax.tree.structure(stats) != jax.tree.structure(probe):
      raise ValueError("the wrapped rule's client statistics change "
                       "structure with the client's input")
    key = jax.random.fold_in(
        jax.random.fold_in(info_k.key, SECAGG_STREAM), info_k.client_ids)
    # All leaves as one vector: one draw of rounding noise per client.
    leaves, treedef = jax.tree.flatten(stats)
    flat = jnp.concatenate(
        [jnp.ravel(leaf).astype(jnp.float32) for leaf in leaves])
    flat_bounds = jnp.concatenate(
        [jnp.broadcast_to(bound, (leaf.size,)) for leaf, bound in zip(
            leaves, jax.tree.leaves(bounds), strict=True)])
    q = encode(flat, flat_bounds, num_levels, key)
    # Padding and dropped rows still draw rounding noise (vmap needs one
    # shape for every row) but send exactly 0, like clients absent from the
    # protocol.
    q = jnp.where(real, q, jnp.zeros_like(q))
    # Written as not(<=) so that a NaN statistic, encoded as 0, counts as
    # clipped too.
    stats_clipped = jnp.any(~(jnp.abs(flat) <= flat_bounds))
    offsets = np.cumsum([0] + [leaf.size for leaf in leaves])
    encoded = [q[start:stop].reshape(leaf.shape) for start, stop, leaf in zip(
        offsets[:-1], offsets[1:], leaves, strict=True)]
    return SecAggStats(
        treedef.unflatten(encoded),
        jnp.where(real & stats_clipped, 1, 0).astype(jnp.int32),
        jnp.where(real & update_clipped, 1, 0).astype(jnp.int32))

  def check_real_clients(info):
    # Under jit the mask is abstract and nothing can be raised; the overflow
    # metric (exact count or -1) reports such a cohort instead.
    if checks.is_traced(info.mask):
      return
    num_real = int(np.sum(np.asarray(info.mask) > 0))
    if num_real > cohort_size:
      raise ValueError(
          f"the cohort has {num_real} real clients (mask 1), more than "
          f"cohort_size={cohort_size}: their {bits}-bit sum may overflow")

  def finish(global_params, summed, info, state, overflow):
    # The server derives the public ranges itself, from the global model and
    # the round: the same numbers every client encoded with, never sent.
    probe, bounds = ranges(global_params, info)
    # The barrier hands the wrapped rule the decoded floats as computed
    # here: XLA would otherwise fold decode's scale into the rule's own
    # scalar factors ((s c) t -> s (c t)), rounding differently in the
    # stacked and the streaming programs.
    decoded = jax.lax.optimization_barrier(jax.tree.map(
        lambda s, bound, p: decode(_wrap(s, bits), bound,
                                   num_levels).astype(p.dtype),
        summed.encoded, bounds, probe))
    new_global, new_state, metrics = inner.finalize(global_params, decoded,
                                                    info, state)
    metrics = dict(metrics)
    metrics["secagg_clipped"] = summed.num_clipped
    metrics["secagg_update_clipped"] = summed.num_update_clipped
    metrics["secagg_overflow"] = overflow
    return new_global, new_state, metrics

  def finalize(global_params, summed, info, state):
    check_real_clients(info)
    too_many = jnp.sum(info.mask > 0) > cohort_size
    # The wrapped sum cannot tell overflow: -1 (unknown) where possible.
    overflow = jnp.where(too_many, -1, 0).astype(jnp.int32)
    return finish(global_params, summed, info, state, overflow)

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=False)
    check_real_clients(info)
    rows = jax.vmap(client_stats, in_axes=(None, 0, INFO_AXES))(
        global_params, client_params, info)
    leaves, treedef = jax.tree.flatten(rows.encoded)
    sums = [modular_sum(leaf, bits) for leaf in leaves]
    overflow = sum((o for _, o in sums), jnp.zeros((), jnp.int32))
    summed = SecAggStats(treedef.unflatten([s for s, _ in sums]),
                         jnp.sum(rows.num_clipped),
                         jnp.sum(rows.num_update_clipped))
    return finish(global_params, summed, info, state, overflow)

  return Aggregator(aggregator.init, aggregate,
                    StreamingForm(client_stats, finalize),
                    uses_losses=aggregator.uses_losses,
                    noise_multiplier=aggregator.noise_multiplier,
                    expected_clients=aggregator.expected_clients)
