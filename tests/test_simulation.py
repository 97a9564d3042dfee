"""``simulation.run``: reproducible histories, one round over a population
of 100,000 clients, three rounds on the real Fashion-MNIST.
"""

import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import partitions
from fedjax_agg import simulation
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model


def _run(seed, rounds=3):
  data, x, y, _ = tiny_data()
  return simulation.run(tiny_model(), data, (x, y), aggregators.fedavg(),
      num_rounds=rounds, participation=0.6, seed=seed,
      training=LocalTraining(epochs=1, batch_size=3, learning_rate=0.2),
      execution=Execution(clients_per_step=2, progress=False))


def test_same_seed_same_history_different_seed_differs(tmp_path):
  first, second, other = _run(0), _run(0), _run(1)
  strip = lambda rows: [{k: v for k, v in r.items() if k != "time_s"}
                        for r in rows]
  assert strip(first.history.rows) == strip(second.history.rows)
  assert strip(first.history.rows) != strip(other.history.rows)
  cohorts = [tuple(r["client_ids"]) for r in first.history.client_rows]
  other_cohorts = [tuple(r["client_ids"]) for r in other.history.client_rows]
  assert cohorts != other_cohorts
  assert all(len(c) == 3 and len(set(c)) == 3 for c in cohorts)  # 0.6 * 5
  paths = first.history.save(str(tmp_path))
  frame = first.history.to_dataframe()
  assert len(frame) == 4 and frame["round"].tolist() == [0, 1, 2, 3]
  assert open(paths["csv"]).readline().startswith("round,")
  # Training on this easy problem lowers the clients' loss.
  assert frame["client_loss_mean"].iloc[-1] < frame["client_loss_mean"].iloc[0]


def test_one_round_over_a_population_of_100k_clients():
  num_clients, cohort = 100_000, 100
  rng = np.random.default_rng(0)
  sizes = rng.integers(1, 4, size=num_clients)  # 1-3 examples each
  owner = np.repeat(np.arange(num_clients), sizes)
  rng.shuffle(owner)
  x = rng.normal(size=(owner.size, 5)).astype(np.float32)
  y = rng.integers(0, 3, size=owner.size)
  data = federated.from_assignment(x, y, owner, num_clients)
  assert data.num_clients == num_clients and data.max_examples == 3
  np.testing.assert_array_equal(data.num_examples, sizes)
  result = simulation.run(tiny_model(), data, (x[:64], y[:64]),
      aggregators.get("fedadp", num_clients=num_clients), num_rounds=1,
      participation=cohort / num_clients,
      training=LocalTraining(batch_size=2, learning_rate=0.1),
      execution=Execution(progress=False), evaluation=Evaluation(clients=False))
  ids = result.history.client_rows[0]["client_ids"]
  assert len(set(ids.tolist())) == cohort
  assert result.history.config["cohort_size"] == cohort
  steps = result.history.client_rows[0]["steps_taken"]
  np.testing.assert_array_equal(steps, -(-sizes[ids] // 2))
  # FedAdp's per-client state moved exactly for the sampled clients.
  seen = np.asarray(result.state.aggregator_state.times_seen)
  assert seen.shape == (num_clients,)
  np.testing.assert_array_equal(np.flatnonzero(seen), np.sort(ids))


def test_three_cnn_rounds_improve_accuracy(fashion):
  labels = fashion.train_y[:3000]
  parts = partitions.iid(labels, num_clients=10, seed=0,
                         samples_per_client=150)
  data = federated.from_partition(fashion.train_x[:3000], labels, parts)
  model = models.get("cnn_fednnnn_mnist", num_classes=10)
  result = simulation.run(model, data,
      (fashion.test_x[:2000], fashion.test_y[:2000]), aggregators.fedavg(),
      num_rounds=3, participation=0.5, seed=0,
      training=LocalTraining(epochs=1, batch_size=16, learning_rate=0.05),
      execution=Execution(progress=False),
      evaluation=Evaluation(clients=True))
  accuracy = result.history.column("test_accuracy")
  assert accuracy[0] < 0.25  # an untrained 10-class model
  assert accuracy[-1] > accuracy[0] + 0.3, accuracy
  assert np.all(np.isfinite(result.history.column("client_loss_var")))
