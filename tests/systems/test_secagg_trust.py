"""Secure aggregation's numbers a user reads: the sensitivity a privacy
accountant would need (refused, with the bound that shows why) and the
bytes each client sends."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fedjax_agg import aggregators
from fedjax_agg import secagg
from fedjax_agg.config import Privacy, Systems
from tests.test_clock import _run


@settings(max_examples=30, deadline=None)
@given(bits=st.sampled_from([8, 12, 16, 20, 24]),
       cohort_size=st.integers(1, 100), dim=st.integers(1, 3000),
       clip_norm=st.floats(1e-3, 10.0), seed=st.integers(0, 2**31 - 1))
def test_rounding_moves_a_client_by_at_most_one_level_per_coordinate(
    bits, cohort_size, dim, clip_norm, seed):
  """A client's decoded update is within (R / L)(1 + L 2^-22) sqrt(d) of
  its L2-clipped input, the bound an accountant would have to add to the
  clip norm; at 8 bits and 10^5 coordinates it is 4x the clip norm."""
  if (2**(bits - 1) - 1) // cohort_size < 1:
    return
  num_levels = secagg.levels(bits, cohort_size)
  rng = np.random.default_rng(seed)
  x = rng.normal(size=dim).astype(np.float32)
  x *= np.float32(clip_norm / np.linalg.norm(x))
  bound = np.float32(max(1.0, float(np.max(np.abs(x)))))
  key = jax.random.PRNGKey(seed)
  decoded = np.asarray(jax.jit(
      lambda v, k: secagg.decode(secagg.encode(v, bound, num_levels, k),
                                 bound, num_levels))(x, key), np.float64)
  step = float(bound) / num_levels * (1 + num_levels * 2.0**-22)
  assert np.linalg.norm(decoded - x) <= step * np.sqrt(dim) * (1 + 1e-6)
  assert np.all(np.abs(decoded - x) <= step * (1 + 1e-6))


def test_the_issue_example_exceeds_the_clip_norm():
  """Clip norm 0.5 on 100,000 coordinates, 8 bits, 10 clients (L = 12,
  range 1): each coordinate rounds to 0 or 1/12, so the decoded norm is
  about sqrt(d p (1 - p)) / L = 3.6 for p = 12 x, seven times the
  sensitivity."""
  num_levels = secagg.levels(8, 10)
  dim = 100_000
  x = jnp.full((dim,), 0.5 / np.sqrt(dim), jnp.float32)
  decoded = jax.jit(lambda v, k: secagg.decode(
      secagg.encode(v, 1.0, num_levels, k), 1.0, num_levels))(
          x, jax.random.PRNGKey(0))
  norm = float(jnp.linalg.norm(decoded))
  p = 12 * 0.5 / np.sqrt(dim)
  expected = np.sqrt(dim * p * (1 - p)) / num_levels
  assert norm > 4 * 0.5
  np.testing.assert_allclose(norm, expected, rtol=0.05)


def test_privacy_accounting_on_a_secure_sum_is_refused_by_name():
  with pytest.raises(ValueError, match=r"systems.secagg_bits=8 with privacy"):
    _run(Systems(secagg_bits=8),
         aggregator=aggregators.dp_fedavg(0.5, 1.0), privacy=Privacy())
  # Without accounting the private rule still runs on the secure sum.
  result = _run(Systems(secagg_bits=16),
                aggregator=aggregators.dp_fedavg(0.5, 1.0))
  assert np.isfinite(result.history.rows[-1]["test_loss"])


@pytest.mark.parametrize("bits", [8, 13, 32])
def test_uplink_bytes_count_the_secure_sums_message(bits):
  result = _run(Systems(secagg_bits=bits), rounds=2)
  params = result.state.params
  dim = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params))
  # FedAvg's statistics per client: n_k x_k, n_k, mask x_k and mask (two
  # model-sized trees and two scalars), b bits each, packed.
  message = -(-(2 * dim + 2) * bits // 8)
  cohort = 4  # floor(0.5 * 8)
  for r in (1, 2):
    assert result.history.rows[r]["uplink_bytes"] == r * cohort * message
  assert secagg.message_bytes(aggregators.fedavg(), params, bits) == message
  if bits == 8:  # half of the float32 model, not the float32 run's bytes
    assert message < 4 * dim * 0.6


def test_privacy_with_a_markov_clock_is_refused_before_the_run():
  # A clock that selects who is online breaks the accountant's uniform
  # cohorts; the refusal names the availability model.
  with pytest.raises(ValueError, match="privacy accountant.*'markov'"):
    _run(Systems(availability="markov",
                 availability_args={"mean_online_s": 50.0,
                                    "mean_offline_s": 50.0}),
         aggregator=aggregators.dp_fedavg(0.5, 1.0), privacy=Privacy())
