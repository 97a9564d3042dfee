"""Every convolution implementation equals a numpy convolution, with grads.

The reference is a float64 numpy loop over kernel taps (independent of
lax); gradients are checked as the vector-Jacobian product with a random
cotangent, against the numpy adjoint of the same loop.
"""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg.models import layers
from fedjax_agg.config import LocalTraining

# (batch, height, width, in, out, kh, kw, padding): odd and unequal sizes,
# a kernel wider than tall, an asymmetric explicit padding, C = 1 (a first
# layer) and a kernel as large as the input.
CASES = [
    (2, 7, 5, 3, 4, 3, 3, "SAME"),
    (3, 6, 9, 2, 5, 5, 3, "SAME"),
    (2, 8, 7, 3, 2, 3, 2, "VALID"),
    (1, 5, 6, 1, 3, 5, 5, "SAME"),
    (2, 4, 4, 2, 3, 4, 4, "VALID"),
    (2, 6, 5, 2, 3, 2, 4, ((1, 0), (2, 3))),
]
TOL = dict(rtol=2e-5, atol=2e-5)


@pytest.fixture(autouse=True)
def _full_precision():
  # The lowerings are compared with NumPy at float32 rounding; a GPU
  # computes their products with TF32 unless asked (local training asks:
  # LocalTraining.matmul_precision), measured 3.4e-2 relative on an H200.
  with jax.default_matmul_precision("highest"):
    yield
# "auto" is one of the others (checked in test_auto_resolves_by_backend).
IMPLS = tuple(i for i in layers.CONV_IMPLS if i != "auto")


def np_pads(padding, kh, kw, h, w):
  return layers.explicit_padding(padding, (kh, kw), (h, w))


def np_conv(x, kernel, padding):
  """[B, H, W, C] * [kh, kw, C, F] in float64 by summing the kernel taps."""
  x = np.asarray(x, np.float64)
  kernel = np.asarray(kernel, np.float64)
  kh, kw = kernel.shape[:2]
  (top, bottom), (left, right) = np_pads(padding, kh, kw, *x.shape[1:3])
  xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
  out_h = xp.shape[1] - kh + 1
  out_w = xp.shape[2] - kw + 1
  out = np.zeros((x.shape[0], out_h, out_w, kernel.shape[3]))
  for i in range(kh):
    for j in range(kw):
      out += xp[:, i:i + out_h, j:j + out_w, :] @ kernel[i, j]
  return out


def np_conv_vjp(x, kernel, padding, cotangent):
  """(dx, dkernel) of sum(cotangent * np_conv(x, kernel)), float64."""
  x = np.asarray(x, np.float64)
  kernel = np.asarray(kernel, np.float64)
  g = np.asarray(cotangent, np.float64)
  kh, kw = kernel.shape[:2]
  h, w = x.shape[1:3]
  (top, bottom), (left, right) = np_pads(padding, kh, kw, h, w)
  xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
  out_h, out_w = g.shape[1:3]
  dxp = np.zeros_like(xp)
  dkernel = np.zeros_like(kernel)
  for i in range(kh):
    for j in range(kw):
      window = xp[:, i:i + out_h, j:j + out_w, :]
      dkernel[i, j] = np.einsum("bhwc,bhwf->cf", window, g)
      dxp[:, i:i + out_h, j:j + out_w, :] += g @ kernel[i, j].T
  return dxp[:, top:top + h, left:left + w, :], dkernel


def random_case(case, clients=None, seed=0):
  batch, h, w, c, f, kh, kw, padding = case
  rng = np.random.default_rng(seed)
  lead = () if clients is None else (clients,)
  x = rng.normal(size=lead + (batch, h, w, c)).astype(np.float32)
  kernel = rng.normal(size=lead + (kh, kw, c, f)).astype(np.float32)
  return x, kernel, padding


def out_shape(x, kernel, padding):
  return np_conv(x[:1], kernel, padding).shape[1:]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_forward_and_grads_match_numpy(impl, case):
  x, kernel, padding = random_case(case)
  g = np.random.default_rng(1).normal(
      size=(x.shape[0],) + out_shape(x, kernel, padding)).astype(np.float32)

  @jax.jit
  def run(x, kernel, g):
    y, vjp = jax.vjp(lambda a, b: layers.conv2d(a, b, padding, impl), x,
                     kernel)
    return (y,) + vjp(g)

  y, dx, dkernel = run(x, kernel, g)
  np.testing.assert_allclose(y, np_conv(x, kernel, padding), **TOL)
  want_dx, want_dkernel = np_conv_vjp(x, kernel, padding, g)
  np.testing.assert_allclose(dx, want_dx, **TOL)
  np.testing.assert_allclose(dkernel, want_dkernel, **TOL)


def _vmapped_vjp(impl, padding, in_axes):
  def one(x, kernel, g):
    y, vjp = jax.vjp(lambda a, b: layers.conv2d(a, b, padding, impl), x,
                     kernel)
    return (y,) + vjp(g)
  return jax.jit(jax.vmap(one, in_axes=in_axes))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("in_axes", [(0, 0, 0), (0, None, 0), (None, 0, 0)],
                         ids=["per_client_kernels", "shared_kernel",
                              "shared_input"])
@pytest.mark.parametrize("case", [CASES[2], CASES[5]], ids=str)
def test_vmap_over_clients_matches_numpy_per_client(impl, in_axes, case):
  clients = 3
  x, kernel, padding = random_case(case, clients)
  if in_axes[0] is None:
    x = x[0]
  if in_axes[1] is None:
    kernel = kernel[0]
  pick = lambda a, axis, k: a if axis is None else a[k]
  g = np.random.default_rng(2).normal(
      size=(clients, case[0]) + out_shape(pick(x, in_axes[0], 0),
                                          pick(kernel, in_axes[1], 0),
                                          padding)).astype(np.float32)
  y, dx, dkernel = _vmapped_vjp(impl, padding, in_axes)(x, kernel, g)
  for k in range(clients):
    xk, kernelk = pick(x, in_axes[0], k), pick(kernel, in_axes[1], k)
    np.testing.assert_allclose(y[k], np_conv(xk, kernelk, padding), **TOL)
    want_dx, want_dkernel = np_conv_vjp(xk, kernelk, padding, g[k])
    np.testing.assert_allclose(dx[k], want_dx, **TOL)
    np.testing.assert_allclose(dkernel[k], want_dkernel, **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_nested_vmap_and_scan(impl):
  """Two client-like axes and a lax.scan over steps, as in the engine."""
  x, kernel, padding = random_case(CASES[1], clients=4)
  x = x.reshape((2, 2) + x.shape[1:])
  kernel = kernel.reshape((2, 2) + kernel.shape[1:])

  def train(kernel, x):
    loss = lambda k: jnp.sum(jnp.tanh(layers.conv2d(x, k, padding, impl)))

    def step(k, _):
      return k - 0.01 * jax.grad(loss)(k), loss(k)

    return jax.lax.scan(step, kernel, jnp.arange(3))

  got_kernel, got_losses = jax.jit(jax.vmap(jax.vmap(train)))(kernel, x)
  for a in range(2):
    for b in range(2):
      k = np.asarray(kernel[a, b], np.float64)
      for step in range(3):
        y = np_conv(x[a, b], k, padding)
        np.testing.assert_allclose(got_losses[a, b, step],
                                   np.sum(np.tanh(y)), rtol=1e-4)
        _, dk = np_conv_vjp(x[a, b], k, padding, 1 - np.tanh(y)**2)
        k = k - 0.01 * dk
      np.testing.assert_allclose(got_kernel[a, b], k, **TOL)


@pytest.mark.parametrize("impl", IMPLS)
def test_conv_module_matches_flax_linen_conv(impl):
  x = np.random.default_rng(3).normal(size=(2, 9, 7, 3)).astype(np.float32)
  ours = layers.Conv(6, (3, 5), padding="SAME", impl=impl)
  theirs = nn.Conv(6, (3, 5), padding="SAME")
  variables = ours.init(jax.random.key(0), x)
  assert (jax.tree.map(jnp.shape, variables)
          == jax.tree.map(jnp.shape, theirs.init(jax.random.key(0), x)))
  # Same initialisers: the same key gives the same parameters.
  jax.tree.map(np.testing.assert_array_equal, variables,
               theirs.init(jax.random.key(0), x))
  variables = jax.tree.map(lambda a: a + 0.1, variables)  # non-zero bias
  np.testing.assert_allclose(jax.jit(ours.apply)(variables, x),
                             theirs.apply(variables, x), **TOL)


@pytest.mark.parametrize("impl", ["im2col", "conv"])
def test_per_client_kernels_never_lower_to_grouped_convolutions(impl):
  x, kernel, padding = random_case(CASES[0], clients=3)
  g = np.ones((3, 2, 7, 5, 4), np.float32)
  hlo = _vmapped_vjp(impl, padding, (0, 0, 0)).lower(x, kernel, g).as_text()
  groups = lambda text: {int(n) for n in re.findall(
      r"(?:feature|batch)_group_count = (\d+)", text)}
  assert groups(hlo) <= {1}
  xla_hlo = _vmapped_vjp("xla", padding, (0, 0, 0)).lower(x, kernel,
                                                          g).as_text()
  assert groups(xla_hlo) == {1, 3}  # what the custom rules avoid


def test_auto_resolves_by_backend():
  on_cpu = jax.default_backend() == "cpu"
  assert layers.resolve_impl("auto") == ("conv" if on_cpu else "xla")
  with layers.per_client_training():
    assert layers.resolve_impl("auto") == ("conv" if on_cpu else "im2col")
    with layers.per_client_training():
      pass
    # Leaving a nested context keeps the outer one.
    assert layers.resolve_impl("auto") == ("conv" if on_cpu else "im2col")
  assert layers.resolve_impl("auto") == ("conv" if on_cpu else "xla")
  assert layers.resolve_impl("conv") == "conv"


@pytest.mark.parametrize("backend,per_client,want", [
    ("cpu", False, "conv"), ("cpu", True, "conv"),
    ("gpu", False, "xla"), ("gpu", True, "im2col"),
    ("tpu", False, "xla"), ("tpu", True, "im2col")])
def test_auto_choice_for_every_backend(backend, per_client, want):
  assert layers.auto_impl(backend, per_client) == want


def test_bad_arguments_are_named():
  x = jnp.zeros((1, 5, 5, 2))
  kernel = jnp.zeros((3, 3, 2, 4))
  with pytest.raises(ValueError, match="impl"):
    layers.conv2d(x, kernel, "SAME", "winograd")
  with pytest.raises(ValueError, match="padding"):
    layers.conv2d(x, kernel, "FULL", "im2col")
  with pytest.raises(ValueError, match="padding"):
    layers.conv2d(x, kernel, ((1, -1), (0, 0)), "im2col")
  with pytest.raises(ValueError, match="kernel"):
    layers.conv2d(x, jnp.zeros((3, 3, 1, 4)), "SAME", "im2col")
  with pytest.raises(ValueError, match="larger"):
    layers.conv2d(x, jnp.zeros((7, 7, 2, 4)), "VALID", "conv")


@pytest.mark.parametrize("shape", [(2, 8, 6, 3), (3, 7, 9, 2)])
@pytest.mark.parametrize("ties", [False, True])
def test_max_pool_matches_flax_max_pool_with_grads(shape, ties):
  rng = np.random.default_rng(4)
  x = rng.normal(size=shape).astype(np.float32)
  if ties:  # ReLU zeros and a constant channel: every window has ties.
    x = np.maximum(x, 0)
    x[..., 0] = 1.0
  g = rng.normal(size=(shape[0], shape[1] // 2, shape[2] // 2,
                       shape[3])).astype(np.float32)

  def vjp(pool):
    y, back = jax.vjp(pool, x)
    return y, back(g)[0]

  got = jax.jit(lambda: vjp(layers.max_pool))()
  want = vjp(lambda a: nn.max_pool(a, (2, 2), strides=(2, 2)))
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_array_equal(got[1], want[1])
  # Each window sends its gradient to exactly one element.
  np.testing.assert_allclose(
      np.asarray(got[1])[:, :shape[1] // 2 * 2, :shape[2] // 2 * 2].sum(),
      g.sum(), rtol=1e-5)


def test_max_pool_under_vmap_and_fallback():
  x = np.random.default_rng(5).normal(size=(3, 2, 6, 6, 2)).astype(np.float32)
  loss = lambda pool: (lambda a: jnp.sum(jnp.sin(pool(a))))
  got = jax.jit(jax.vmap(jax.grad(loss(layers.max_pool))))(x)
  want = jax.vmap(jax.grad(loss(lambda a: nn.max_pool(a, (2, 2), (2, 2)))))(x)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # Overlapping windows and SAME padding go to flax's max_pool.
  for strides, padding in (((1, 1), "VALID"), ((2, 2), "SAME")):
    np.testing.assert_array_equal(
        layers.max_pool(x[0], (3, 3), strides, padding),
        nn.max_pool(x[0], (3, 3), strides=strides, padding=padding))
  with pytest.raises(ValueError, match="x"):
    layers.max_pool(x)


class _TinyCNN(nn.Module):
  impl: str

  @nn.compact
  def __call__(self, x):
    x = layers.max_pool(nn.relu(layers.Conv(4, (3, 3), impl=self.impl)(x)))
    x = nn.relu(layers.Conv(3, (3, 3), padding="VALID", impl=self.impl)(x))
    return nn.Dense(3)(x.reshape((x.shape[0], -1)))


def test_engine_trains_the_same_clients_with_every_impl():
  """The one-call engine (vmap over clients, scan over steps) agrees."""
  from fedjax_agg import engine, federated
  from fedjax_agg.types import Model
  rng = np.random.default_rng(6)
  x = rng.normal(size=(3, 10, 8, 8, 1)).astype(np.float32)
  y = rng.integers(0, 3, size=(3, 10))
  data = federated.from_stacked(x, y, num_examples=[10, 7, 9])
  ids = jnp.arange(3)
  results = {}
  for impl in IMPLS:
    net = _TinyCNN(impl)
    model = Model(init=lambda key, net=net: net.init(key, x[0, :1]),
                  apply=lambda v, xb, train, net=net: (net.apply(v, xb), v))
    train = engine.make_local_trainer(model,
        LocalTraining(batch_size=4, epochs=1, compute_losses=False),
        clients_per_step=2)
    results[impl] = train(model.init(jax.random.key(0)), data, ids,
                          jnp.full(3, 0.1), engine.full_steps(data, ids, 4, 1),
                          jax.random.key(1))
  for impl in IMPLS:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                         atol=1e-5),
                 results[impl], results["xla"])
  # Training moved the params away from the shared initialisation.
  kernel = results["conv"].client_params["params"]["Conv_0"]["kernel"]
  assert float(jnp.max(jnp.abs(kernel[0] - kernel[1]))) > 1e-3
