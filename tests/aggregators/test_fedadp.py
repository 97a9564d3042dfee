"""FedAdp: golden tests against numpy and the paper's identities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg.aggregators._fedadp import FedAdpState
from fedjax_agg.aggregators._fedadp import gompertz
from fedjax_agg.aggregators._fedadp import SMOOTHINGS
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES


def np_adaptive_round(global_groups, client_groups, ids, num_examples, mask,
                      round_, table, seen, *, alpha, eta, smoothing):
  """One round of Eqs. (1)-(7) in numpy, per group (layer) of coordinates.

  Args:
    global_groups: list over layers of [D_l] vectors.
    client_groups: list over layers of [K, D_l] arrays.
    ids, num_examples, mask: [K] cohort.
    round_: 1-based round.
    table: [N, L] smoothed angles; seen: [N] participation counts.

  Returns:
    (new groups, new table, new seen, psi [K, L]).
  """
  table, seen = table.copy(), seen.copy()
  real = np.flatnonzero(mask > 0)
  p = num_examples[real] / num_examples[real].sum()
  num_layers = len(global_groups)
  psi = np.zeros((len(ids), num_layers))
  new_groups = []
  smoothed_rows = {}
  for layer, (w, clients) in enumerate(
      zip(global_groups, client_groups, strict=True)):
    grads = (w[None] - clients[real]) / eta  # Eq. (3)
    global_grad = p @ grads  # Eq. (2)
    f = []
    for j, k in enumerate(real):
      denom = np.linalg.norm(grads[j]) * np.linalg.norm(global_grad)
      cos = 0.0 if denom == 0 else np.clip(
          grads[j] @ global_grad / denom, -1, 1)
      theta = np.arccos(cos)  # Eq. (1)
      cid = ids[k]
      t = seen[cid] + 1 if smoothing == "participation" else round_
      smoothed = theta if seen[cid] == 0 else (
          (t - 1) / t * table[cid, layer] + theta / t)  # Eq. (4)
      smoothed_rows[(cid, layer)] = smoothed
      f.append(alpha * (1 - np.exp(-np.exp(-alpha * (smoothed - 1)))))
    raw = num_examples[real] * np.exp(np.asarray(f))
    psi[real, layer] = raw / raw.sum()  # Eq. (6)
    new_groups.append(psi[real, layer] @ clients[real])  # Eq. (7)
  for (cid, layer), value in smoothed_rows.items():
    table[cid, layer] = value
  seen[ids[real]] += 1
  return new_groups, table, seen, psi


def whole_model(tree):
  return [np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])]


def stacked_whole_model(stacked):
  leaves = jax.tree.leaves(stacked)
  return [np.concatenate([np.reshape(x, (x.shape[0], -1)) for x in leaves],
                         axis=1)]


# Four rounds over a federation of 7 with partial participation, padding
# rows, a zero-update client and the global model moving between rounds.
COHORTS = [
    ([0, 1, 2, 3], [1, 1, 1, 1]),
    ([2, 4, 0, 2], [1, 1, 1, 0]),
    ([5, 2, 6, 1], [1, 1, 1, 1]),
    ([1, 3, 0, 6], [0, 1, 1, 1]),
]


def run_golden(rule_name, granularity_groups, smoothing, alpha=5.0, eta=0.05,
               **kwargs):
  """Runs the rule and the numpy reference side by side; compares."""
  rule = tu.JittedRule(rule_name, alpha=alpha, learning_rate=eta,
                       smoothing=smoothing, **kwargs)
  rng = np.random.default_rng(11)
  global_params = tu.make_params(rng)
  state = rule.init(global_params)
  table = np.zeros((tu.NUM_CLIENTS, len(granularity_groups(global_params))))
  seen = np.zeros(tu.NUM_CLIENTS, int)
  for round_, (ids, mask) in enumerate(COHORTS, start=1):
    clients = tu.make_clients(rng, global_params, 4, scale=0.2,
                              zero_rows=(1,) if round_ == 2 else ())
    num_examples = rng.integers(1, 50, size=4).astype(float)
    info = tu.make_info(ids, num_examples, mask, round_)
    new_global, state, metrics = rule.aggregate(global_params, clients,
                                                info, state)
    expected, table, seen, psi = np_adaptive_round(
        granularity_groups(tu.np_tree(global_params)),
        granularity_groups(tu.np_tree(clients), stacked=True),
        np.asarray(ids), num_examples, np.asarray(mask, float), round_,
        table, seen, alpha=alpha, eta=eta, smoothing=smoothing)
    for got, want in zip(granularity_groups(tu.np_tree(new_global)),
                         expected, strict=True):
      np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(np.reshape(state.smoothed_angle, table.shape),
                               table, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state.times_seen, seen)
    global_params = new_global
  assert rule.traces == 1
  return metrics, psi


def _whole(tree, stacked=False):
  return stacked_whole_model(tree) if stacked else whole_model(tree)


@pytest.mark.parametrize("smoothing", ["participation", "round"])
def test_golden_against_numpy(smoothing):
  metrics, psi = run_golden("fedadp", _whole, smoothing)
  np.testing.assert_allclose(metrics["client_weights"], psi[:, 0],
                             rtol=1e-5, atol=1e-7)


def test_smoothing_modes_differ_under_partial_participation():
  rng = np.random.default_rng(0)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 2)
  # Client 3 took part once before, at round 1; now it is round 5.
  state = FedAdpState(
      jnp.zeros((tu.NUM_CLIENTS,)).at[3].set(0.2),
      jnp.zeros((tu.NUM_CLIENTS,), jnp.int32).at[3].set(1))
  info = tu.make_info([3, 4], [1.0, 1.0], round_=5)
  smoothed = {}
  for smoothing in SMOOTHINGS:
    rule = aggregators.get("fedadp", num_clients=tu.NUM_CLIENTS,
                           smoothing=smoothing)
    _, new_state, metrics = jax.jit(rule.aggregate)(global_params, clients,
                                                    info, state)
    theta = float(metrics["angles"][0])
    smoothed[smoothing] = float(new_state.smoothed_angle[3])
    t = 2 if smoothing == "participation" else 5
    np.testing.assert_allclose(smoothed[smoothing],
                               (t - 1) / t * 0.2 + theta / t, rtol=1e-6)
    # Client 4 is new: its smoothed angle is its instantaneous angle.
    np.testing.assert_allclose(new_state.smoothed_angle[4],
                               metrics["angles"][1], rtol=1e-6)


GOMPERTZ = jax.jit(gompertz)  # alpha traced: one compilation


@given(alpha=st.floats(3.0, 20.0))
def test_gompertz_at_zero_is_alpha_and_at_one_is_known(alpha):
  alpha32 = jnp.float32(alpha)
  np.testing.assert_allclose(GOMPERTZ(jnp.float32(0.0), alpha32), alpha,
                             rtol=1e-6)
  np.testing.assert_allclose(GOMPERTZ(jnp.float32(1.0), alpha32),
                             alpha * (1 - np.exp(-1.0)), rtol=1e-6)


@given(alpha=st.floats(0.5, 20.0),
       angles=st.lists(st.floats(0.0, np.pi), min_size=2, max_size=8))
def test_gompertz_is_decreasing_and_bounded(alpha, angles):
  angles = np.sort(np.asarray(angles, np.float32))
  f = np.asarray(GOMPERTZ(jnp.asarray(angles), jnp.float32(alpha)))
  assert np.all(np.diff(f) <= 0)
  assert np.all((f >= 0) & (f <= alpha))


def _fedadp_jit():
  rule = aggregators.get("fedadp", num_clients=tu.NUM_CLIENTS)
  return rule, jax.jit(rule.aggregate)


RULE, AGGREGATE = _fedadp_jit()


def _fedavg(clients, num_examples, mask):
  p = np.where(mask > 0, num_examples, 0.0)
  p = p / p.sum()
  return jax.tree.map(lambda c: np.tensordot(p, np.asarray(c), axes=1),
                      clients)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=st.lists(
    st.sampled_from([0.0, 1.0]), min_size=5, max_size=5).filter(any))
def test_collinear_updates_give_fedavg(seed, mask):
  # Every update is a positive multiple of one direction: all angles are 0.
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  direction = tu.make_params(rng)
  scales = rng.uniform(0.1, 3.0, size=5)
  clients = jax.tree.map(
      lambda g, d: jnp.asarray(g[None] + scales.reshape(-1, *[1] * g.ndim)
                               * d[None], jnp.float32),
      global_params, direction)
  num_examples = rng.integers(1, 100, size=5).astype(float)
  mask = np.asarray(mask)
  info = tu.make_info([0, 1, 2, 3, 4], num_examples, mask)
  out, _, metrics = AGGREGATE(global_params, clients, info,
                              RULE.init(global_params))
  tu.assert_trees_close(out, _fedavg(clients, num_examples, mask),
                        rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.sum(metrics["client_weights"]), 1.0,
                             rtol=1e-6)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), spread=st.floats(0.05, 20.0))
def test_equal_nonzero_angles_give_fedavg(seed, spread):
  # Updates u + c e_k (e_k orthonormal, orthogonal to u) with equal n_k are
  # all at the same angle to their mean, rotated at random.
  rng = np.random.default_rng(seed)
  num = 5
  basis, _ = np.linalg.qr(rng.normal(size=(num + 1, num + 1)))
  deltas = (basis[:, 0][None] + spread * basis[:, 1:].T)
  global_params = {"w": jnp.asarray(rng.normal(size=num + 1), jnp.float32)}
  clients = {"w": jnp.asarray(global_params["w"][None] + deltas,
                              jnp.float32)}
  info = tu.make_info([6, 1, 2, 0, 5], np.full(num, 4.0))
  out, _, metrics = AGGREGATE(global_params, clients, info,
                              RULE.init(global_params))
  np.testing.assert_allclose(metrics["angles"], metrics["angles"][0],
                             atol=1e-5)
  tu.assert_trees_close(out, {"w": np.mean(clients["w"], axis=0)},
                        rtol=1e-5, atol=1e-5)


def test_zero_update_has_angle_half_pi_and_is_finite():
  rng = np.random.default_rng(3)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 3, zero_rows=(0,))
  info = tu.make_info([0, 1, 2], [5.0, 5.0, 5.0])
  out, _, metrics = AGGREGATE(global_params, clients, info,
                              RULE.init(global_params))
  np.testing.assert_allclose(metrics["angles"][0], np.pi / 2, rtol=1e-6)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(out))


def test_bad_hyperparameters_raise():
  with pytest.raises(ValueError, match="alpha"):
    aggregators.get("fedadp", num_clients=3, alpha=0.0)
  with pytest.raises(ValueError, match="learning_rate"):
    aggregators.get("fedadp", num_clients=3, learning_rate=-1.0)
  with pytest.raises(ValueError, match="smoothing"):
    aggregators.get("fedadp", num_clients=3, smoothing="epoch")
  with pytest.raises(ValueError, match="num_clients"):
    aggregators.get("fedadp", num_clients=0)
