"""Federated datasets: ``from_assignment`` equals ``from_partition``, and
both builders refuse labels a cast would change.
"""

import numpy as np
import pytest

from fedjax_agg import federated


def test_from_assignment_equals_from_partition():
  rng = np.random.default_rng(0)
  owner = rng.integers(-1, 6, size=40)
  owner[:6] = np.arange(6)  # every client holds one at least
  x = rng.normal(size=(40, 5)).astype(np.float32)
  y = rng.integers(0, 3, size=40)
  built = federated.from_assignment(x, y, owner, 6)
  parts = [np.flatnonzero(owner == c) for c in range(6)]
  expected = federated.from_partition(x, y, parts)
  for a, b in zip(built, expected, strict=True):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("owner, num_clients, match", [
    ([0, 1, 3], 3, "client_of_example"),
    ([0, -2, 1], 2, "client_of_example"),
    ([0, 0, 2], 3, "hold none"),
    ([0.0, 1.0, 1.0], 2, "integer"),
    ([0, 1], 2, "client_of_example"),
    ([0, 1, 1], 0, "num_clients"),
])
def test_from_assignment_rejects_bad_input(owner, num_clients, match):
  with pytest.raises(ValueError, match=match):
    federated.from_assignment(np.zeros((3, 2)), np.zeros(3, int),
                              np.asarray(owner), num_clients)


# Both builders over 3 examples and 2 clients, with labels ``y``.
BUILDERS = {
    "from_partition": lambda y: federated.from_partition(
        np.zeros((3, 2)), y, [np.array([0, 2]), np.array([1])]),
    "from_assignment": lambda y: federated.from_assignment(
        np.zeros((3, 2)), y, np.array([0, 1, 0]), 2),
}


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize("y", [
    np.array([0.0, 2.7, 1.0]),  # would truncate to 2
    np.array([0.0, np.nan, 1.0]),
    np.array([0.0, np.inf, 1.0]),
    np.array([0, 2**32 + 3, 1], np.int64),  # would wrap to 3
    np.array([0, 2**31, 1], np.int64),
    np.array([0, -1, 1]),
    np.array([0.0, -2.0, 1.0]),
], ids=["fraction", "nan", "inf", "wraps", "int32_max_plus_1", "negative",
        "negative_float"])
def test_builders_refuse_labels_a_cast_would_change(builder, y):
  with pytest.raises(ValueError, match=r"^y must hold"):
    BUILDERS[builder](y)


@pytest.mark.parametrize("builder", BUILDERS)
def test_builders_keep_valid_labels_exactly(builder):
  for y in (np.array([0.0, 3.0, 1.0]), np.array([0, 3, 1], np.int64),
            np.array([0, 2**31 - 1, 1], np.uint64)):
    data = BUILDERS[builder](y)
    assert data.y.dtype == np.int32
    np.testing.assert_array_equal(data.y, y.astype(np.int64))
  with pytest.raises(TypeError, match="y must hold integer labels"):
    BUILDERS[builder](np.array(["a", "b", "c"]))
