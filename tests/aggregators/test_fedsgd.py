"""FedSGD (McMahan et al., AISTATS 2017) as a rule and a local training."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import rounds
from fedjax_agg import simulation
from fedjax_agg.config import Evaluation, Execution
from tests import agg_testutil as tu
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model


def test_fedsgd_round_is_one_gradient_step_on_the_cohorts_data():
  """FedSGD (McMahan et al. 2017): a round is w - eta grad of the mean
  loss over the union of the cohort's examples, computed here directly
  with jax.grad over the concatenated data."""
  model = tiny_model()
  data, x, y, parts = tiny_data(sizes=(9, 4, 15, 6, 11))
  fedsgd = aggregators.fedsgd(data.num_examples, learning_rate=0.7)
  assert fedsgd.training.batch_size == 15
  params = model.init(jax.random.key(0))
  state = rounds.init_state(params, fedsgd.aggregator, seed=1)
  cohort = jnp.array([0, 2, 3, 1], jnp.int32)
  mask = jnp.array([1.0, 1.0, 0.0, 1.0])
  round_fn = rounds.make_round_fn(model, fedsgd.aggregator, fedsgd.training)
  new_state, out = round_fn(state, data, cohort, mask)
  np.testing.assert_array_equal(np.asarray(out.steps_taken), [1, 1, 0, 1])
  rows = np.concatenate([parts[i] for i in (0, 2, 1)])

  def mean_loss(p):
    logits, _ = model.apply(p, jnp.asarray(x[rows]), True)
    return jnp.mean(model.loss(logits, jnp.asarray(y[rows])))
  # The reference's products at full precision, as the round's (a GPU would
  # use TF32 for them by default).
  with jax.default_matmul_precision("highest"):
    grads = jax.jit(jax.grad(mean_loss))(params)
  expected = jax.tree.map(lambda p, g: p - 0.7 * g, params, grads)
  tu.assert_trees_close(new_state.params, expected, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="learning_rate"):
    aggregators.fedsgd(data.num_examples, learning_rate=0.0)
  with pytest.raises(ValueError, match="num_examples"):
    aggregators.fedsgd([0, 0])


@pytest.mark.parametrize("sizes", [[float("nan"), 50], [float("inf")],
                                   [49.5], 49.5, [0, 3], -1, [],
                                   [[4, 5]], ["50"], [True]])
def test_fedsgd_refuses_what_is_not_client_sizes(sizes):
  """NaN, infinite, fractional, non-positive or non-numeric sizes are
  refused by name (not a conversion error, not a truncated batch)."""
  with pytest.raises(ValueError, match="^num_examples"):
    aggregators.fedsgd(sizes)


def _run(fedsgd, data, x, y):
  return simulation.run(
      tiny_model(), data, (x, y), fedsgd.aggregator, num_rounds=1,
      participation=0.6, training=fedsgd.training,
      execution=Execution(progress=False),
      evaluation=Evaluation(clients=False), seed=0)


def test_a_run_refuses_a_batch_smaller_than_its_largest_client():
  """fedsgd(10) on a federation whose largest client holds 15 examples
  would run two local steps on that client, which is not FedSGD: the run
  refuses it by name before training; built from data.num_examples, the
  same run goes ahead."""
  data, x, y, _ = tiny_data(sizes=(9, 4, 15, 6, 11))
  with pytest.raises(ValueError, match=r"^num_examples: .*batch_size=10 "
                     r"is below its largest client's 15 examples"):
    _run(aggregators.fedsgd(10), data, x, y)
  history = _run(aggregators.fedsgd(data.num_examples), data, x, y).history
  assert len(history.rows) == 2
