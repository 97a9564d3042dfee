"""Simulated secure aggregation (Bonawitz et al., CCS 2017): fixed point,
modular sums and wrapped rules, against numpy and error bounds."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import engine
from fedjax_agg import rounds
from fedjax_agg import secagg
from fedjax_agg import testing
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import Aggregator, INFO_AXES, StreamingForm
from tests import agg_testutil as tu
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model


K = 5  # real clients of the cohorts below
# One layer keeps compilation short (per-leaf work is traced per leaf).
SHAPES = {"dense": {"kernel": (3, 2), "bias": (2,)}}
MAX_EXAMPLES = 50.0

_modular_sum = jax.jit(secagg.modular_sum, static_argnums=1)


@functools.lru_cache(maxsize=None)
def _rule(name="fedavg", inner=(), **kwargs):
  """(secure rule, jitted aggregate, client_stats, finalize)."""
  options = {"bits": 16, "clip": 1.0, "cohort_size": K,
             "max_examples": MAX_EXAMPLES}
  options.update(kwargs)
  rule = secagg.secure_aggregation(aggregators.get(name, **dict(inner)),
                                   **options)
  return (rule, jax.jit(rule.aggregate), jax.jit(rule.stream.client_stats),
          jax.jit(rule.stream.finalize))


@functools.lru_cache(maxsize=None)
def _plain(name="fedavg", inner=()):
  rule = aggregators.get(name, **dict(inner))
  return rule, jax.jit(rule.aggregate)


def _run(global_params, clients, info, name="fedavg", inner=(), **kwargs):
  rule, aggregate, _, _ = _rule(name, inner, **kwargs)
  return aggregate(global_params, clients, info, rule.init(global_params))


def _run_plain(global_params, clients, info, name="fedavg", inner=()):
  rule, aggregate = _plain(name, inner)
  return aggregate(global_params, clients, info, rule.init(global_params))


def _loop_sums(global_params, clients, info, name="fedavg", inner=(),
               **kwargs):
  """The streaming form's sums: client_stats row by row, added with int32
  additions (wrapping modulo 2^32) in a Python loop, as the engine's
  carry."""
  _, _, client_stats, _ = _rule(name, inner, **kwargs)
  total = None
  for k in range(info.mask.shape[0]):
    info_k = info.row(k)
    stats = client_stats(global_params, _row(clients, k), info_k)
    total = stats if total is None else jax.tree.map(jnp.add, total, stats)
  for leaf in jax.tree.leaves(total.encoded):
    assert leaf.dtype == jnp.int32
  return total


def _streamed(global_params, clients, info, name="fedavg", inner=(),
              **kwargs):
  """The streaming form: ``_loop_sums``, then the jitted finalize."""
  rule, _, _, finalize = _rule(name, inner, **kwargs)
  return finalize(global_params, _loop_sums(global_params, clients, info,
                                            name, inner, **kwargs),
                  info, rule.init(global_params))


@functools.lru_cache(maxsize=None)
def _jitted_rows(client_stats):
  return jax.jit(jax.vmap(client_stats, in_axes=(None, 0, INFO_AXES)))


def _stacked_sums(global_params, clients, info, name="fedavg", inner=(),
                  **kwargs):
  """The stacked form's sums: client_stats vmapped over the rows, each
  leaf summed by ``modular_sum`` (its wrapped value), counts added."""
  _, _, client_stats, _ = _rule(name, inner, **kwargs)
  rows = _jitted_rows(client_stats)(global_params, clients, info)
  bits = dict(kwargs).get("bits", 16)
  return rows._replace(encoded=jax.tree.map(
      lambda q: _modular_sum(q, bits)[0], rows.encoded),
      num_clipped=jnp.sum(rows.num_clipped),
      num_update_clipped=jnp.sum(rows.num_update_clipped))


def _assert_same_sums(loop_total, stacked, bits):
  """The loop's int32 totals reduced modulo 2^b equal the stacked sums."""
  _assert_bitwise(
      jax.tree.map(lambda a: _np_wrap(a, bits), loop_total), stacked)


def _np_wrap(total, bits):
  half = 2**(bits - 1)
  return (np.asarray(total, np.int64) + half) % 2**bits - half


def _row(stacked, k):
  return jax.tree.map(lambda a: a[k], stacked)


def _cohort(seed=0, num=K, scale=0.1):
  rng = np.random.default_rng(seed)
  params = tu.make_params(rng, SHAPES)
  clients = tu.make_clients(rng, params, num, scale=scale)
  counts = rng.integers(1, int(MAX_EXAMPLES) + 1, size=num)
  return params, clients, tu.make_info(np.arange(num), counts)


def _max_error(a, b):
  return max(float(np.max(np.abs(np.asarray(x, np.float64)
                                 - np.asarray(y, np.float64))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                             strict=True))


def _assert_bitwise(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _assert_float_close(a, b):
  """Equal up to float32's last bits: the wrapped rule's finalize compiled
  in two XLA programs may contract a * b + c into one FMA in one only."""
  tu.assert_trees_close(a, b, rtol=2**-21, atol=1e-7)


def _mean_error_bound(bits, cohort_size, clip, raw_weights, max_weight):
  """|sum_k W_k u_k / sum_k W_k - mean| per coordinate, from the codes.

  Each client's decoded statistic is off by less than one level, R / L
  (plus float32's rounding of x L / R, relative 2^-23, which matters only
  for L > 2^23): weighted sums (R = clip W) by E_w < m clip W u, the total
  weight (R = W) by E_t < m W u, u = 1 / L + 2^-22, m real clients. With
  |mean| <= clip: |W^/T^ - W/T| <= (E_w + clip E_t) / (T - E_t).
  """
  unit = 1.0 / secagg.levels(bits, cohort_size) + 2.0**-22
  num = len(raw_weights)
  error_weighted = num * clip * max_weight * unit
  error_total = num * max_weight * unit
  return ((error_weighted + clip * error_total)
          / (float(np.sum(raw_weights)) - error_total))


# ---------------------------------------------------------------------------
# levels


@pytest.mark.parametrize("bits,cohort_size", [
    (8, 1), (8, 10), (8, 127), (16, 3), (16, 100), (20, 1000), (31, 7),
    (32, 1), (32, 1000), (32, 2**31 - 1)])
def test_levels_formula(bits, cohort_size):
  num_levels = secagg.levels(bits, cohort_size)
  assert num_levels == (2**(bits - 1) - 1) // cohort_size
  # The largest L whose K-fold sums stay in the signed b-bit range.
  assert cohort_size * num_levels <= 2**(bits - 1) - 1
  assert cohort_size * (num_levels + 1) > 2**(bits - 1) - 1


def test_levels_module_table():
  table = {(8, 10): 12, (8, 100): 1, (16, 10): 3276, (16, 100): 327,
           (16, 1000): 32, (20, 10): 52428, (20, 100): 5242,
           (20, 1000): 524, (32, 10): 214748364, (32, 100): 21474836,
           (32, 1000): 2147483}
  for (bits, cohort_size), expected in table.items():
    assert secagg.levels(bits, cohort_size) == expected


@pytest.mark.parametrize("bits,error", [
    (0, ValueError), (33, ValueError), (-1, ValueError), (True, TypeError),
    (1.5, TypeError), (16.0, TypeError), ("16", TypeError)])
def test_levels_refuses_bits(bits, error):
  with pytest.raises(error, match="bits"):
    secagg.levels(bits, 4)


@pytest.mark.parametrize("cohort_size,error", [
    (0, ValueError), (-3, ValueError), (2.0, TypeError), (False, TypeError)])
def test_levels_refuses_cohort_size(cohort_size, error):
  with pytest.raises(error, match="cohort_size"):
    secagg.levels(16, cohort_size)


@pytest.mark.parametrize("bits,cohort_size,smallest", [
    (8, 1000, 11), (1, 1, 2), (10, 512, 11), (16, 2**15, 17),
    (20, 2**20, 22)])
def test_levels_names_smallest_bits(bits, cohort_size, smallest):
  with pytest.raises(ValueError, match=(
      rf"bits={bits}.*cohort_size={cohort_size}.*smallest bits that works "
      rf"is {smallest}\b")):
    secagg.levels(bits, cohort_size)
  assert secagg.levels(smallest, cohort_size) == 1
  with pytest.raises(ValueError):
    secagg.levels(smallest - 1, cohort_size)


def test_levels_no_bits_suffice():
  with pytest.raises(ValueError, match="no bits <= 32"):
    secagg.levels(32, 2**31)


# ---------------------------------------------------------------------------
# encode / decode


@functools.lru_cache(maxsize=None)
def _encode_many(num_levels, num_keys):
  """decode(encode(x, key_i)) and the codes for num_keys keys, jitted."""
  def one(x, bound, key):
    q = secagg.encode(x, bound, num_levels, key)
    return q, secagg.decode(q, bound, num_levels)
  return jax.jit(jax.vmap(one, in_axes=(None, None, 0)))


def test_encode_is_unbiased_and_bounded():
  num_levels = secagg.levels(8, 4)  # 31
  bound = 2.0
  step = bound / num_levels
  x = np.array([-3.0, -2.0, -1.37, -0.5, 0.0, 0.01, 0.3, 16.5 * step,
                1.99, 2.0, 2.5, 40.0], np.float32)
  num_keys = 4000
  keys = jax.random.split(jax.random.key(7), num_keys)
  codes, decoded = _encode_many(num_levels, num_keys)(x, bound, keys)
  codes = np.asarray(codes)
  assert codes.dtype == np.int32
  assert np.all(np.abs(codes) <= num_levels)
  # Each code is one of the two levels around x L / R.
  scaled = np.clip(x.astype(np.float64), -bound, bound) / step
  assert np.all((codes == np.floor(scaled)) | (codes == np.ceil(scaled)))
  mean = np.mean(np.asarray(decoded, np.float64), axis=0)
  # One draw has variance frac (1 - frac) step^2 <= step^2 / 4.
  standard_error = step / 2 / np.sqrt(num_keys)
  np.testing.assert_array_less(
      np.abs(mean - np.clip(x, -bound, bound)), 3 * standard_error + 1e-6)
  # Values beyond the range are clipped to it, deterministically.
  np.testing.assert_array_equal(codes[:, [0, 1, 9, 10, 11]],
                                np.broadcast_to([-31, -31, 31, 31, 31],
                                                (num_keys, 5)))


def test_encode_on_a_level_is_exact():
  num_levels = secagg.levels(8, 4)  # 31
  bound = num_levels / 16  # bound / L = 2^-4
  levels = np.arange(-num_levels, num_levels + 1)
  x = (levels / 16).astype(np.float32)
  keys = jax.random.split(jax.random.key(3), 5)
  codes, decoded = _encode_many(num_levels, 5)(x, bound, keys)
  np.testing.assert_array_equal(np.asarray(codes),
                                np.broadcast_to(levels, (5, levels.size)))
  np.testing.assert_array_equal(np.asarray(decoded),
                                np.broadcast_to(x, (5, x.size)))


def test_encode_at_32_bits_stays_in_int32():
  num_levels = secagg.levels(32, 1)  # 2^31 - 1, above float32's integers
  bound = 0.5
  x = np.array([bound, -bound, 1e30, -1e30, np.nan, 0.0, 0.25], np.float32)
  codes, decoded = _encode_many(num_levels, 3)(
      x, bound, jax.random.split(jax.random.key(0), 3))
  codes = np.asarray(codes)
  top = 2**31 - 128  # the largest float32 <= 2^31 - 1
  np.testing.assert_array_equal(
      codes, np.broadcast_to([top, -top, top, -top, 0, 0, 2**30],
                             codes.shape))
  np.testing.assert_allclose(np.asarray(decoded)[0],
                             np.nan_to_num(np.clip(x, -bound, bound)),
                             rtol=2**-22)


def test_encode_refuses_bad_arguments():
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="bound"):
    secagg.encode(jnp.ones(3), 0.0, 7, key)
  with pytest.raises(ValueError, match="num_levels"):
    secagg.encode(jnp.ones(3), 1.0, 0, key)
  with pytest.raises(TypeError, match="num_levels"):
    secagg.encode(jnp.ones(3), 1.0, 7.0, key)


# ---------------------------------------------------------------------------
# modular_sum


def _np_modular_sum(q, bits):
  total = np.asarray(q, np.int64).sum(axis=0)
  half = 2**(bits - 1)
  return _np_wrap(total, bits), int(np.sum((total < -half)
                                           | (total >= half)))


@pytest.mark.parametrize("bits", [8, 16, 20, 32])
@pytest.mark.parametrize("num", [1, 3, 8])
def test_modular_sum_matches_numpy(bits, num):
  rng = np.random.default_rng(bits * 100 + num)
  inputs = [
      # b-bit inputs: sums leave the range about half the time.
      rng.integers(-2**(bits - 1), 2**(bits - 1), size=(num, 6, 5)),
      # any int32 inputs, reduced modulo 2^b like the engine's int32 sums.
      rng.integers(-2**31, 2**31, size=(num, 30)),
      # small inputs: no overflow.
      rng.integers(-3, 4, size=(num, 7)),
  ]
  for q in inputs:
    s, overflow = _modular_sum(jnp.asarray(q, jnp.int32), bits)
    expected_s, expected_overflow = _np_modular_sum(q, bits)
    assert s.dtype == jnp.int32 and s.shape == q.shape[1:]
    np.testing.assert_array_equal(np.asarray(s), expected_s)
    assert int(overflow) == expected_overflow


@pytest.mark.parametrize("bits,rows,overflows", [
    (32, [[2**31 - 1], [1]], 1),
    (32, [[-2**31], [-1]], 1),
    (32, [[2**31 - 1], [-2**31]], 0),
    (32, [[-2**31], [0], [0]], 0),
    # Partial sums leave int32, the true sum (-3) does not.
    (32, [[2**31 - 1], [2**31 - 1], [-2**31], [-2**31], [-1]], 0),
    (32, [[-2**31] * 3] * 3, 3),
    (16, [[32767], [1]], 1),
    (16, [[32767], [0]], 0),
    (16, [[-32768], [-1]], 1),
    (16, [[-32768], [0]], 0),
    (17, [[65535], [0]], 0),
    (17, [[65535], [1]], 1),
    (17, [[-65536], [0]], 0),
    (17, [[-65536], [-1]], 1),
    (1, [[0], [-1]], 0),
    (1, [[1], [0]], 1),
    (1, [[-1], [-1]], 1),
])
def test_modular_sum_at_the_limits(bits, rows, overflows):
  q = np.asarray(rows, np.int64)
  s, overflow = _modular_sum(jnp.asarray(q, jnp.int32), bits)
  expected_s, expected_overflow = _np_modular_sum(q, bits)
  assert expected_overflow == overflows
  np.testing.assert_array_equal(np.asarray(s), expected_s)
  assert int(overflow) == overflows


def test_modular_sum_is_exact_up_to_its_row_limit():
  extremes = np.array([2**31 - 1, -2**31, -1, 65535, 2**30], np.int64)
  q = np.broadcast_to(extremes, (secagg.MAX_SUMMANDS, extremes.size))
  s, overflow = _modular_sum(jnp.asarray(q, jnp.int32), 32)
  expected_s, expected_overflow = _np_modular_sum(q, 32)
  np.testing.assert_array_equal(np.asarray(s), expected_s)
  assert int(overflow) == expected_overflow == 3
  with pytest.raises(ValueError, match=str(secagg.MAX_SUMMANDS)):
    secagg.modular_sum(jnp.zeros((secagg.MAX_SUMMANDS + 1, 2), jnp.int32),
                       32)
  with pytest.raises(TypeError, match="int32"):
    secagg.modular_sum(jnp.zeros((3, 2), jnp.float32), 32)
  with pytest.raises(ValueError, match="bits"):
    secagg.modular_sum(jnp.zeros((3, 2), jnp.int32), 33)


# ---------------------------------------------------------------------------
# secure_aggregation around a rule


@pytest.mark.parametrize("weighting", ["num_examples", "uniform"])
def test_matches_the_plain_rule_within_the_quantisation_bound(weighting):
  params, clients, info = _cohort(seed=1)
  inner = (("weighting", weighting),)
  expected, _, _ = _run_plain(params, clients, info, inner=inner)
  if weighting == "num_examples":
    raw, max_weight = np.asarray(info.num_examples), MAX_EXAMPLES
  else:
    raw, max_weight = np.ones(K), 1.0
  errors = {}
  for bits in (32, 16):
    got, _, metrics = _run(params, clients, info, inner=inner, bits=bits)
    errors[bits] = _max_error(got, expected)
    bound = _mean_error_bound(bits, K, 1.0, raw, max_weight)
    # 1e-6: float32 rounding of g + mean in both rules.
    assert errors[bits] <= bound + 1e-6, (bits, errors[bits], bound)
    assert int(metrics["secagg_clipped"]) == 0
    assert int(metrics["secagg_update_clipped"]) == 0
    assert int(metrics["secagg_overflow"]) == 0
  assert errors[16] > errors[32]


def test_values_on_levels_aggregate_exactly():
  """Every statistic on a level: no rounding noise, the numpy result."""
  bits, cohort_size = 16, 4
  num_levels = secagg.levels(bits, cohort_size)  # 8191
  max_examples = num_levels / 8  # n_k L / n_max = 8 n_k
  clip = 0.5  # L / (clip n_max) = 16: updates j / 16 are on levels
  rng = np.random.default_rng(5)
  params = jax.tree.map(
      lambda g: jnp.asarray(rng.integers(-64, 65, g.shape) / 16,
                            jnp.float32), tu.make_params(rng, SHAPES))
  updates = jax.tree.map(
      lambda g: rng.integers(-8, 9, (cohort_size,) + g.shape) / 16, params)
  clients = jax.tree.map(lambda g, u: jnp.asarray(g + u, jnp.float32),
                         params, updates)
  counts = rng.integers(1, int(max_examples) + 1, size=cohort_size)
  options = dict(bits=bits, clip=clip, cohort_size=cohort_size,
                 max_examples=max_examples)
  outputs = [_run(params, clients, tu.make_info(np.arange(cohort_size),
                                                counts, seed=seed),
                  **options)[0] for seed in (0, 1)]
  _assert_bitwise(outputs[0], outputs[1])  # no randomness left
  weights = counts / counts.sum()
  expected = jax.tree.map(
      lambda g, u: np.asarray(g, np.float64) + np.tensordot(weights, u, 1),
      params, updates)
  tu.assert_trees_close(outputs[0], expected, rtol=1e-6, atol=1e-6)


def test_unbiased_over_keys():
  bits, cohort_size, clip = 8, 4, 1.0
  num_levels = secagg.levels(bits, cohort_size)  # 31: coarse levels
  params, clients, info = _cohort(seed=2, num=cohort_size, scale=0.2)
  inner = (("weighting", "uniform"),)
  expected, _, _ = _run_plain(params, clients, info, inner=inner)
  rule, _, _, _ = _rule("fedavg", inner, bits=bits, clip=clip,
                        cohort_size=cohort_size)
  state = rule.init(params)
  num_keys = 400
  keys = jax.random.split(jax.random.key(11), num_keys)
  outputs = jax.jit(jax.vmap(lambda key: rule.aggregate(
      params, clients, info._replace(key=key), state)[0]))(keys)
  # One run: the mean of m codes of variance <= (clip / L)^2 / 4 each
  # (the weights, 1 each, are exact).
  standard_error = (clip / num_levels / 2 / np.sqrt(cohort_size)
                    / np.sqrt(num_keys))
  single_run_errors = []
  for out, exp in zip(jax.tree.leaves(outputs), jax.tree.leaves(expected),
                      strict=True):
    runs = np.asarray(out, np.float64)
    single_run_errors.append(np.abs(runs - np.asarray(exp)).ravel())
    np.testing.assert_array_less(np.abs(runs.mean(axis=0) - exp),
                                 3 * standard_error + 1e-6)
  # One run alone is far noisier than the bias the test allows.
  assert np.mean(np.concatenate(single_run_errors)) > 9 * standard_error


def test_padding_rows_change_nothing():
  params, clients, info = _cohort(seed=3, num=3)
  garbage = jax.tree.map(
      lambda leaf: jnp.stack([jnp.full_like(leaf[0], jnp.nan),
                              jnp.full_like(leaf[0], 1e30)]), clients)
  order = [3, 0, 1, 4, 2]
  padded = tu.take_rows(jax.tree.map(
      lambda a, b: jnp.concatenate([a, b]), clients, garbage), order)
  padded_info = tu.make_info(
      np.array([0, 1, 2, 0, 1])[order],
      np.concatenate([info.num_examples, [1e9, 1e9]])[order],
      mask=np.array([1, 1, 1, 0, 0])[order])
  # The server's sums are the same integers, to the bit.
  _assert_bitwise(_stacked_sums(params, padded, padded_info, bits=8),
                  _stacked_sums(params, clients, info, bits=8))
  out, _, metrics = _run(params, clients, info, bits=8)
  padded_out, _, padded_metrics = _run(params, padded, padded_info, bits=8)
  _assert_float_close(padded_out, out)
  for name in ("secagg_clipped", "secagg_update_clipped", "secagg_overflow"):
    assert int(padded_metrics[name]) == int(metrics[name]) == 0
  # A padding row's statistics are exactly zero.
  _, _, client_stats, _ = _rule(bits=8)
  row = padded_info.row(0)
  for leaf in jax.tree.leaves(client_stats(params, _row(padded, 0), row)):
    assert not np.any(np.asarray(leaf))


@pytest.mark.parametrize("name,inner,options", [
    ("fedavg", (), (("bits", 8),)),
    ("fedavg", (("weighting", "uniform"),), (("bits", 32),)),
    ("fednnnn", (), (("bits", 20),)),
])
def test_stream_equals_stacked(name, inner, options):
  params, clients, info = _cohort(seed=4)
  options = dict(options)
  loop_total = _loop_sums(params, clients, info, name, inner, **options)
  # The secure sum: the same integers to the bit in both forms.
  _assert_same_sums(loop_total, _stacked_sums(params, clients, info, name,
                                              inner, **options),
                    options["bits"])
  rule, aggregate, _, finalize = _rule(name, inner, **options)
  state = rule.init(params)
  stacked = aggregate(params, clients, info, state)
  streamed = finalize(params, loop_total, info, state)
  _assert_float_close(streamed, stacked)
  for metric in ("secagg_clipped", "secagg_update_clipped",
                 "secagg_overflow"):
    assert int(streamed[2][metric]) == int(stacked[2][metric])
  assert np.all(np.isfinite(np.asarray(jax.tree.leaves(stacked[0])[0])))


def test_overflow_is_counted_and_both_forms_agree():
  """More real clients than cohort_size: the b-bit sum overflows."""
  bits, cohort_size, clip = 8, 2, 1.0
  num = 4
  params = jax.tree.map(jnp.zeros_like, tu.make_params(
      np.random.default_rng(0), SHAPES))
  # Every update coordinate +10, clipped to +clip: every statistic is at
  # the top of its range, L = 63 levels, and 4 x 63 > 127.
  clients = jax.tree.map(lambda g: jnp.full((num,) + g.shape, 10.0), params)
  info = tu.make_info(np.arange(num), np.ones(num))
  options = dict(inner=(("weighting", "uniform"),), bits=bits, clip=clip,
                 cohort_size=cohort_size)
  loop_total = _loop_sums(params, clients, info, **options)
  _assert_same_sums(loop_total, _stacked_sums(params, clients, info,
                                              **options), bits)
  for leaf in jax.tree.leaves(loop_total.encoded):
    # 4 x 63 = 252 wraps to -4 mod 256, as in the protocol.
    np.testing.assert_array_equal(_np_wrap(leaf, bits), -4)
  out, _, metrics = _run(params, clients, info, **options)
  streamed, _, stream_metrics = _streamed(params, clients, info, **options)
  # Statistics: the uniform-weight sums of the updates and the two counts.
  num_coordinates = sum(leaf.size for leaf in jax.tree.leaves(params)) + 2
  assert int(metrics["secagg_overflow"]) == num_coordinates
  assert int(stream_metrics["secagg_overflow"]) == -1
  assert int(metrics["secagg_update_clipped"]) == num
  assert int(metrics["secagg_clipped"]) == 0
  # The decoded total weight is -4 / 63 <= 0, so FedAvg's mean falls back
  # to 0 in both forms.
  for leaf in jax.tree.leaves((out, streamed)):
    np.testing.assert_array_equal(np.asarray(leaf), 0.0)
  # Outside jit such a cohort is refused.
  rule, _, _, _ = _rule("fedavg", options["inner"], bits=bits, clip=clip,
                        cohort_size=cohort_size)
  with pytest.raises(ValueError, match="cohort_size=2"):
    rule.aggregate(params, clients, info, rule.init(params))


def test_large_updates_are_clipped():
  params, clients, info = _cohort(seed=6)
  clip = 1.0
  big = {0: ("dense", "kernel", (0, 1), 5.0),
         2: ("dense", "bias", (1,), -3.0)}
  for row, (layer, leaf, index, value) in big.items():
    clients[layer][leaf] = clients[layer][leaf].at[(row,) + index].add(value)
  updates = jax.tree.map(lambda c, g: np.asarray(c) - np.asarray(g)[None],
                         clients, params)
  clipped_clients = jax.tree.map(
      lambda g, u: jnp.asarray(np.asarray(g)[None] + np.clip(u, -clip, clip),
                               jnp.float32), params, updates)
  expected, _, _ = _run_plain(params, clipped_clients, info)
  got, _, metrics = _run(params, clients, info, clip=clip)
  assert int(metrics["secagg_update_clipped"]) == len(big)
  assert int(metrics["secagg_clipped"]) == 0
  bound = _mean_error_bound(16, K, clip, np.asarray(info.num_examples),
                            MAX_EXAMPLES)
  assert _max_error(got, expected) <= bound + 1e-6
  unclipped, _, _ = _run_plain(params, clients, info)
  assert _max_error(got, unclipped) > 0.01


def test_statistics_out_of_range_are_counted():
  params, clients, info = _cohort(seed=7)
  counts = np.asarray(info.num_examples).copy()
  counts[1] = 4 * MAX_EXAMPLES  # above max_examples: its weight saturates
  info = info._replace(num_examples=jnp.asarray(counts, jnp.float32))
  out, _, metrics = _run(params, clients, info)
  assert int(metrics["secagg_clipped"]) == 1
  assert np.all(np.isfinite(np.asarray(jax.tree.leaves(out)[0])))
  _, _, metrics = _run(params, clients, info, max_examples=4 * MAX_EXAMPLES)
  assert int(metrics["secagg_clipped"]) == 0


def test_conformance():
  testing.check_aggregator(secagg.secure_aggregation(
      aggregators.fedavg(), bits=16, clip=1.0, cohort_size=4,
      max_examples=50.0), tu.make_params(np.random.default_rng(0), SHAPES))


def test_with_server_optimizer():
  params, clients, info = _cohort(seed=8)
  rule = aggregators.with_server_optimizer(
      secagg.secure_aggregation(aggregators.fedavg(), bits=16, clip=1.0,
                                cohort_size=K, max_examples=MAX_EXAMPLES),
      optax.adam(0.1))
  assert rule.stream is not None
  state = rule.init(params)
  out, new_state, metrics = jax.jit(rule.aggregate)(params, clients, info,
                                                    state)
  for leaf in jax.tree.leaves((out, new_state, metrics)):
    assert np.all(np.isfinite(np.asarray(leaf)))
  assert "secagg_overflow" in metrics and "pseudo_gradient_norm" in metrics
  stats = _jitted_rows(rule.stream.client_stats)(params, clients, info)
  summed = jax.tree.map(lambda a: jnp.sum(a, axis=0), stats)
  streamed = jax.jit(rule.stream.finalize)(params, summed, info, state)
  _assert_float_close(streamed[0], out)


# ---------------------------------------------------------------------------
# Refusals and the fields kept


@pytest.mark.parametrize("rule", [
    aggregators.fedmedian(), aggregators.krum(),
    aggregators.trimmed_mean(),
    aggregators.dp_fedavg(adaptive=True)])
def test_refuses_rules_without_a_streaming_form(rule):
  with pytest.raises(ValueError, match="secure aggregation needs a rule "
                     "that is a sum over clients"):
    secagg.secure_aggregation(rule, bits=16, clip=1.0, cohort_size=4,
                              max_examples=10.0)


@pytest.mark.parametrize("name,value,error", [
    ("bits", 0, ValueError), ("bits", 33, ValueError),
    ("bits", True, TypeError), ("bits", 16.0, TypeError),
    ("clip", 0.0, ValueError), ("clip", -1.0, ValueError),
    ("clip", float("inf"), ValueError), ("clip", float("nan"), ValueError),
    ("clip", "1", TypeError),
    ("cohort_size", 0, ValueError), ("cohort_size", 4.0, TypeError),
    ("max_examples", 0.0, ValueError),
    ("max_examples", float("inf"), ValueError),
    ("max_examples", None, TypeError),
])
def test_refuses_bad_arguments(name, value, error):
  options = dict(bits=16, clip=1.0, cohort_size=4, max_examples=10.0)
  options[name] = value
  with pytest.raises(error, match=name):
    secagg.secure_aggregation(aggregators.fedavg(), **options)


def test_refuses_too_few_bits_for_the_cohort_when_built():
  with pytest.raises(ValueError, match="smallest bits that works is 11"):
    secagg.secure_aggregation(aggregators.fedavg(), bits=8, clip=1.0,
                              cohort_size=1000, max_examples=10.0)


def test_refuses_non_aggregators_and_integer_statistics():
  with pytest.raises(TypeError, match="aggregator"):
    secagg.secure_aggregation(lambda: None, bits=16, clip=1.0,
                              cohort_size=4, max_examples=10.0)
  base = aggregators.fedavg()

  def client_stats(global_params, client_params, info_k):
    return (base.stream.client_stats(global_params, client_params, info_k),
            jnp.where(info_k.mask > 0, 1, 0).astype(jnp.int32))

  def finalize(global_params, stats, info, state):
    return base.stream.finalize(global_params, stats[0], info, state)

  counting = Aggregator(base.init, base.aggregate,
                        StreamingForm(client_stats, finalize))
  rule = secagg.secure_aggregation(counting, bits=16, clip=1.0,
                                   cohort_size=K, max_examples=MAX_EXAMPLES)
  params, clients, info = _cohort()
  with pytest.raises(TypeError, match="statistic 1 is int32"):
    jax.jit(rule.aggregate)(params, clients, info, rule.init(params))


def test_keeps_the_wrapped_rule_fields():
  dp = aggregators.dp_fedavg(noise_multiplier=0.7, expected_clients=10.0)
  rule = secagg.secure_aggregation(dp, bits=16, clip=1.0, cohort_size=4,
                                   max_examples=10.0)
  assert rule.noise_multiplier == 0.7 and rule.expected_clients == 10.0
  assert not rule.uses_losses
  assert rule.init is dp.init
  lossy = aggregators.fedavg()._replace(uses_losses=True)
  assert secagg.secure_aggregation(lossy, bits=16, clip=1.0, cohort_size=4,
                                   max_examples=10.0).uses_losses


def test_rounds_stream_int32_sums_through_the_engine():
  """A whole round: the engine's running sum of int32 codes (chunks of 2,
  padded) against the stacked round; both clip and encode the same."""
  data = tiny_data()[0]
  model = tiny_model()
  params = model.init(jax.random.key(0))
  rule = secagg.secure_aggregation(
      aggregators.fedavg(), bits=16, clip=0.05, cohort_size=5,
      max_examples=float(np.max(np.asarray(data.num_examples))))
  training = LocalTraining(batch_size=3, learning_rate=0.3)
  cohort = jnp.array([0, 1, 2, 3, 4, 0], jnp.int32)
  mask = jnp.array([1, 1, 1, 1, 1, 0], jnp.float32)
  outputs = []
  for stream in (True, False):
    round_fn = rounds.make_round_fn(
        model, rule, training,
        execution=Execution(clients_per_step=2, stream=stream))
    state, out = round_fn(rounds.init_state(params, rule, seed=1), data,
                          cohort, mask)
    outputs.append((state.params, out.metrics))
  (streamed, stream_metrics), (stacked, metrics) = outputs
  _assert_float_close(streamed, stacked)
  assert int(metrics["secagg_update_clipped"]) > 0  # clip 0.05 bites
  for name in ("secagg_clipped", "secagg_update_clipped"):
    assert int(stream_metrics[name]) == int(metrics[name])
  assert int(stream_metrics["secagg_overflow"]) == 0
  assert int(metrics["secagg_overflow"]) == 0
  # The engine's carry keeps the codes' int32 dtype (traced, not run).
  reducer = engine.make_local_reducer(model, rule.stream.client_stats,
                                      training, clients_per_step=2)
  steps = engine.full_steps(data, cohort, 3, 1)
  info = tu.make_info(cohort, data.num_examples[cohort], mask)
  local = jax.eval_shape(reducer, params, data, cohort, jnp.full((6,), 0.3),
                         steps, jax.random.key(2), info)
  for leaf in jax.tree.leaves(local.stats):
    assert leaf.dtype == jnp.int32


# ---------------------------------------------------------------------------
# In a run (config.Systems.secagg_bits): every entry point, refusals.


def _simulate(systems, aggregator=None, num_rounds=3):
  from fedjax_agg import simulation  # pylint: disable=g-import-not-at-top
  from fedjax_agg.config import Systems  # pylint: disable=g-import-not-at-top
  data, x, y, _ = tiny_data((7, 13, 4, 10, 1, 9, 6, 12))
  return simulation.run(
      tiny_model(), data, (x, y), aggregator or aggregators.fedavg(),
      num_rounds=num_rounds, participation=0.5,
      training=LocalTraining(batch_size=3, epochs=2, learning_rate=0.1),
      execution=Execution(progress=False),
      systems=None if systems is None else Systems(**systems), seed=3)


def test_a_run_on_the_secure_sum_is_the_plain_run_within_its_levels():
  plain = _simulate(None)
  wide = _simulate({"secagg_bits": 32, "secagg_clip": 4.0})
  narrow = _simulate({"secagg_bits": 12, "secagg_clip": 4.0})
  gap = lambda result: max(jax.tree.leaves(jax.tree.map(
      lambda a, b: float(np.max(np.abs(a - b))), result.state.params,
      plain.state.params)))
  # 32 bits: float32 rounding; 12 bits: L = 511 levels over 4.0 x 13.
  assert gap(wide) < 1e-5 < gap(narrow) < 3 * 4.0 * 13 / 511
  for row in narrow.history.rows[1:]:
    assert row["secagg_overflow"] == 0 and row["secagg_clipped"] == 0
  clipped = _simulate({"secagg_bits": 16, "secagg_clip": 1e-4}, num_rounds=1)
  assert clipped.history.rows[1]["secagg_update_clipped"] == 4


def test_runs_refuse_rules_and_widths_the_secure_sum_cannot_carry():
  from fedjax_agg.config import Systems  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="systems.secagg_bits: secure agg"):
    _simulate({"secagg_bits": 16}, aggregator=aggregators.get("fedmedian"))
  with pytest.raises(ValueError, match="systems.secagg_bits: .*bits"):
    _simulate({"secagg_bits": 3})  # 2^2 - 1 = 3 < 4 clients: no level
  with pytest.raises(ValueError, match="secagg_bits must be"):
    Systems(secagg_bits=33)
  with pytest.raises(ValueError, match="secagg_clip=2.0 applies to"):
    Systems(secagg_clip=2.0)
  with pytest.raises(ValueError, match="secagg_clip must be finite"):
    Systems(secagg_bits=16, secagg_clip=float("inf"))
  # Asynchronous steps on the secure sum run and stay finite.
  result = _simulate({"secagg_bits": 20, "concurrency": 5})
  assert np.isfinite(result.history.rows[-1]["test_loss"])


def test_flags_reach_the_secure_sum():
  from fedjax_agg import cli  # pylint: disable=g-import-not-at-top
  from fedjax_agg import spec  # pylint: disable=g-import-not-at-top
  args, given = cli.parse(["--aggregator", "fedavg", "--secagg-bits", "16",
                           "--secagg-clip", "0.5"])
  run, _ = cli.resolve(args, given)
  assert run.to_dict(written_out=False)["systems"] == {
      "secagg_bits": 16, "secagg_clip": 0.5}
  with pytest.raises(spec.ConfigError, match="systems.secagg_clip"):
    spec.Experiment.from_dict({**run.to_dict(written_out=False),
                               "systems": {"secagg_clip": 0.5}})
