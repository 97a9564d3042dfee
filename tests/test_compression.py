"""Update codecs: bit counts, unbiasedness and error feedback in numpy."""

import functools
import math

from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import compression
from fedjax_agg import engine
from fedjax_agg import simulation
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import LocalUpdate
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

SIZES = (1, 2, 7, 64, 1000)
KEY = jax.random.key(0)


def _vector(d, seed=0):
  return np.random.default_rng(seed).normal(size=d).astype(np.float32)


@functools.lru_cache(maxsize=None)
def _jitted_roundtrip(codec):
  return jax.jit(lambda v, k: codec.decode(codec.encode(v, k), v.shape[0]))


def _roundtrip(codec, x, key=KEY):
  """decode(encode(x, key)) under jit, as numpy."""
  return np.asarray(_jitted_roundtrip(codec)(jnp.asarray(x, jnp.float32),
                                             key))


def _next_power_of_two(d):
  return 2 ** int(np.ceil(np.log2(d))) if d > 1 else 1


def _kept(fraction, d):
  return max(1, math.ceil(fraction * d))


# Each codec with its message size written from the formula.
BIT_FORMULAS = [
    (compression.identity(), lambda d: 32 * d),
    (compression.uniform(1), lambda d: d + 64),
    (compression.uniform(4), lambda d: 4 * d + 64),
    (compression.uniform(32), lambda d: 32 * d + 64),
    (compression.qsgd(2), lambda d: 32 + 2 * d),
    (compression.qsgd(8), lambda d: 32 + 8 * d),
    (compression.top_k(0.25),
     lambda d: _kept(0.25, d) * (32 + int(np.ceil(np.log2(d))))),
    (compression.top_k(1.0), lambda d: d * (32 + int(np.ceil(np.log2(d))))),
    (compression.random_k(0.5), lambda d: 32 * _kept(0.5, d) + 32),
    (compression.sign(), lambda d: d + 32),
    (compression.hadamard(compression.uniform(2)),
     lambda d: 2 * _next_power_of_two(d) + 64),
]


@pytest.mark.parametrize("codec, formula", BIT_FORMULAS,
                         ids=[c.name for c, _ in BIT_FORMULAS])
def test_bits_follow_the_formula(codec, formula):
  for d in SIZES:
    assert codec.bits(d) == formula(d), d
    assert isinstance(codec.bits(d), int)


def test_top_k_keeps_the_decimal_fraction_and_one_index_is_free():
  assert compression.top_k(0.07).bits(100) == 7 * (32 + 7)
  assert compression.top_k(0.5).bits(1) == 32  # a single entry: no index


def test_message_size_of_a_tree():
  tree = {"kernel": jnp.zeros((3, 4)), "bias": jnp.zeros((4,)),
          "empty": jnp.zeros((0,)),
          "spec": jax.ShapeDtypeStruct((7,), jnp.float32)}
  codec = compression.qsgd(3)
  bits = (32 + 3 * 12) + (32 + 3 * 4) + (32 + 3 * 7)
  assert compression.message_bits(codec, tree) == bits
  assert compression.message_bytes(codec, tree) == math.ceil(bits / 8)
  assert compression.message_bytes(compression.sign(), jnp.zeros(1)) == 5


UNBIASED = [compression.uniform(1), compression.uniform(2),
            compression.uniform(4), compression.qsgd(2), compression.qsgd(5),
            compression.random_k(0.25),
            compression.hadamard(compression.uniform(2))]


def _samples(codecs, x, num_keys=2000):
  """[num_keys, d] decoded x per codec (one compilation for all)."""
  keys = jax.random.split(jax.random.key(11), num_keys)
  fn = jax.jit(jax.vmap(lambda k: [
      codec.decode(codec.encode(x, k), x.shape[0]) for codec in codecs]))
  return [np.asarray(s, np.float64) for s in fn(keys)]


def _z_scores(samples, x):
  """|mean - x| in standard errors (estimated, with a small floor)."""
  error = np.abs(samples.mean(axis=0) - x)
  standard_error = samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
  return error / np.maximum(standard_error, 1e-6 * (1 + np.abs(x)))


def test_unbiased_codecs_average_to_x():
  # 7 entries, padded to 8 by hadamard. The bound is 4 standard errors, not
  # 3: 7 codecs x 7 coordinates at 3 SE would fail about one seed in eight.
  x = jnp.asarray(_vector(7, seed=3))
  for codec, samples in zip(UNBIASED, _samples(UNBIASED, x), strict=True):
    assert codec.unbiased
    assert np.max(_z_scores(samples, np.asarray(x))) < 4.0, codec.name


@pytest.mark.parametrize("codec", [compression.top_k(0.25),
                                   compression.sign()],
                         ids=["top_k", "sign"])
def test_the_unbiasedness_check_catches_biased_codecs(codec):
  x = jnp.asarray(_vector(7, seed=3))
  assert not codec.unbiased
  samples, = _samples([codec], x, 200)
  assert np.max(_z_scores(samples, np.asarray(x))) > 100


def test_identity_is_bit_for_bit():
  x = np.concatenate([_vector(50), [0.0, -0.0, 1e-45, 3e38, -1e-30]])
  x = x.astype(np.float32)
  got = _roundtrip(compression.identity(), x)
  np.testing.assert_array_equal(got.view(np.uint32), x.view(np.uint32))


def test_uniform_32_bits_is_near_exact():
  x = _vector(1000)
  got = _roundtrip(compression.uniform(32), x)
  np.testing.assert_allclose(got, x, rtol=0, atol=1e-6 * np.ptp(x))


def test_uniform_levels_are_evenly_spaced_in_the_range():
  x = _vector(64)
  got = _roundtrip(compression.uniform(2), x)
  levels = x.min() + np.arange(4) * (x.max() - x.min()) / 3
  nearest = np.abs(got[:, None] - levels[None]).min(axis=1)
  np.testing.assert_allclose(nearest, 0, atol=1e-6)
  # Each x_i goes to one of its two neighbouring levels.
  assert np.all(np.abs(got - x) <= (x.max() - x.min()) / 3 + 1e-6)


def test_top_k_keeps_exactly_the_largest_magnitudes():
  for d, fraction in ((7, 0.25), (64, 0.1), (1000, 0.01), (1, 0.5)):
    x = _vector(d, seed=d)
    got = _roundtrip(compression.top_k(fraction), x)
    kept = np.argsort(-np.abs(x), kind="stable")[:_kept(fraction, d)]
    want = np.zeros_like(x)
    want[kept] = x[kept]
    np.testing.assert_array_equal(got, want)
  ties = _roundtrip(compression.top_k(0.5), np.ones(6, np.float32))
  np.testing.assert_array_equal(ties, [1, 1, 1, 0, 0, 0])


def test_random_k_sends_k_scaled_entries():
  x = _vector(64)
  got = _roundtrip(compression.random_k(0.125), x)
  sent = np.flatnonzero(got)
  assert len(sent) == 8
  np.testing.assert_allclose(got[sent], x[sent] * 8, rtol=1e-6)


def test_sign_matches_numpy():
  x = np.concatenate([_vector(20), [0.0]]).astype(np.float32)
  want = np.mean(np.abs(x)) * np.where(x < 0, -1.0, 1.0)
  np.testing.assert_allclose(_roundtrip(compression.sign(), x), want,
                             rtol=1e-6)


def test_qsgd_levels_are_multiples_of_the_norm_over_s():
  x = _vector(64)
  got = _roundtrip(compression.qsgd(3), x)  # s = 3
  steps = np.abs(got) / np.linalg.norm(x) * 3
  np.testing.assert_allclose(steps, np.round(steps), atol=1e-5)
  assert np.all(np.abs(got) <= np.linalg.norm(x) * (1 + 1e-6))
  assert np.all(np.sign(got)[got != 0] == np.sign(x)[got != 0])


# The quantisers at their smallest and largest widths.
ALL = [compression.identity(), compression.uniform(1),
       compression.uniform(32), compression.qsgd(2), compression.qsgd(32),
       compression.top_k(0.1), compression.random_k(0.1), compression.sign(),
       compression.hadamard(compression.qsgd(4))]


@pytest.mark.parametrize("codec", ALL, ids=[c.name for c in ALL])
def test_zero_and_constant_vectors(codec):
  np.testing.assert_array_equal(_roundtrip(codec, np.zeros(1000)), 0)
  constant = _roundtrip(codec, np.full(1000, -2.5, np.float32))
  assert np.all(np.isfinite(constant))
  if codec.name.startswith("uniform"):
    np.testing.assert_array_equal(constant, -2.5)


@pytest.mark.parametrize("codec", ALL, ids=[c.name for c in ALL])
def test_extreme_magnitudes_stay_finite_and_scale_exactly(codec):
  x = _vector(1000)
  base = _roundtrip(codec, x)
  for scale in (1e30, 1e-30, 2.0**100, 2.0**-100):
    got = _roundtrip(codec, x * np.float32(scale))
    assert np.all(np.isfinite(got)), scale
    if math.log2(scale).is_integer():  # powers of two scale exactly
      np.testing.assert_allclose(got, base * np.float32(scale), rtol=1e-6,
                                 atol=0)


def test_a_nonfinite_leaf_decodes_as_nan():
  tree = {"bad": jnp.asarray(np.r_[_vector(9), np.nan], jnp.float32),
          "inf": jnp.asarray(np.r_[np.inf, _vector(3)], jnp.float32),
          "good": jnp.asarray(_vector(10))}
  # The guard is the same for every codec: those that could drop the NaN
  # (top_k, random_k) or spread it (a rotation) are checked.
  codecs = [compression.identity(), compression.top_k(0.1),
            compression.random_k(0.1), compression.uniform(8),
            compression.hadamard(compression.qsgd(4))]
  outputs = jax.jit(lambda t: [compression.compress_tree(codec, t, KEY)
                               for codec in codecs])(tree)
  for codec, got in zip(codecs, outputs, strict=True):
    assert np.all(np.isnan(got["bad"])), codec.name
    assert np.all(np.isnan(got["inf"])), codec.name
    assert np.all(np.isfinite(got["good"])), codec.name


def test_compress_tree_keeps_shapes_dtypes_and_uses_a_key_per_leaf():
  codec = compression.random_k(0.5)
  tree = {"a": jnp.ones((2, 3), jnp.float32),
          "b": jnp.ones((2, 3), jnp.bfloat16), "c": jnp.zeros((0, 2))}
  got = jax.jit(lambda t: compression.compress_tree(codec, t, KEY))(tree)
  assert jax.tree.map(lambda a: (a.shape, a.dtype), got) == jax.tree.map(
      lambda a: (a.shape, a.dtype), tree)
  leaves = jax.tree.leaves(tree)
  for i, name in enumerate(("a", "b")):
    want = _roundtrip(codec, leaves[i].reshape(-1),
                      jax.random.fold_in(KEY, i))
    np.testing.assert_array_equal(np.asarray(got[name], np.float32),
                                  want.reshape(2, 3))


def _sylvester(n):
  h = np.ones((1, 1))
  while len(h) < n:
    h = np.block([[h, h], [h, -h]])
  return h


def test_walsh_hadamard_equals_the_explicit_matrix():
  try:
    from scipy.linalg import hadamard as explicit  # pylint: disable=g-import-not-at-top
  except ImportError:
    explicit = _sylvester
  for n in (1, 2, 8, 16):
    x = _vector(n, seed=n)
    got = jax.jit(compression.walsh_hadamard)(jnp.asarray(x))
    np.testing.assert_allclose(got, explicit(n) @ x, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(_sylvester(8), explicit(8))
  with pytest.raises(ValueError, match="power-of-two"):
    compression.walsh_hadamard(jnp.zeros(6))


def test_rotation_is_orthogonal():
  @jax.jit
  def there_and_back(x):
    y = compression.rotate(x, KEY)
    return y, compression.unrotate(y, KEY, x.shape[0])

  for d in (1, 5, 1000):
    x = _vector(d, seed=d)
    y, back = there_and_back(jnp.asarray(x))
    assert y.shape == (_next_power_of_two(d),)
    np.testing.assert_allclose(np.linalg.norm(y), np.linalg.norm(x),
                               rtol=1e-5)
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)
  # The rotation is linear, H D / sqrt(n): column j is H's column j times a
  # sign s_j.
  columns = np.asarray(jax.jit(jax.vmap(compression.rotate, (0, None)))(
      jnp.eye(8), KEY)).T
  np.testing.assert_allclose(columns @ columns.T, np.eye(8), atol=1e-6)
  signs = columns * np.sqrt(8) / _sylvester(8)
  np.testing.assert_allclose(signs, np.broadcast_to(signs[:1], (8, 8)),
                             atol=1e-6)
  np.testing.assert_allclose(np.abs(signs), 1, atol=1e-6)
  x = _vector(8)
  np.testing.assert_allclose(jax.jit(compression.rotate)(x, KEY),
                             columns @ x, atol=1e-5)


# The error-feedback round: 5 clients, a cohort of 2 real rows and a padding
# row repeating client 3's id, each row's trained model g + DELTA[k].
IDS = jnp.array([3, 1, 3])
MASK = jnp.array([1.0, 1.0, 0.0])
GLOBAL = {"w": jnp.asarray(_vector(6, seed=1).reshape(2, 3)),
          "b": jnp.asarray(_vector(4, seed=2))}
DELTA = {"w": _vector(18, seed=4).reshape(3, 2, 3),
         "b": _vector(12, seed=5).reshape(3, 4)}


def _stub(client_state, global_params, data, client_ids, mask,
          learning_rates, num_steps, round_num, key):
  """A deterministic inner update: row k trains to g + DELTA[k]."""
  del data, mask, learning_rates, num_steps, round_num, key
  params = jax.tree.map(lambda g, d: g[None] + d, global_params, DELTA)
  zeros = jnp.zeros(client_ids.shape)
  return (engine.LocalResult(params, zeros, zeros, zeros.astype(jnp.int32),
                             zeros), client_state, {"inner": zeros[0]})


def _numpy_top_k(u, fraction):
  flat = u.reshape(-1)
  keep = np.argsort(-np.abs(flat), kind="stable")[:_kept(fraction,
                                                           flat.size)]
  out = np.zeros_like(flat)
  out[keep] = flat[keep]
  return out.reshape(u.shape)


def test_error_feedback_carries_exactly_the_residual():
  fraction = 0.3
  wrapped = compression.with_codec(
      compression.top_k(fraction), LocalUpdate(lambda n: (), _stub),
      error_feedback=True, model_template=GLOBAL)
  state = wrapped.init(5)
  assert jax.tree.map(jnp.shape, state.residuals) == {"w": (5, 2, 3),
                                                      "b": (5, 4)}
  update = jax.jit(wrapped.update)
  residual = {name: np.zeros((5,) + leaf.shape, np.float32)
              for name, leaf in GLOBAL.items()}
  for round_num in (1, 2):
    result, state, metrics = update(
        state, GLOBAL, None, IDS, MASK, jnp.ones(3), jnp.ones(3, jnp.int32),
        jnp.int32(round_num), jax.random.fold_in(KEY, round_num))
    for name in GLOBAL:
      for row, client in ((0, 3), (1, 1)):
        u = DELTA[name][row] + residual[name][client]
        decoded = _numpy_top_k(u, fraction)
        np.testing.assert_allclose(result.client_params[name][row],
                                   np.asarray(GLOBAL[name]) + decoded,
                                   rtol=1e-6, atol=1e-6)
        residual[name][client] = u - decoded
      for client in range(5):  # padding (row 2) wrote nothing
        np.testing.assert_allclose(state.residuals[name][client],
                                   residual[name][client], atol=1e-6)
    assert np.isfinite(metrics["compression_error"])
    assert "inner" in metrics
  assert np.any(residual["w"][3] != 0)


def test_compression_error_metric():
  wrapped = compression.with_codec(compression.top_k(0.3),
                                   LocalUpdate(lambda n: (), _stub))
  _, state, metrics = jax.jit(wrapped.update)(
      wrapped.init(5), GLOBAL, None, IDS, MASK, jnp.ones(3),
      jnp.ones(3, jnp.int32), jnp.int32(1), KEY)
  assert state.residuals == ()
  ratios = []
  for row in (0, 1):
    u = np.concatenate([DELTA[n][row].ravel() for n in GLOBAL])
    parts = [_numpy_top_k(DELTA[n][row], 0.3).ravel() for n in GLOBAL]
    ratios.append(np.sum((np.concatenate(parts) - u) ** 2) / np.sum(u**2))
  np.testing.assert_allclose(metrics["compression_error"], np.mean(ratios),
                             rtol=1e-5)


def test_training_keys_are_unchanged_and_a_train_function_is_accepted():
  def train(global_params, data, client_ids, learning_rates, num_steps,
            key):
    del data, learning_rates, num_steps
    noise = jax.vmap(lambda i: jax.random.normal(jax.random.fold_in(key, i),
                                                 (4,)))(client_ids)
    zeros = jnp.zeros(client_ids.shape)
    return engine.LocalResult({"b": global_params["b"][None] + noise},
                              zeros, zeros, zeros.astype(jnp.int32), zeros)

  wrapped = compression.with_codec(compression.identity(), train)
  params = {"b": GLOBAL["b"]}
  args = (params, None, IDS, MASK, jnp.ones(3), jnp.ones(3, jnp.int32),
          jnp.int32(1), KEY)
  got, state, _ = jax.jit(wrapped.update)(wrapped.init(5), *args)
  want = jax.jit(train)(params, None, IDS, None, None, KEY)
  np.testing.assert_allclose(got.client_params["b"], want.client_params["b"],
                             rtol=1e-6)
  assert state == compression.CompressionState((), ())
  # vmapped over keys (a sweep of runs), the stochastic codec still works.
  stochastic = compression.with_codec(compression.qsgd(4), train)
  sweep = jax.jit(jax.vmap(lambda k: stochastic.update(
      stochastic.init(5), *args[:-1], k)[0].client_params["b"]))
  batch = sweep(jax.random.split(KEY, 3))
  assert batch.shape == (3, 3, 4) and np.all(np.isfinite(batch))


def test_wrapped_state_and_personalize_pass_through():
  def update(count, *args):
    result, _, metrics = _stub((), *args)
    return result, count + 1, metrics

  inner = LocalUpdate(lambda n: jnp.zeros(n), update,
                      personalize=lambda state, g, ids: state[ids])
  wrapped = compression.with_codec(compression.sign(), inner)
  state = wrapped.init(5)
  _, state, _ = jax.jit(wrapped.update)(
      state, GLOBAL, None, IDS, MASK, jnp.ones(3), jnp.ones(3, jnp.int32),
      jnp.int32(1), KEY)
  np.testing.assert_array_equal(state.inner, np.ones(5))
  np.testing.assert_array_equal(
      wrapped.personalize(state, GLOBAL, jnp.array([0, 2])), [1, 1])


@pytest.mark.parametrize("build, error, name", [
    (lambda: compression.uniform(0), ValueError, "bits"),
    (lambda: compression.uniform(33), ValueError, "bits"),
    (lambda: compression.uniform(1.5), TypeError, "bits"),
    (lambda: compression.uniform(True), TypeError, "bits"),
    (lambda: compression.qsgd(1), ValueError, "bits"),
    (lambda: compression.qsgd(33), ValueError, "bits"),
    (lambda: compression.top_k(0), ValueError, "fraction"),
    (lambda: compression.top_k(1.5), ValueError, "fraction"),
    (lambda: compression.random_k(float("nan")), ValueError, "fraction"),
    (lambda: compression.random_k(True), TypeError, "fraction"),
    (lambda: compression.top_k("half"), TypeError, "fraction"),
    (lambda: compression.hadamard(3), TypeError, "inner"),
    (lambda: compression.hadamard("hadamard"), ValueError, "inner"),
    (lambda: compression.hadamard("unifrom"), ValueError, "codec"),
    (lambda: compression.hadamard(compression.sign(), bits=2), ValueError,
     "inner_args"),
    (lambda: compression.get("unifrom"), ValueError, "codec must be one of"),
    (lambda: compression.get("uniform", levels=4), TypeError, "bits"),
    (lambda: compression.identity().bits(0), ValueError, "d must"),
    (lambda: compression.with_codec(compression.sign(), _stub,
                                    error_feedback=True),
     ValueError, "model_template"),
    (lambda: compression.with_codec(compression.sign(), _stub,
                                    error_feedback=1), TypeError,
     "error_feedback"),
    (lambda: compression.with_codec("sign", _stub), TypeError, "codec"),
    (lambda: compression.with_codec(compression.sign(), 3), TypeError,
     "local_update"),
])
def test_bad_arguments_are_refused_by_name(build, error, name):
  with pytest.raises(error, match=name):
    build()


def test_model_template_is_checked_against_the_round():
  wrapped = compression.with_codec(
      compression.sign(), LocalUpdate(lambda n: (), _stub),
      error_feedback=True, model_template={"w": jnp.zeros((3, 2)),
                                           "b": jnp.zeros(4)})
  with pytest.raises(ValueError, match="model_template"):
    wrapped.update(wrapped.init(5), GLOBAL, None, IDS, MASK, jnp.ones(3),
                   jnp.ones(3, jnp.int32), jnp.int32(1), KEY)


def test_registry_builds_every_codec():
  assert set(compression.CODECS) == {"identity", "uniform", "qsgd", "top_k",
                                     "random_k", "sign", "hadamard"}
  assert compression.get("uniform", bits=2).name == "uniform(bits=2)"
  # By name, as a config or the command line builds it.
  named = compression.get("hadamard", inner="uniform", bits=2)
  assert named.bits(100) == compression.uniform(2).bits(128)
  inner = compression.get("qsgd", bits=4)
  assert compression.get("hadamard", inner=inner).name == (
      "hadamard(qsgd(bits=4))")


def test_a_run_with_error_feedback():
  """Through ``simulation.run``: residuals of the sampled clients only, the
  metric in the history."""
  data, x, y, _ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  training = LocalTraining(batch_size=3, learning_rate=0.2,
                           compute_losses=False)
  execution = Execution(clients_per_step=2, progress=False)
  train = engine.make_local_trainer(model, training, clients_per_step=2)
  codec = compression.top_k(0.2)
  update = compression.with_codec(codec, train, error_feedback=True,
                                  model_template=params)
  result = simulation.run(model, data, (x, y), aggregators.fedavg(),
                          num_rounds=2, participation=0.4,
                          training=training, execution=execution,
                          evaluation=Evaluation(every=2, clients=False),
                          local_update=update, seed=0)
  sampled = np.unique(np.concatenate(
      [row["client_ids"] for row in result.history.client_rows]))
  residual = np.concatenate(
      [np.asarray(leaf).reshape(data.num_clients, -1)
       for leaf in jax.tree.leaves(result.state.client_state.residuals)], 1)
  has_residual = np.flatnonzero(np.any(residual != 0, axis=1))
  np.testing.assert_array_equal(has_residual, sampled)
  errors = [row["compression_error"] for row in result.history.rows[1:]]
  assert len(errors) == 2 and all(0 < e < 1 for e in errors)
  assert compression.message_bits(codec, params) == sum(
      codec.bits(leaf.size) for leaf in jax.tree.leaves(params))


# Every codec of the module's table at its extremes, and the rotation
# around the inner codecs that handle magnitudes differently.
_PLAIN = [compression.identity(), compression.uniform(1),
          compression.uniform(32), compression.qsgd(2), compression.qsgd(32),
          compression.top_k(0.1), compression.random_k(0.01),
          compression.random_k(0.5), compression.sign()]
EVERY_CODEC = _PLAIN + [
    compression.hadamard(c) for c in (
        compression.identity(), compression.uniform(1), compression.qsgd(2),
        compression.top_k(0.1), compression.random_k(0.5),
        compression.sign())]
FLOAT32_MAX = float(np.finfo(np.float32).max)


@functools.lru_cache(maxsize=None)
def _every_roundtrip():
  return jax.jit(lambda v, k: [c.decode(c.encode(v, k), v.shape[0])
                               for c in EVERY_CODEC])


@st.composite
def _extreme_vectors(draw):
  """[d] float32 over float32's whole range, subnormals to 3e38, with
  ||x||_2 <= float32's max (exact, in float64)."""
  d = draw(st.sampled_from([2, 7, 300]))  # One compilation each.
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  low = draw(st.integers(-149, 127))
  high = draw(st.integers(low, 127))
  x = (rng.choice([-1.0, 1.0], d) * rng.uniform(1.0, 2.0, d)
       * np.exp2(rng.integers(low, high + 1, d).astype(np.float64)))
  for i, value in draw(st.lists(st.tuples(
      st.integers(0, d - 1),
      st.floats(-FLOAT32_MAX, FLOAT32_MAX, width=32) | st.sampled_from(
          [3e38, -3e38, 2e38, FLOAT32_MAX, 1e-45, -1.2e-38, 0.0])),
                                max_size=4)):
    x[i] = value
  x = np.clip(x, -FLOAT32_MAX, FLOAT32_MAX).astype(np.float32)
  norm = np.linalg.norm(x.astype(np.float64))
  # Scaled down into range (or onto its edge), rounding toward 0.
  if norm > FLOAT32_MAX or (norm > 0 and draw(st.booleans())):
    target = x.astype(np.float64) * (FLOAT32_MAX / norm * (1 - 2.0**-30))
    x = target.astype(np.float32)
    x = np.where(np.abs(x) > np.abs(target), np.nextafter(x, np.float32(0)),
                 x)
  assert np.linalg.norm(x.astype(np.float64)) <= FLOAT32_MAX
  return x


@settings(max_examples=40)
@given(x=_extreme_vectors(), seed=st.integers(0, 2**31 - 1))
@example(x=np.float32([2e38, 0]), seed=0)  # random_k(0.5): 4e38 sent.
@example(x=np.float32([2e38, 2e38]), seed=0)  # H D x: 4e38.
@example(x=np.full(300, 3e38 / math.sqrt(300), np.float32), seed=1)
def test_every_codec_decodes_a_float32_norm_finite(x, seed):
  # The module's promise: ||x||_2 <= float32's max -> finite decode,
  # values beyond the range saturating at +-max.
  outputs = _every_roundtrip()(jnp.asarray(x), jax.random.key(seed))
  for codec, got in zip(EVERY_CODEC, outputs, strict=True):
    got = np.asarray(got)
    assert got.shape == x.shape and got.dtype == np.float32, codec.name
    assert np.all(np.isfinite(got)), (codec.name, x, got)
  # The identity and the rotation around it give x back, however large x
  # is: to float32 rounding of ||x||, and entries flushed below 1.2e-38.
  atol = 1e-5 * np.linalg.norm(x.astype(np.float64)) + 1e-36
  for name in ("identity", "hadamard(identity)"):
    got = np.asarray(outputs[[c.name for c in EVERY_CODEC].index(name)])
    np.testing.assert_allclose(got, x, rtol=0, atol=atol)


def test_random_k_saturates_an_unrepresentable_unbiased_value():
  # Kept with probability 1/2, 2e38 would be sent as 4e38: it is sent as
  # float32's max, sign kept; the other keys send the 0.
  codec = compression.random_k(0.5)
  seen = set()
  for seed in range(8):
    for sign_ in (1, -1):
      got = _roundtrip(codec, np.float32([sign_ * 2e38, 0]),
                       jax.random.key(seed))
      assert got.tolist() in ([sign_ * FLOAT32_MAX, 0.0], [0.0, 0.0]), got
      seen.add(got[0] != 0)
  assert seen == {True, False}
  # Representable values are sent as before: x_i d / k.
  got = _roundtrip(codec, np.float32([1e38, 0]), jax.random.key(3))
  assert got.tolist() in ([np.float32(1e38) * 2, 0.0], [0.0, 0.0])


def test_rotation_of_extreme_vectors_is_exact_scaling():
  # Powers of two scale the rotation exactly, up to float32's max.
  x = _vector(300, seed=7)
  x = x / np.abs(x).max()
  rotate = jax.jit(compression.rotate)
  unrotate = jax.jit(compression.unrotate, static_argnums=2)
  base = np.asarray(rotate(x, KEY))
  for power in (-100, 0, 100, 120, 127):
    scaled = (x * np.float32(2.0**power)).astype(np.float32)
    y = np.asarray(rotate(scaled, KEY))
    assert np.all(np.isfinite(y)), power
    np.testing.assert_array_equal(y, base * np.float32(2.0**power))
    back = np.asarray(unrotate(jnp.asarray(y), KEY, 300))
    np.testing.assert_allclose(back, scaled, rtol=0,
                               atol=1e-6 * np.abs(scaled).max())
