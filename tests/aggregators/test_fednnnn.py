"""FedNNNN, Norm-Norm and Momentum: golden tests and the paper's identities."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES


def np_round(w, clients, num_examples, mask, d, *, beta, gamma, normalize,
             weighting):
  """Eqs. (2)-(13) in numpy on {module: {name: array}} trees.

  Returns (new w, new d, average model, metrics dict).
  """
  real = np.flatnonzero(mask > 0)
  raw = num_examples[real] if weighting == "num_examples" else np.ones(
      len(real))
  p = raw / raw.sum()
  modules = sorted(w)
  deltas = {m: {a: clients[m][a][real] - w[m][a][None] for a in w[m]}
            for m in modules}  # Eq. (2)
  mean = {m: {a: np.tensordot(p, deltas[m][a], axes=1) for a in w[m]}
          for m in modules}

  def layer_norm(tree, m, axis=None):
    return np.sqrt(sum(np.sum(np.square(x), axis=axis) for x in
                       tree[m].values()))
  layer_n = np.array([layer_norm(mean, m) for m in modules])  # Eq. (4)
  client_sq = np.stack([
      sum(np.sum(x.reshape(len(real), -1)**2, axis=1)
          for x in deltas[m].values()) for m in modules], axis=1)
  layer_e = p @ np.sqrt(client_sq)  # Eq. (5), per layer
  n = np.sqrt(np.sum(layer_n**2))
  e = p @ np.sqrt(client_sq.sum(axis=1))
  skip = normalize and n <= 1e-12
  scale = (0.0 if skip else beta * e / n) if normalize else 1.0
  new_d = d if skip else {m: {a: gamma * d[m][a] + scale * mean[m][a]
                              for a in w[m]} for m in modules}  # Eq. (12)
  new_w = {m: {a: w[m][a] + new_d[m][a] * (not skip) for a in w[m]}
           for m in modules}  # Eq. (13)
  average = {m: {a: w[m][a] + mean[m][a] for a in w[m]} for m in modules}
  update = {m: {a: new_w[m][a] - w[m][a] for a in w[m]} for m in modules}
  layer_update = np.array([layer_norm(update, m) for m in modules])
  metrics = {"N": n, "E": e, "layer_N": layer_n, "layer_E": layer_e,
             "server_update_norm": np.sqrt(np.sum(layer_update**2)),
             "layer_server_update_norm": layer_update, "norm_scale": scale}
  return new_w, new_d, average, metrics


CASES = [
    ("fednnnn", dict(beta=0.7, gamma=0.8), True),
    ("fednnnn", dict(beta=1.3, gamma=0.5, weighting="uniform"), True),
    ("norm_norm", dict(beta=0.9), True),
    ("momentum", dict(gamma=0.9), False),
]


@pytest.mark.parametrize("name,kwargs,normalize", CASES)
def test_golden_against_numpy(name, kwargs, normalize):
  rule = tu.JittedRule(name, **kwargs)
  np_kwargs = dict(beta=kwargs.get("beta", 1.0),
                   gamma=kwargs.get("gamma", 0.0), normalize=normalize,
                   weighting=kwargs.get("weighting", "num_examples"))
  rng = np.random.default_rng(21)
  global_params = tu.make_params(rng)
  state = rule.init(global_params)
  w = tu.np_tree(global_params)
  d = jax.tree.map(np.zeros_like, w)
  for round_, mask in enumerate([[1, 1, 1, 1], [1, 0, 1, 1], [0, 1, 1, 1]],
                                start=1):
    clients = tu.make_clients(rng, global_params, 4, scale=0.2,
                              zero_rows=(2,) if round_ == 2 else ())
    num_examples = rng.integers(1, 50, size=4).astype(float)
    mask = np.asarray(mask, float)
    info = tu.make_info([0, 1, 2, 3], num_examples, mask, round_)
    global_params, state, metrics = rule.aggregate(global_params, clients,
                                                   info, state)
    w, d, average, np_metrics = np_round(w, tu.np_tree(clients),
                                         num_examples, mask, d, **np_kwargs)
    tu.assert_trees_close(global_params, w, rtol=1e-5, atol=1e-5)
    tu.assert_trees_close(state.momentum, d, rtol=1e-5, atol=1e-5)
    tu.assert_trees_close(aggregators.eval_params(state, global_params),
                          average, rtol=1e-5, atol=1e-5)
    for key, value in np_metrics.items():
      np.testing.assert_allclose(metrics[key], value, rtol=1e-5, atol=1e-6,
                                 err_msg=key)
  assert rule.traces == 1


FEDNNNN = {gamma: aggregators.get("fednnnn", beta=0.8, gamma=gamma)
           for gamma in (0.0, 0.9)}
AGG = {gamma: jax.jit(rule.aggregate) for gamma, rule in FEDNNNN.items()}


def _random_round(seed, mask, gamma, spread=1.0):
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 5, scale=spread,
                            zero_rows=(4,))
  info = tu.make_info(np.arange(5), rng.integers(1, 40, size=5), mask)
  state = FEDNNNN[gamma].init(global_params)
  # A first round so that the momentum is not zero.
  out, state, _ = AGG[gamma](global_params, clients, info, state)
  clients = tu.make_clients(rng, out, 5, scale=spread)
  new, state, metrics = AGG[gamma](out, clients, info, state)
  return out, new, state, metrics


MASKS = st.lists(st.sampled_from([0.0, 1.0]), min_size=5,
                 max_size=5).filter(any)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=MASKS,
       spread=st.sampled_from([1e-4, 0.1, 10.0]))
def test_n_is_at_most_e_whole_and_per_layer(seed, mask, spread):
  _, _, _, metrics = _random_round(seed, mask, 0.9, spread)
  assert metrics["N"] <= metrics["E"] * (1 + 1e-6)
  assert np.all(metrics["layer_N"] <= metrics["layer_E"] * (1 + 1e-6))


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=MASKS)
def test_without_momentum_the_update_norm_is_beta_e(seed, mask):
  old, new, _, metrics = _random_round(seed, mask, 0.0)
  update = jnp.sqrt(sum(jnp.sum(jnp.square(a - b)) for a, b in zip(
      jax.tree.leaves(new), jax.tree.leaves(old), strict=True)))
  np.testing.assert_allclose(update, 0.8 * metrics["E"], rtol=1e-5)  # Eq. 9
  np.testing.assert_allclose(metrics["server_update_norm"], update,
                             rtol=1e-5)


ONE = aggregators.get("fednnnn", beta=1.0, gamma=0.9)
ONE_AGG = jax.jit(ONE.aggregate)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), mask=MASKS)
def test_beta_one_identical_clients_is_fedavg(seed, mask):
  rng = np.random.default_rng(seed)
  global_params = tu.make_params(rng)
  client = tu.make_clients(rng, global_params, 1)
  clients = tu.take_rows(client, [0] * 5)
  info = tu.make_info(np.arange(5), rng.integers(1, 40, size=5), mask)
  out, state, metrics = ONE_AGG(global_params, clients, info,
                                ONE.init(global_params))
  np.testing.assert_allclose(metrics["N"], metrics["E"], rtol=1e-5)
  tu.assert_trees_close(out, tu.take_rows(client, 0), atol=1e-5)
  tu.assert_trees_close(state.eval_params, out, atol=1e-5)


def test_zero_mean_update_returns_the_global_model_and_keeps_momentum():
  # Updates +v and -v with equal weights cancel exactly: N = 0.
  rng = np.random.default_rng(1)
  zeros = jax.tree.map(jnp.zeros_like, tu.make_params(rng))
  v = tu.make_params(rng)
  clients = tu.stack_rows([v, jax.tree.map(jnp.negative, v)])
  info = tu.make_info([0, 1], [5.0, 5.0])
  momentum = tu.make_params(rng)
  state = FEDNNNN[0.9].init(zeros)._replace(momentum=momentum)
  out, new_state, metrics = AGG[0.9](zeros, clients, info, state)
  assert float(metrics["N"]) == 0.0 and float(metrics["E"]) > 0
  tu.assert_trees_close(out, zeros, rtol=0, atol=0)
  tu.assert_trees_close(new_state.momentum, momentum, rtol=0, atol=0)
  assert float(metrics["norm_scale"]) == 0.0


def test_evaluate_broadcast_keeps_the_normalized_model():
  rng = np.random.default_rng(2)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 3)
  info = tu.make_info([0, 1, 2], [1.0, 2.0, 3.0])
  rule = aggregators.get("fednnnn", evaluate="broadcast")
  out, state, _ = jax.jit(rule.aggregate)(global_params, clients, info,
                                          rule.init(global_params))
  tu.assert_trees_close(aggregators.eval_params(state, out), out, rtol=0,
                        atol=0)


def test_bad_arguments_raise():
  for kwargs, word in ((dict(beta=-1.0), "beta"), (dict(gamma=-0.1), "gamma"),
                       (dict(evaluate="best"), "evaluate"),
                       (dict(weighting="size"), "weighting"),
                       (dict(granularity="block"), "granularity")):
    with pytest.raises(ValueError, match=word):
      aggregators.get("fednnnn", **kwargs)


def _bn_tree(rng, leading=()):
  return {"params": {"fc": {"kernel": rng.normal(size=leading + (3, 2)),
                            "bias": rng.normal(size=leading + (2,))}},
          "batch_stats": {"bn": {"mean": rng.normal(size=leading + (2,)),
                                 "var": rng.random(leading + (2,)) + 0.5}}}


@pytest.mark.parametrize("stream", [False, True])
def test_batch_norm_statistics_are_averaged_not_normalized(stream):
  rng = np.random.default_rng(0)
  to32 = lambda t: jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), t)
  g = to32(_bn_tree(rng))
  clients = to32(_bn_tree(rng, (4,)))
  info = tu.make_info(jnp.arange(4), jnp.array([3.0, 1.0, 2.0, 5.0]),
                      jnp.array([1.0, 1.0, 0.0, 1.0]))
  rule = aggregators.fednnnn(0.7, 0.8)
  params_only = aggregators.fednnnn(0.7, 0.8)
  state = rule.init(g)
  run = jax.jit(tu.streamed_aggregate if stream else
                (lambda r, *a: r.aggregate(*a)), static_argnums=0)
  for _ in range(2):  # the second round uses the momentum
    new, state_new, metrics = run(rule, g, clients, info, state)
    # Parameters: exactly FedNNNN on the params alone.
    want, want_state, want_metrics = run(
        params_only, {"params": g["params"]},
        {"params": clients["params"]}, info,
        params_only.init({"params": g["params"]})._replace(
            momentum={"params": state.momentum["params"]},
            eval_params={"params": state.eval_params["params"]}))
    np.testing.assert_allclose(metrics["N"], want_metrics["N"], rtol=1e-6)
    np.testing.assert_allclose(metrics["E"], want_metrics["E"], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                         atol=1e-6),
                 new["params"], want["params"])
    # Statistics: the plain weighted average, no momentum.
    p = np.array([3.0, 1.0, 0.0, 5.0]) / 9.0
    for name in ("mean", "var"):
      avg = np.tensordot(p, np.asarray(clients["batch_stats"]["bn"][name]),
                         1)
      np.testing.assert_allclose(new["batch_stats"]["bn"][name], avg,
                                 rtol=1e-5)
      np.testing.assert_array_equal(
          state_new.momentum["batch_stats"]["bn"][name], 0.0)
    g, state = new, state_new


def test_batch_norm_statistics_normalized_on_request():
  rng = np.random.default_rng(1)
  to32 = lambda t: jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), t)
  g, clients = to32(_bn_tree(rng)), to32(_bn_tree(rng, (3,)))
  info = tu.make_info(jnp.arange(3), jnp.ones(3))
  rule = aggregators.fednnnn(0.7, 0.0, statistics="normalize")
  new, _, metrics = jax.jit(rule.aggregate)(g, clients, info, rule.init(g))
  mean_delta = jax.tree.map(lambda c, w: np.mean(np.asarray(c), 0) - w,
                            clients, g)
  scale = float(metrics["norm_scale"])
  jax.tree.map(lambda n, w, d: np.testing.assert_allclose(
      n, w + scale * d, rtol=1e-5, atol=1e-6), new, g, mean_delta)
  with pytest.raises(ValueError, match="statistics"):
    aggregators.fednnnn(statistics="ignore")
