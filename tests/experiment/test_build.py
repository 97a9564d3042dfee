"""One algorithm built from a config: a client side is the run with that
local update.
"""

import numpy as np

from fedjax_agg import data as data_lib
from fedjax_agg import experiment


def test_a_config_client_side_is_the_run_with_that_local_update():
  """A config naming a client side (Ditto, with personalised evaluation on
  a held-out split) runs what simulation.run does with that client built
  by hand on the same split."""
  from fedjax_agg import clients  # pylint: disable=g-import-not-at-top
  from fedjax_agg import federated  # pylint: disable=g-import-not-at-top
  from fedjax_agg import models  # pylint: disable=g-import-not-at-top
  from fedjax_agg import partitions  # pylint: disable=g-import-not-at-top
  from fedjax_agg import aggregators  # pylint: disable=g-import-not-at-top
  from fedjax_agg import simulation  # pylint: disable=g-import-not-at-top
  from fedjax_agg import validation  # pylint: disable=g-import-not-at-top
  from fedjax_agg.config import (  # pylint: disable=g-import-not-at-top
      Evaluation, Execution, LocalTraining)
  config = {
      "dataset": {"name": "mnist", "source": "mnist_5k"},
      "partition": {"name": "dirichlet", "num_clients": 4,
                    "args": {"alpha": 0.5}, "holdout_fraction": 0.25},
      "model": {"name": "mlp2", "args": {"hidden": 8}},
      "train": {"rounds": 2, "participation": 0.5, "batch_size": 50,
                "learning_rate": 0.1, "personalized": True,
                "finetune_steps": 1},
      "algorithms": {"Ditto": {"aggregator": "fedavg", "client": "ditto",
                               "client_args": {"lam": 0.5}}}}
  seed = 3
  got = experiment.run_algorithm(config, "Ditto", seed).history
  dataset = data_lib.load("mnist", source="mnist_5k")
  parts = partitions.REGISTRY.build(
      "dirichlet", labels=dataset.train_y, num_clients=4, seed=seed,
      alpha=0.5)
  full = federated.from_partition(dataset.train_x, dataset.train_y, parts)
  train, held = validation.holdout_split(full, 0.25, seed=seed)
  model = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1),
                     hidden=8)
  training = LocalTraining(batch_size=50, learning_rate=0.1)
  want = simulation.run(
      model, train.with_validation(held), (dataset.test_x, dataset.test_y),
      aggregators.fedavg(), num_rounds=2, participation=0.5,
      training=training, execution=Execution(progress=False),
      evaluation=Evaluation(personalized=True, finetune_steps=1),
      local_update=clients.ditto(model, training, lam=0.5),
      seed=seed).history
  for column in ("test_accuracy", "test_loss", "personal_accuracy_mean",
                 "finetuned_accuracy_mean", "global_accuracy_mean"):
    np.testing.assert_allclose(got.column(column), want.column(column),
                               rtol=1e-5, err_msg=column)
  assert got.config["train.personalized"] is True


def test_stragglers_are_drawn_in_the_configs_unit():
  """train.straggler_unit reaches the run's step budgets: "steps" draws
  each straggler's steps, "epochs" whole epochs of them."""
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_agg import stragglers  # pylint: disable=g-import-not-at-top
  config = {
      "name": "units", "dataset": {"name": "mnist", "source": "mnist_5k",
                                   "max_train_examples": 200},
      "partition": {"name": "iid", "num_clients": 4},
      "model": {"name": "mlp2", "args": {"hidden": 8}},
      "train": {"rounds": 1, "local_epochs": 3, "stragglers": 1.0},
      "algorithms": {"FedAvg": {"aggregator": "fedavg"}}, "seeds": [0]}
  prepared = experiment.prepare_data(config, 0)
  full = jax.numpy.full((4,), 30)
  key = jax.random.key(3)
  for unit in stragglers.UNITS:
    built = experiment.build(experiment.override(
        config, {"train.straggler_unit": unit}), "FedAvg", prepared)
    got = built.options.training.steps_fn(key, full)
    np.testing.assert_array_equal(
        got, stragglers.straggler_steps(key, full, 1.0, 3, unit))
  by_epochs = experiment.build(config, "FedAvg", prepared)
  assert set(np.asarray(by_epochs.options.training.steps_fn(
      key, full)).tolist()) <= {10, 20}  # whole epochs of 10 steps, x < 3
