"""Attacks wrapped around a local update: the run's population, an inner
update's state and metrics, the malicious clients in the history.
"""

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import simulation
from fedjax_agg.types import LocalUpdate
from tests.attacks._util import _attacked
from tests.attacks._util import _run
from tests.attacks._util import BAD
from tests.attacks._util import QUIET
from tests.attacks._util import TRAINING
from tests.test_engine import tiny_data


def test_fixed_adversaries_must_be_drawn_for_the_runs_population(setup):
  # fixed(100, 0.25) on 8 clients would make the ids < 8 of the 25 drawn
  # among 100 malicious: a fraction that has nothing to do with 0.25.
  data, x, y, _ = tiny_data(sizes=(3,) * 8)
  model = setup[4]
  update = attacks.local_update(model, TRAINING, attacks.sign_flip(),
                                attacks.fixed(100, fraction=0.25),
                                execution=QUIET)
  message = (r"^num_clients: the fixed adversaries were drawn for "
             r"num_clients=100 but the run has num_clients=8")
  with pytest.raises(ValueError, match=message):
    update.init(8)
  with pytest.raises(ValueError, match=message):
    simulation.run(model, data, (x, y), aggregators.fedavg(), num_rounds=1,
                   participation=1.0, training=TRAINING, execution=QUIET,
                   local_update=update, seed=0)
  # Drawn for the population, it runs; per_round needs no population.
  assert attacks.local_update(model, TRAINING, attacks.sign_flip(),
                              attacks.fixed(8, fraction=0.25)).init(8) == ()
  assert attacks.local_update(model, TRAINING, attacks.sign_flip(),
                              attacks.per_round(0.25)).init(8) == ()


def test_stateful_inner_update_keeps_its_state(setup):
  """The inner update records each client's last round; the wrapper passes
  its state (init included) and its metrics through."""
  data, *_, trainer = setup

  def update(last_round, global_params, data, ids, mask, lrs, steps,
             round_num, key):
    rows = jnp.where(mask > 0, ids, last_round.shape[0])
    return (trainer(global_params, data, ids, lrs, steps, key),
            last_round.at[rows].set(round_num + 10, mode="drop"),
            {"inner_round": round_num})

  inner = LocalUpdate(lambda n: jnp.full((n,), -1, jnp.int32), update)
  wrapped = attacks.with_attack(attacks.sign_flip(),
                                attacks.fixed(data.num_clients, ids=BAD),
                                inner)
  state = wrapped.init(data.num_clients)
  assert np.asarray(state).tolist() == [-1] * 5
  _, state, metrics = _attacked(setup, attacks.sign_flip(), state=state,
                                update=inner)
  assert np.asarray(state).tolist() == [11] * 5
  assert int(metrics["inner_round"]) == 1 and "malicious" in metrics


def test_simulation_records_the_malicious_clients(setup):
  result = _run(setup, attacks.sign_flip(scale=2.0), BAD)
  assert len(result.history.client_rows) == 2
  for row in result.history.client_rows:
    np.testing.assert_array_equal(row["malicious"],
                                  np.isin(row["client_ids"], BAD))
  assert [row["num_malicious"] for row in result.history.rows[1:]] == [
      2.0, 2.0]
