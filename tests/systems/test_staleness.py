"""Staleness weights: the FedAsync formulas, under jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import systems

STALENESS = np.arange(0, 60)


def _reference(name, s, **kwargs):
  s = s.astype(np.float64)
  if name == "constant":
    return np.ones_like(s)
  if name == "polynomial":
    return (1.0 + s) ** -kwargs["a"]
  a, b = kwargs["a"], kwargs["b"]
  return np.array([1.0 if x <= b else 1.0 / (a * (x - b) + 1.0) for x in s])


@pytest.mark.parametrize("name, kwargs", [
    ("constant", {}), ("polynomial", {"a": 0.5}), ("polynomial", {"a": 2.0}),
    ("polynomial", {"a": 0.0}), ("hinge", {"a": 10.0, "b": 4.0}),
    ("hinge", {"a": 0.3, "b": 0.0}), ("hinge", {"a": 1.0, "b": 2.5}),
])
def test_weights_equal_the_formulas(name, kwargs):
  weight = systems.STALENESS.build(name, **kwargs)
  expected = _reference(name, STALENESS, **kwargs)
  for staleness in (STALENESS, jnp.asarray(STALENESS),
                    STALENESS.astype(np.float32)):
    got = weight(staleness)
    assert got.shape == STALENESS.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(weight)(STALENESS), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(weight)(STALENESS), expected,
                             rtol=1e-6)
  assert float(weight(0)) == 1.0
  assert np.all((np.asarray(got) > 0) & (np.asarray(got) <= 1))


def test_defaults_and_shapes():
  np.testing.assert_allclose(systems.polynomial_staleness()(3), 0.5)
  hinge = systems.hinge_staleness()
  np.testing.assert_allclose(hinge(np.array([[4, 5]])), [[1.0, 1 / 11]],
                             rtol=1e-6)


def test_hinge_gradient_is_finite():
  hinge = systems.hinge_staleness(a=2.0, b=3.0)
  grad = jax.vmap(jax.grad(hinge))(jnp.arange(8.0))
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(grad[:4], 0.0)


@pytest.mark.parametrize("build, error, name", [
    (lambda: systems.polynomial_staleness(-0.5), ValueError, "a"),
    (lambda: systems.polynomial_staleness(np.nan), ValueError, "a"),
    (lambda: systems.hinge_staleness(a=-1.0), ValueError, "a"),
    (lambda: systems.hinge_staleness(b=-1.0), ValueError, "b"),
    (lambda: systems.hinge_staleness(b="4"), TypeError, "b"),
])
def test_refuses_bad_hyperparameters(build, error, name):
  with pytest.raises(error, match=f"^{name} must"):
    build()
