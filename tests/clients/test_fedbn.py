"""FedBN: BatchNorm leaves kept per client, the rest averaged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import engine
from fedjax_agg import rounds
from fedjax_agg.config import LocalTraining
from tests.clients._util import bn_model
from tests.clients._util import close
from tests.clients._util import linear_model
from tests.clients._util import QUIET
from tests.clients._util import small_data


def _bn_leaves(tree):
  flat = {"/".join(str(k.key) for k in path): leaf
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  return ({p: v for p, v in flat.items() if clients.batch_norm_leaf(p)},
          {p: v for p, v in flat.items() if not clients.batch_norm_leaf(p)})


def test_fedbn_keeps_batch_norm_per_client_and_averages_the_rest():
  data, *_ = small_data()
  model = bn_model()
  training = LocalTraining(epochs=2, batch_size=3, learning_rate=0.1)
  update = clients.fedbn(model, training, clients_per_step=2)
  rule = aggregators.fedavg()
  round_fn = rounds.make_round_fn(model, rule, training, execution=QUIET,
                                  local_update=update)
  params = model.init(jax.random.key(0))
  state = rounds.init_state(params, rule, client_state=update.init(4))
  cohort, mask = jnp.array([0, 1, 2]), jnp.array([1.0, 1.0, 0.0])
  state, _ = round_fn(state, data, cohort, mask)
  cohort2 = jnp.array([0, 1, 3])
  start = update.personalize(state.client_state, state.params, cohort2)
  # Round 2 by hand: the local update from the clients' own BN leaves.
  train_key = jax.random.split(state.key, 4)[1]
  local, table, _ = update.update(
      state.client_state, state.params, data, cohort2, jnp.ones(3),
      jnp.full(3, 0.1), engine.full_steps(data, cohort2, 3, 2), 2,
      train_key)
  new, _ = round_fn(state, data, cohort2, jnp.ones(3))
  # Clients 0 and 1 start from their own BN leaves, client 3 (never
  # trained) from the server's copy.
  bn_start, _ = _bn_leaves(start)
  bn_global, _ = _bn_leaves(state.params)
  for path, leaf in bn_start.items():
    assert not np.allclose(leaf[0], leaf[1]), path
    np.testing.assert_array_equal(leaf[2], bn_global[path])
  # Non-BN leaves: FedAvg of the clients' trained models.
  weights = np.asarray(data.num_examples)[np.asarray(cohort2)]
  weights = weights / weights.sum()
  want = jax.tree.map(lambda a: jnp.tensordot(weights, a, 1),
                      local.client_params)
  _, got_rest = _bn_leaves(new.params)
  _, want_rest = _bn_leaves(want)
  close(got_rest, want_rest, atol=1e-5)
  # The table holds each client's own trained BN leaves.
  own = update.personalize(new.client_state, new.params, cohort2)
  close(_bn_leaves(own)[0], _bn_leaves(local.client_params)[0], atol=1e-6)
  np.testing.assert_array_equal(new.client_state.local.seen,
                                [True, True, False, True])
  del table


def test_fedbn_needs_a_batch_norm_leaf():
  with pytest.raises(ValueError, match="no local leaves"):
    clients.fedbn(linear_model())
