"""Rules built from what a run fixes (``run_context``): Python objects and a
JSON config give the same run, and the same refusals, for the settings a
rule takes from the run (q-FFL's client learning rate, FedNova's local
solver, FedDyn's federation size and client side)."""

import functools

import jax
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import data as data_lib
from fedjax_agg import experiment
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import run_context
from fedjax_agg import simulation
from fedjax_agg.config import (Evaluation, Execution, LocalTraining,
                               client_optimizer,
                               sgd_momentum)
from fedjax_agg.types import RunContext

NUM_CLIENTS, SEED, LR = 4, 2, 0.05


def _config(algorithm: dict, **train) -> dict:
  return {
      "dataset": {"name": "mnist", "source": "mnist_5k",
                  "max_train_examples": 800, "max_test_examples": 200},
      "partition": {"name": "iid", "num_clients": NUM_CLIENTS},
      "model": {"name": "mlp2", "args": {"hidden": 8}},
      "train": {"rounds": 2, "participation": 0.5, "batch_size": 50,
                "learning_rate": LR, "eval_clients": False, **train},
      "algorithms": {"A": algorithm}}


@functools.lru_cache(maxsize=None)
def _python_setting():
  dataset = data_lib.load("mnist", source="mnist_5k")
  x, y = dataset.train_x[:800], dataset.train_y[:800]
  parts = partitions.REGISTRY.build("iid", labels=y,
                                    num_clients=NUM_CLIENTS, seed=SEED)
  data = federated.from_partition(x, y, parts)
  model = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1),
                     hidden=8)
  return model, data, (dataset.test_x[:200], dataset.test_y[:200])


def _python_run(aggregator, training=None, local_update=None):
  model, data, test = _python_setting()
  training = training or LocalTraining(batch_size=50, learning_rate=LR)
  if callable(local_update):
    local_update = local_update(model, training)
  return simulation.run(
      model, data, test, aggregator, num_rounds=2, participation=0.5,
      training=training, execution=Execution(progress=False),
      evaluation=Evaluation(clients=False), local_update=local_update,
      seed=SEED).history


def _assert_same(got, want):
  for column in ("test_accuracy", "test_loss", "train_loss"):
    np.testing.assert_allclose(got.column(column), want.column(column),
                               rtol=2e-6, err_msg=column)


def _config_run(algorithm, **train):
  return experiment.run_algorithm(_config(algorithm, **train), "A",
                                  SEED).history


def test_qffl_takes_the_client_learning_rate_from_the_run():
  left_out = _python_run(aggregators.qffl(q=1.0))
  _assert_same(left_out, _python_run(aggregators.qffl(q=1.0,
                                                      learning_rate=LR)))
  _assert_same(left_out, _config_run({"aggregator": "qffl",
                                      "aggregator_args": {"q": 1.0}}))
  # The rule's L = 1 / eta is the run's: another eta is refused, by name.
  with pytest.raises(ValueError, match=r"qffl: learning_rate=0.1 differs "
                     r"from the client learning rate of the run \(0.05\)"):
    _python_run(aggregators.qffl(q=1.0, learning_rate=0.1))


def test_fednova_normalises_by_the_runs_momentum_and_proximal_term():
  momentum = LocalTraining(batch_size=50, learning_rate=LR,
                           optimizer=client_optimizer("sgd", momentum=0.9))
  want = _python_run(aggregators.fednova(momentum=0.9), momentum)
  _assert_same(_python_run(aggregators.fednova(), momentum), want)
  _assert_same(_config_run({"aggregator": "fednova"}, momentum=0.9), want)
  # Without the momentum FedNova would normalise as for plain SGD.
  assert not np.allclose(
      _python_run(aggregators.fednova(momentum=0.0),
                  LocalTraining(batch_size=50, learning_rate=LR,
                                optimizer=optax.sgd)).column("test_loss"),
      want.column("test_loss"))
  prox = LocalTraining(batch_size=50, learning_rate=LR,
                       objective=objectives.fedprox(0.5))
  _assert_same(_config_run({"aggregator": "fednova", "objective": "fedprox",
                            "objective_args": {"mu": 0.5}}),
               _python_run(aggregators.fednova(), prox))
  with pytest.raises(ValueError, match="fednova: momentum=0.0 differs from "
                     "the local SGD momentum of the run"):
    _python_run(aggregators.fednova(momentum=0.0), momentum)
  with pytest.raises(ValueError, match="fednova: the clients' optimizer is "
                     "not SGD"):
    _python_run(aggregators.fednova(), LocalTraining(
        batch_size=50, learning_rate=LR, optimizer=optax.adam))
  with pytest.raises(ValueError, match="fednova: the clients' optimizer is "
                     "not SGD"):
    _config_run({"aggregator": "fednova"}, optimizer="adam")
  with pytest.raises(ValueError, match="fednova: the clients' local "
                     "objective is neither"):
    _config_run({"aggregator": "fednova", "objective": "fedlap"})


def test_feddyn_is_sized_and_paired_by_the_run():
  pair = lambda alpha: functools.partial(clients.feddyn, alpha=alpha)
  want = _python_run(aggregators.feddyn(0.01, num_clients=NUM_CLIENTS),
                     local_update=pair(0.01))
  _assert_same(_config_run({"aggregator": "feddyn", "client": "feddyn",
                            "aggregator_args": {"alpha": 0.01},
                            "client_args": {"alpha": 0.01}}), want)
  with pytest.raises(ValueError, match="feddyn: alpha=0.5 differs from the "
                     "client side's feddyn_alpha of the run"):
    _python_run(aggregators.feddyn(0.5, num_clients=NUM_CLIENTS),
                local_update=pair(0.01))
  with pytest.raises(ValueError, match="feddyn: num_clients=400 differs "
                     "from the federation's number of clients"):
    _python_run(aggregators.feddyn(0.01, num_clients=400),
                local_update=pair(0.01))
  with pytest.raises(ValueError, match="which this aggregator does not "
                     "read"):
    _python_run(aggregators.fedavg(), local_update=pair(0.01))


def test_fednova_tau_eff_from_a_config():
  """FedNova's ``tau_eff`` ("steps": the authors' code's tau_eff with a
  proximal term) reaches the rule from a config's aggregator_args as from
  Python, changes the run, and a misspelt value is refused by name."""
  prox = LocalTraining(batch_size=50, learning_rate=LR,
                       objective=objectives.fedprox(0.5))
  want = _python_run(aggregators.fednova(tau_eff="steps"), prox)
  _assert_same(_config_run({"aggregator": "fednova", "objective": "fedprox",
                            "objective_args": {"mu": 0.5},
                            "aggregator_args": {"tau_eff": "steps"}}), want)
  assert not np.allclose(
      _python_run(aggregators.fednova(), prox).column("test_loss"),
      want.column("test_loss"), rtol=1e-5)
  with pytest.raises(ValueError, match="tau_eff must be one of"):
    _config_run({"aggregator": "fednova",
                 "aggregator_args": {"tau_eff": "step"}})


def _context(**fields):
  base = dict(num_clients=10, cohort_size=5, expected_clients=None,
              learning_rate=0.1, momentum=0.0, proximal_mu=0.0,
              client_side={})
  return RunContext(**{**base, **fields})


def test_bind_fills_what_the_caller_left_out_and_keeps_the_rest():
  rule = aggregators.bulyan(1)
  bound = run_context.bind(rule, _context(cohort_size=7))
  # Built again with the cohort: Bulyan refuses a cohort too small for f.
  with pytest.raises(ValueError, match="num_participants"):
    run_context.bind(aggregators.bulyan(2), _context(cohort_size=7))
  assert bound.from_run is not None
  # A rule that needs nothing of the run is returned as it is.
  fedavg = aggregators.fedavg()
  assert run_context.bind(fedavg, _context()) is fedavg
  # Wrapped in a server optimizer, the inner rule is still bound.
  wrapped = aggregators.with_server_optimizer(aggregators.qffl(q=1.0),
                                              optax.sgd(1.0))
  with pytest.raises(ValueError, match="learning_rate"):
    run_context.bind(wrapped._replace(
        from_run=aggregators.with_server_optimizer(
            aggregators.qffl(q=1.0, learning_rate=0.3),
            optax.sgd(1.0)).from_run), _context())


def test_the_sgd_momentum_of_an_optimizer():
  assert sgd_momentum(client_optimizer("sgd", momentum=0.9)) == 0.9
  assert sgd_momentum(client_optimizer("sgd")) == 0.0
  assert sgd_momentum(client_optimizer("adam")) is None
  assert sgd_momentum(optax.sgd) == 0.0
  assert sgd_momentum(functools.partial(optax.sgd, momentum=0.5)) == 0.5
  assert sgd_momentum(functools.partial(optax.sgd, momentum=0.5,
                                        nesterov=True)) is None
  assert sgd_momentum(optax.adam) is None
  assert sgd_momentum(lambda learning_rate: optax.sgd(learning_rate)) is None


def test_unknown_run_settings_are_refused_when_declared():
  with pytest.raises(ValueError, match="unknown run setting 'lr'"):
    run_context.derived_from_run(learning_rate="lr")


def test_a_rule_left_without_a_required_run_setting_is_built_by_the_run():
  model, data, _ = _python_setting()
  filled = _python_run(aggregators.fedadp(alpha=1.0))
  _assert_same(filled, _python_run(aggregators.fedadp(
      num_clients=data.num_clients, alpha=1.0)))
  rule = aggregators.fedadp(alpha=1.0)
  with pytest.raises(ValueError, match="fedadp: num_clients not given"):
    rule.init(model.init(jax.random.key(0)))
  with pytest.raises(TypeError):
    aggregators.fedadp(alpah=1.0)
