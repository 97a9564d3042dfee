"""FedLap: Eqs. (5)-(10) against numpy, its gradient, q's endpoints, engine."""

import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import engine
from fedjax_agg import objectives
from fedjax_agg.objectives._fedlap import row_dissimilarities
from fedjax_agg.objectives._fedlap import row_distances
from fedjax_agg.config import LocalTraining
from tests.test_engine import reference_client
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model


def np_rows(kernel, conv_rows):
  """Rows of a kernel written out index by index (independent of reshape
  tricks in the library)."""
  kernel = np.asarray(kernel, np.float64)
  if kernel.ndim <= 1:
    return [kernel.ravel()]
  if kernel.ndim == 2:
    return [kernel[j, :] for j in range(kernel.shape[0])]
  kh, kw, cin, cout = kernel.shape
  if conv_rows == "in_channel":
    return [kernel[:, :, j, :].ravel() for j in range(cin)]
  if conv_rows == "out_channel":
    return [kernel[:, :, :, j].ravel() for j in range(cout)]
  return [kernel[a, b, j, :] for a in range(kh) for b in range(kw)
          for j in range(cin)]


def np_lambda_d(local, glob, conv_rows):
  lams, ds = [], []
  for w, g in zip(np_rows(local, conv_rows), np_rows(glob, conv_rows),
                  strict=True):
    nw, ng = np.linalg.norm(w), np.linalg.norm(g)
    if np.array_equal(w, g):
      s = 1.0
    elif nw == 0 or ng == 0:
      s = 0.0
    else:
      s = float(w @ g / (nw * ng))  # Eq. (5)
    lams.append(1.0 - s)  # Eq. (7)
    ds.append(float(np.sum((w - g) ** 2)))  # Eq. (8)
  return np.array(lams), np.array(ds)


def small_params(seed=0):
  rng = np.random.default_rng(seed)
  f = lambda *shape: rng.normal(size=shape).astype(np.float32)
  glob = {"params": {"conv": {"kernel": f(2, 2, 3, 4), "bias": f(4)},
                     "dense": {"kernel": f(5, 3), "bias": np.zeros(3,
                                                                   np.float32)}}}
  local = jax.tree.map(lambda a: a + 0.3 * f(*a.shape), glob)
  # Row 1 of the dense kernel is unchanged; row 2 is zero locally.
  local["params"]["dense"]["kernel"][1] = glob["params"]["dense"]["kernel"][1]
  local["params"]["dense"]["kernel"][2] = 0.0
  return (jax.tree.map(jnp.asarray, local), jax.tree.map(jnp.asarray, glob))


def leaves_in_order(tree, regularize_bias):
  return [leaf for leaf in jax.tree.leaves(tree)
          if leaf.ndim >= 2 or regularize_bias]


@pytest.mark.parametrize("conv_rows", ["in_channel", "patch", "out_channel"])
@pytest.mark.parametrize("regularize_bias", [False, True])
def test_lambda_and_distance_match_numpy(conv_rows, regularize_bias):
  local, glob = small_params()
  kw = dict(conv_rows=conv_rows, regularize_bias=regularize_bias)
  lams = jax.jit(lambda a, b: row_dissimilarities(a, b, **kw))(
      local, glob)
  dists = jax.jit(lambda a, b: row_distances(a, b, **kw))(
      local, glob)
  locals_ = leaves_in_order(local, regularize_bias)
  globs = leaves_in_order(glob, regularize_bias)
  assert len(lams) == len(dists) == len(locals_) == (4 if regularize_bias
                                                     else 2)
  for lam, dist, w, g in zip(lams, dists, locals_, globs, strict=True):
    ref_lam, ref_d = np_lambda_d(w, g, conv_rows)
    np.testing.assert_allclose(lam, ref_lam, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dist, ref_d, rtol=1e-5, atol=1e-6)
  # Dense kernel rows: unchanged row has lambda 0, zero row lambda 1.
  dense = [lam for lam in lams if lam.shape == (5,)][0]
  assert float(dense[1]) == 0.0 and float(dense[2]) == 1.0


def np_penalty_and_grad(local, glob, q, mu, conv_rows, regularize_bias):
  lap = min(2 * q, 2 - 2 * q)
  prox = max(2 * q - 1, 0) * mu
  total, grads = 0.0, []
  for w, g in zip(leaves_in_order(local, regularize_bias),
                  leaves_in_order(glob, regularize_bias), strict=True):
    lam, d = np_lambda_d(w, g, conv_rows)
    c = lap * lam + prox
    total += 0.5 * float(c @ d)
    # d/dw of 1/2 c_j ||w_j - g_j||^2 = c_j (w_j - g_j), per row.
    grads.append([cj * (wr - gr) for cj, wr, gr in
                  zip(c, np_rows(w, conv_rows), np_rows(g, conv_rows),
                      strict=True)])
  return total, grads


@pytest.mark.parametrize("q", [0.25, 0.5, 0.8])
@pytest.mark.parametrize("conv_rows", ["in_channel", "out_channel"])
def test_penalty_and_gradient_match_analytic(q, conv_rows):
  local, glob = small_params(1)
  mu = 0.7
  objective = objectives.fedlap(q, mu=mu, conv_rows=conv_rows,
                                regularize_bias=True)
  context = objective.prepare(local, glob)

  @jax.jit
  def value_and_grad(params):
    return jax.value_and_grad(objective.penalty)(params, glob, context)

  value, grads = value_and_grad(local)
  ref_value, ref_grads = np_penalty_and_grad(local, glob, q, mu, conv_rows,
                                             True)
  np.testing.assert_allclose(value, ref_value, rtol=1e-5)
  for grad, ref_rows in zip(jax.tree.leaves(grads), ref_grads, strict=True):
    for got, want in zip(np_rows(grad, conv_rows), ref_rows, strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_drifted_row_is_penalised_more():
  rng = np.random.default_rng(3)
  glob = {"params": {"fc": {"kernel": jnp.asarray(rng.normal(size=(2, 6)))}}}
  kernel = np.asarray(glob["params"]["fc"]["kernel"]).copy()
  kernel[0] += 0.05 * rng.normal(size=6)  # small drift
  kernel[1] += 1.0 * rng.normal(size=6)  # large drift
  local = {"params": {"fc": {"kernel": jnp.asarray(kernel)}}}
  (lam,) = row_dissimilarities(local, glob)
  (dist,) = row_distances(local, glob)
  assert lam[1] > lam[0] and dist[1] > dist[0]
  contribution = lam * dist  # row terms of Eq. (10)
  assert contribution[1] > contribution[0] > 0


def test_q_endpoints():
  local, glob = small_params(2)
  zero = objectives.fedlap(0.0, regularize_bias=True)
  assert float(zero.penalty(local, glob, zero.prepare(local, glob))) == 0.0
  prox_obj = objectives.fedprox(mu=0.3)
  one = objectives.fedlap(1.0, mu=0.3, regularize_bias=True)
  np.testing.assert_allclose(
      one.penalty(local, glob, one.prepare(local, glob)),
      prox_obj.penalty(local, glob, ()), rtol=1e-6)
  # q = 1/2 is Eq. (10) as written: 1/2 sum_l <lambda_l, d_l>.
  half = objectives.fedlap()
  lams = row_dissimilarities(local, glob)
  dists = row_distances(local, glob)
  eq10 = 0.5 * sum(float(jnp.dot(a, b))
                   for a, b in zip(lams, dists, strict=True))
  np.testing.assert_allclose(half.penalty(local, glob, half.prepare(
      local, glob)), eq10, rtol=1e-6)


@hypothesis.given(
    hnp.arrays(np.float32, (3, 4), elements=st.floats(-2, 2, width=32)),
    hnp.arrays(np.float32, (3, 4), elements=st.floats(-2, 2, width=32)))
def test_lambda_in_range_and_penalty_nonnegative(w, g):
  local = {"params": {"fc": {"kernel": jnp.asarray(w)}}}
  glob = {"params": {"fc": {"kernel": jnp.asarray(g)}}}
  (lam,) = row_dissimilarities(local, glob)
  assert np.all(np.asarray(lam) >= 0) and np.all(np.asarray(lam) <= 2)
  objective = objectives.fedlap()
  assert float(objective.penalty(local, glob,
                                 objective.prepare(local, glob))) >= 0


def test_step_recompute_ignores_context_and_has_no_lambda_gradient():
  local, glob = small_params(4)
  per_step = objectives.fedlap(recompute="step")
  per_epoch = objectives.fedlap()
  assert per_step.prepare(local, glob) == ()
  grad_step = jax.jit(jax.grad(per_step.penalty))(local, glob, ())
  grad_epoch = jax.jit(lambda p, g: jax.grad(per_epoch.penalty)(
      p, g, per_epoch.prepare(p, g)))(local, glob)
  for a, b in zip(jax.tree.leaves(grad_step), jax.tree.leaves(grad_epoch),
                  strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_penalty_is_vmappable_over_clients():
  local, glob = small_params(5)
  objective = objectives.fedlap()
  stacked = jax.tree.map(lambda a: jnp.stack([a, 2 * a]), local)
  penalty = lambda p: objective.penalty(p, glob, objective.prepare(p, glob))
  per_client = jax.jit(jax.vmap(penalty))(stacked)
  for k in range(2):
    one = jax.tree.map(lambda a, k=k: a[k], stacked)
    np.testing.assert_allclose(per_client[k], jax.jit(penalty)(one),
                               rtol=1e-6)


def _train(objective):
  """Trains 5 clients for 2 epochs and for 1 epoch (same shuffles)."""
  data, *_ = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(0))
  ids = jnp.arange(5)
  train = engine.make_local_trainer(model,
      LocalTraining(batch_size=3, epochs=2, objective=objective),
      clients_per_step=5)
  return [train(params, data, ids, jnp.full(5, 0.3),
                engine.full_steps(data, ids, 3, epochs),
                jax.random.key(3)).client_params for epochs in (2, 1)]


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b),
                             strict=True))


def test_q0_is_exactly_fedavg_and_e1_is_fedavg_with_epoch_lambda():
  fedavg_2, fedavg_1 = _train(objectives.cross_entropy())
  zero_2, zero_1 = _train(objectives.fedlap(0.0, regularize_bias=True))
  assert _max_diff(zero_2, fedavg_2) == 0.0
  assert _max_diff(zero_1, fedavg_1) == 0.0
  lap_2, lap_1 = _train(objectives.fedlap(0.5))
  assert _max_diff(lap_2, fedavg_2) > 1e-4
  # One epoch with lambda fixed per epoch: lambda = 0 in that epoch, so the
  # penalty and its gradient are 0 (up to compiled rounding).
  assert _max_diff(lap_1, fedavg_1) < 1e-6
  _, step_1 = _train(objectives.fedlap(0.5, recompute="step"))
  assert _max_diff(step_1, fedavg_1) > 1e-4


def test_engine_with_fedlap_matches_reference_loop():
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  objective = objectives.fedlap(0.7, mu=0.5, regularize_bias=True)
  ids = jnp.array([1, 3])
  train = engine.make_local_trainer(model,
      LocalTraining(batch_size=3, epochs=3, objective=objective),
      clients_per_step=2)
  key = jax.random.key(9)
  result = train(params, data, ids, jnp.full(2, 0.4),
                 engine.full_steps(data, ids, 3, 3), key)
  for k, cid in enumerate(np.asarray(ids)):
    ref, _ = reference_client(model, params, x, y, parts[cid],
                              jax.random.fold_in(key, cid), 0.4, 3, 3, 10**6,
                              objective, optax.sgd)
    got = jax.tree.map(lambda a, k=k: a[k], result.client_params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5,
                                                         atol=2e-6), got, ref)


def test_registry_and_bad_arguments():
  assert isinstance(objectives.get("fedlap", q=0.2),
                    type(objectives.fedprox()))
  with pytest.raises(ValueError, match="q must"):
    objectives.fedlap(1.5)
  with pytest.raises(ValueError, match="mu must"):
    objectives.fedlap(mu=-1.0)
  with pytest.raises(ValueError, match="conv_rows"):
    objectives.fedlap(conv_rows="rows")
  with pytest.raises(ValueError, match="recompute"):
    objectives.fedlap(recompute="round")
