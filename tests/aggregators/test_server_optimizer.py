"""A server optimizer over any rule: SGD(1) gives back the base rule, and
the step follows the base's output, not FedAvg's.
"""

import jax
import numpy as np
import optax

from fedjax_agg import aggregators
from tests import agg_testutil as tu


def test_sgd_one_wrapper_returns_the_base_rule():
  rng = np.random.default_rng(4)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 3)
  info = tu.make_info([0, 1, 2], [3.0, 1.0, 2.0])
  for base in (aggregators.fedavg(), aggregators.fednnnn()):
    wrapped = aggregators.with_server_optimizer(base, optax.sgd(1.0))
    out, state, metrics = jax.jit(wrapped.aggregate)(
        global_params, clients, info, wrapped.init(global_params))
    base_out, base_state, _ = jax.jit(base.aggregate)(
        global_params, clients, info, base.init(global_params))
    tu.assert_trees_close(out, base_out, atol=1e-6)
    tu.assert_trees_close(state.base_state, base_state, atol=1e-6)
    tu.assert_trees_close(aggregators.eval_params(state, out),
                          aggregators.eval_params(base_state, base_out),
                          atol=1e-6)
    assert "pseudo_gradient_norm" in metrics


def test_wrapper_feeds_the_base_output_not_fedavg():
  # A median base: one huge outlier moves FedAvg, not the wrapped median.
  rng = np.random.default_rng(5)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 5)
  clients = jax.tree.map(lambda c: c.at[0].set(1e4), clients)
  info = tu.make_info(np.arange(5), np.ones(5))
  rule = aggregators.fedavgm(0.5, momentum=0.0,
                             base=aggregators.fedmedian())
  out, _, _ = jax.jit(rule.aggregate)(global_params, clients, info,
                                      rule.init(global_params))
  median = jax.tree.map(lambda c: np.median(np.asarray(c), axis=0), clients)
  expected = jax.tree.map(lambda w, m: w + 0.5 * (m - w), global_params,
                          median)
  tu.assert_trees_close(out, expected, atol=1e-5)
