"""The typed experiment spec: the one place each key, default and flag is
stated; the CLI flags and the JSON keys map onto its fields."""

import dataclasses
import glob
import json
import os

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import jax
import numpy as np
import pytest

from fedjax_agg import cli
from fedjax_agg import experiment
from fedjax_agg import spec
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.experiment import _runs
from fedjax_agg.options import RunOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ADCT's script reads train keys of its own (its client optimizer and
# validation split), outside the spec: its configs are not experiment
# specs yet.
COMMITTED = sorted(
    path for path in glob.glob(os.path.join(ROOT, "experiments", "*",
                                            "configs", "*.json"))
    if os.sep + "adct" + os.sep not in path)


def _parser_flags() -> set[str]:
  parser = cli.build_parser()
  return {option for action in parser._actions  # pylint: disable=protected-access
          for option in action.option_strings if option.startswith("--")}


def test_every_cli_flag_is_a_spec_field_or_a_run_option():
  spec_flags = {flag.name for _, flag in spec.flags()}
  run_flags = set(cli.RUN_FLAGS)
  assert not spec_flags & run_flags
  assert _parser_flags() - {"--help"} == spec_flags | run_flags


def test_every_config_flag_sets_an_existing_spec_key():
  for key, flag in spec.flags():
    parts = key.replace("algorithms.{algorithm}", "algorithms").split(".")
    section = parts[0]
    if section in spec.SECTIONS:
      assert parts[1] in spec.keys(spec.SECTIONS[section]), (flag, key)
    else:
      assert section in spec.keys(spec.Experiment), (flag, key)
    assert cli.CONFIG_KEYS[flag.name[2:].replace("-", "_")] == key


@pytest.mark.parametrize("build,path", [
    (lambda: spec.TrainSpec(rounds=-1), "train.rounds"),
    (lambda: spec.TrainSpec(momentum=1.0), "train.momentum"),
    (lambda: spec.DataSpec("mnist", source="mnist_5k",
                           allow_subset=False), "dataset.allow_subset"),
    (lambda: spec.PartitionSpec("dirichlet", 4, args={"alfa": 0.3}),
     "partition.args.alfa"),
    (lambda: spec.PartitionSpec("iid", 0), "partition.num_clients"),
    (lambda: spec.ModelSpec("mlp2", args={"hiden": 8}), "model.args.hiden"),
    (lambda: spec.AlgorithmSpec("fedadp", aggregator_args={"alfa": 1.0}),
     "algorithm.aggregator_args.alfa"),
    (lambda: spec.AlgorithmSpec("fedavg", train={"rounds": "3"}),
     "algorithm.train.rounds"),
    (lambda: spec.AttackSpec("sign_flip", fraction=1.0), "attack.fraction"),
    (lambda: spec.PrivacySpec(delta=2.0), "privacy.delta"),
    (lambda: spec.SystemsSpec(secagg_bits=40), "systems.secagg_bits"),
    (lambda: spec.EarlyStoppingSpec(patience=0), "early_stopping.patience"),
])
def test_each_section_checks_its_values_when_it_is_built(build, path):
  # The one check of a value is its section's, whatever builds it.
  with pytest.raises(spec.ConfigError) as raised:
    build()
  assert raised.value.path.startswith(path), raised.value.path


def test_cli_presets_differ_from_the_spec_only_where_documented():
  # The command line starts a quick run: a dataset, partition, model and
  # rule named, 10 % participation at lr 0.05. Any other preset must be
  # the spec's default (a new disagreement fails here).
  differ = set()
  for key, flag in spec.flags():
    if flag.preset is None or flag.kind != "value":
      continue
    section, _, name = key.replace("algorithms.{algorithm}",
                                   "algorithms").partition(".")
    cls = spec.SECTIONS[section]
    default = spec.defaults(cls).get(name, dataclasses.MISSING)
    if default != flag.preset:
      differ.add(key)
  assert differ == {"dataset.name", "partition.name",
                    "partition.num_clients", "model.name",
                    "algorithms.{algorithm}.aggregator",
                    "train.participation", "train.learning_rate"}


@pytest.mark.parametrize("path", COMMITTED,
                         ids=[os.path.relpath(p, ROOT) for p in COMMITTED])
def test_committed_configs_are_specs_and_round_trip(path):
  config = experiment.load_config(path)  # no key given twice
  for key in config:
    assert key in spec.keys(spec.Experiment) + spec.SCRIPT_KEYS, key
  for section, cls in spec.SECTIONS.items():
    if section == "algorithms" or not isinstance(config.get(section), dict):
      continue
    assert set(config[section]) <= set(spec.keys(cls)), section
  for entry in config["algorithms"].values():
    assert set(entry) <= set(spec.keys(spec.AlgorithmSpec)
                             + spec.SCRIPT_ALGORITHM_KEYS)
  built = spec.Experiment.from_dict(config)
  # The scripts' own keys are theirs: the spec leaves them out.
  plain = {k: v for k, v in config.items() if k not in spec.SCRIPT_KEYS}
  plain["algorithms"] = {
      name: {k: v for k, v in entry.items()
             if k not in spec.SCRIPT_ALGORITHM_KEYS}
      for name, entry in config["algorithms"].items()}
  assert built == spec.Experiment.from_dict(plain)
  # Written out, the description is complete: read again, it is the same.
  assert spec.Experiment.from_dict(built.to_dict()).to_dict() == (
      built.to_dict())
  # The serialised spec builds the same spec again.
  assert spec.Experiment.from_dict(built.to_dict(written_out=False)) == built


def _python_experiment(**train):
  return spec.Experiment(
      dataset=spec.DataSpec("mnist", source="mnist_5k"),
      partition=spec.PartitionSpec("dirichlet", 8, args={"alpha": 0.3}),
      model=spec.ModelSpec("mlp2"),
      train=spec.TrainSpec(**train),
      algorithms={"FedAdp": spec.AlgorithmSpec(
          "fedadp", aggregator_args={"alpha": 2.0})},
      seeds=[0, 1])


def test_python_and_json_build_the_same_experiment():
  from_python = _python_experiment(rounds=3, learning_rate=0.1)
  from_json = spec.Experiment.from_dict({
      "dataset": {"name": "mnist", "source": "mnist_5k"},
      "partition": {"name": "dirichlet", "num_clients": 8,
                    "args": {"alpha": 0.3}},
      "model": {"name": "mlp2"},
      "train": {"rounds": 3, "learning_rate": 0.1},
      "algorithms": {"FedAdp": {"aggregator": "fedadp",
                                "aggregator_args": {"alpha": 2.0}}},
      "seeds": [0, 1]})
  assert from_python == from_json
  assert from_python.to_dict() == from_json.to_dict()
  assert from_python.train.local_epochs == 1  # the one default


@pytest.mark.parametrize("train,path", [
    ({"rounds": -1}, "train.rounds"),
    ({"learning_rate": float("nan")}, "train.learning_rate"),
    ({"batch_size": 2.0}, "train.batch_size"),
    ({"optimizer": "rmsprop"}, "train.optimizer"),
])
def test_python_specs_are_checked_naming_the_key(train, path):
  with pytest.raises(spec.ConfigError) as raised:
    _python_experiment(**train)
  assert raised.value.path == path


def test_unknown_and_missing_section_keys_are_named():
  with pytest.raises(spec.ConfigError) as raised:
    spec.Experiment(dataset={"name": "mnist", "sorce": "files"},
                    partition={"name": "iid", "num_clients": 2},
                    model={"name": "mlp2"},
                    algorithms={"A": {"aggregator": "fedavg"}})
  assert raised.value.path == "dataset.sorce"
  with pytest.raises(spec.ConfigError) as raised:
    spec.Experiment(dataset={"name": "mnist"}, partition={"name": "iid"},
                    model={"name": "mlp2"},
                    algorithms={"A": {"aggregator": "fedavg"}})
  assert raised.value.path == "partition.num_clients"


def test_run_config_takes_a_spec(tmp_path, monkeypatch):
  seen = {}

  def check_output_dir(path, names=()):
    seen["names"] = list(names)
    raise RuntimeError("stop before the data")

  # run_config looks the name up in its own submodule.
  monkeypatch.setattr(_runs, "check_output_dir", check_output_dir)
  with pytest.raises(RuntimeError, match="stop before"):
    experiment.run_config(_python_experiment(rounds=1), str(tmp_path))
  assert "seed1/history.csv" in seen["names"]  # one algorithm: at the top


@pytest.mark.parametrize("config", [[1, 2], "config.json", None])
def test_from_dict_refuses_what_is_not_a_mapping(config):
  with pytest.raises(spec.ConfigTypeError):
    spec.Experiment.from_dict(config)


def test_algorithms_must_be_a_mapping():
  with pytest.raises(spec.ConfigTypeError, match="algorithms"):
    spec.Experiment(dataset={"name": "mnist"},
                    partition={"name": "iid", "num_clients": 2},
                    model={"name": "mlp2"},
                    algorithms=[spec.AlgorithmSpec("fedavg")])


# A valid value other than the default for every "train" key.
_OTHER_TRAIN_VALUES = {
    "rounds": 3, "participation": 0.5, "local_epochs": 2, "batch_size": 8,
    "learning_rate": 0.2, "momentum": 0.9, "stragglers": 0.5,
    "straggler_unit": "steps", "eval_every": 2, "eval_clients": False,
    "clients_per_step": 4, "compute_losses": True,
    "matmul_precision": "default", "devices": 1, "optimizer": "adam",
    "weight_decay": 0.1, "personalized": True, "finetune_steps": 3}


def test_every_train_key_is_a_declared_field_of_a_run_object():
  """Each "train" key is a field declared on one of ``TRAIN_OBJECTS`` with
  the same default (a run described in Python and one in a config start
  alike), its flags and its check: the key is declared once."""
  assert {RunOptions, LocalTraining, Execution, Evaluation} <= set(
      spec.TRAIN_OBJECTS)
  for f in dataclasses.fields(spec.TrainSpec):
    cls, name = f.metadata["object"], f.metadata["field"]
    fields = {g.name: g for g in dataclasses.fields(cls)}
    assert name in fields, f"train.{f.name} sets unknown {name}"
    assert fields[name].metadata["flags"] == f.metadata["flags"]
    assert fields[name].metadata["check"] is f.metadata["check"]
    if f.name != "rounds":  # RunOptions.num_rounds has no default
      assert fields[name].default == f.default, f.name
  assert spec.TrainSpec().rounds == 10


def _run_objects(train):
  """The keyword arguments each run object is made with from ``train``."""
  training = train.training()
  return {"options": train.arguments(RunOptions),
          "training": {f.name: getattr(training, f.name)
                       for f in dataclasses.fields(training)},
          "execution": train.arguments(Execution),
          "evaluation": train.arguments(Evaluation)}


def _described(objects):
  """``_run_objects``' output with its functions replaced by what they
  compute: the optimizer's first two updates of a small tree, the
  stragglers' steps for a few keys."""
  out = {target: dict(kwargs) for target, kwargs in objects.items()}
  training = out["training"]
  optimizer = training["optimizer"](0.1)
  params = {"w": np.array([1.0, -2.0], np.float32)}
  grads = {"w": np.array([0.5, 0.25], np.float32)}
  state, steps = optimizer.init(params), []
  for _ in range(2):
    updates, state = optimizer.update(grads, state, params)
    steps.append(tuple(np.asarray(updates["w"]).tolist()))
  training["optimizer"] = tuple(steps)
  if training["steps_fn"] is not None:
    keys = jax.random.split(jax.random.key(0), 8)
    training["steps_fn"] = tuple(
        np.asarray(training["steps_fn"](key, np.full((16,), 12))).tolist()
        for key in keys)
  return out


def test_no_train_key_is_ignored_by_the_run_objects():
  """Changing any "train" key changes the run objects it makes: a key
  that reached no run object would be accepted and silently ignored."""
  assert set(_OTHER_TRAIN_VALUES) == set(spec.keys(spec.TrainSpec))
  for key, value in _OTHER_TRAIN_VALUES.items():
    # The straggler unit is read with stragglers only.
    start = {"stragglers": 0.5} if key == "straggler_unit" else {}
    base = _run_objects(spec.TrainSpec(**start))
    changed = _run_objects(spec.TrainSpec(**start, **{key: value}))
    assert _described(changed) != _described(base), key
  # And the description compares equal where nothing changed.
  assert (_described(_run_objects(spec.TrainSpec(stragglers=0.5)))
          == _described(_run_objects(spec.TrainSpec(stragglers=0.5))))


def test_run_objects_is_deprecated_and_builds_the_same():
  train = spec.TrainSpec(stragglers=0.5, momentum=0.9)
  with pytest.warns(DeprecationWarning, match="run_objects"):
    objects = train.run_objects()
  assert set(objects) == set(spec.RUN_OBJECTS)
  described, expected = _described(objects), _described(_run_objects(train))
  for part in ("options", "execution", "evaluation"):
    assert described[part] == expected[part]
  for key, value in described["training"].items():
    assert value == expected["training"][key], key


# Every section with its required arguments, built with one field set.
_SECTION_BASES = {
    spec.TrainSpec: {}, spec.DataSpec: {"name": "mnist",
                                        "source": "mnist_5k"},
    spec.PartitionSpec: {"name": "dirichlet", "num_clients": 8,
                         "args": {"alpha": 0.3}},
    spec.ModelSpec: {"name": "mlp2"},
    spec.AlgorithmSpec: {"aggregator": "fedadp"},
    spec.AttackSpec: {"name": "sign_flip"}, spec.PrivacySpec: {},
    spec.SystemsSpec: {}, spec.EarlyStoppingSpec: {}}


def _section_case(cls, name):
  return lambda value: cls(**{**_SECTION_BASES[cls], name: value})


def _experiment(**fields):
  fields.setdefault("algorithms", {"FedAdp": spec.AlgorithmSpec("fedadp")})
  return spec.Experiment(
      dataset=spec.DataSpec("mnist", source="mnist_5k"),
      partition=spec.PartitionSpec("iid", 8), model=spec.ModelSpec("mlp2"),
      **fields)


# Value -> a spec holding it: every field of every section, the
# experiment's own, and entries below a field (a list's item, a mapping's
# value).
_NUMPY_CASES = {
    **{f"{cls.__name__}.{f.name}": _section_case(cls, f.name)
       for cls in _SECTION_BASES for f in dataclasses.fields(cls)},
    "seeds[0]": lambda value: _experiment(seeds=[value]),
    "target_accuracy": lambda value: _experiment(target_accuracy=value),
    "vmap_seeds": lambda value: _experiment(vmap_seeds=value),
    "train.rounds (experiment)": lambda value: _experiment(
        train={"rounds": value}),
    "partition.args.alpha": lambda value: spec.PartitionSpec(
        "dirichlet", 8, args={"alpha": value}),
    "aggregator_args.alpha": lambda value: _experiment(algorithms={
        "FedAdp": spec.AlgorithmSpec("fedadp",
                                     aggregator_args={"alpha": value})}),
    "algorithm.train.local_epochs": lambda value: spec.AlgorithmSpec(
        "fedavg", train={"local_epochs": value}),
    "model.adapters.rank": lambda value: spec.ModelSpec(
        "mlp2", adapters={"rank": value}),
}


def _numpy_scalars():
  """np.bool_, signed and unsigned ints and floats of every width."""
  ints = st.tuples(st.integers(-3, 40), st.sampled_from(
      [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64])).filter(
          lambda pair: pair[0] >= 0 or np.issubdtype(pair[1],
                                                     np.signedinteger))
  floats = st.tuples(
      st.one_of(st.floats(-2, 40), st.sampled_from(
          [0.0, 0.5, 1.0, 1e-5, float("nan"), float("inf")])),
      st.sampled_from([np.float16, np.float32, np.float64]))
  return st.one_of(st.booleans().map(np.bool_),
                   ints.map(lambda pair: pair[1](pair[0])),
                   floats.map(lambda pair: pair[1](pair[0])))


def _outcome(build, value):
  """What building with ``value`` gives: the built spec as strict JSON,
  or the refusal (its type, key path and message)."""
  try:
    built = build(value)
  except (TypeError, ValueError) as error:
    return ("refused", type(error), getattr(error, "path", None),
            str(error))
  data = (built.to_dict() if isinstance(built, spec.Experiment)
          else dataclasses.asdict(built))
  # A partition's arguments are checked by its recipe, on the labels: a
  # NaN alpha is written as the token NaN here, either way.
  return ("built", json.dumps(data, sort_keys=True))


@pytest.mark.parametrize("case", sorted(_NUMPY_CASES))
@settings(max_examples=30, deadline=None)
@given(value=_numpy_scalars())
def test_numpy_scalars_are_taken_as_their_python_values(case, value):
  """A numpy scalar anywhere in a description is its Python value: the
  same spec, serialised to the same strict JSON (an int stays an int, a
  bool a bool), or the same refusal naming the same key (np.bool_ is a
  bool, not an int)."""
  python = value.item()
  assert type(python) in (bool, int, float)
  build = _NUMPY_CASES[case]
  assert _outcome(build, value) == _outcome(build, python)


def test_a_spec_of_numpy_scalars_runs_as_its_python_values():
  from_numpy = _python_experiment(rounds=np.int64(2),
                                  learning_rate=np.float32(0.25),
                                  personalized=np.bool_(False))
  assert from_numpy == _python_experiment(rounds=2, learning_rate=0.25,
                                          personalized=False)
  objects = _run_objects(from_numpy.train)
  assert type(objects["options"]["num_rounds"]) is int
  assert type(objects["training"]["learning_rate"]) is float
  assert type(objects["evaluation"]["personalized"]) is bool
  json.dumps(from_numpy.to_dict(), allow_nan=False)
  # The run objects take them (a numpy int was refused by RunOptions).
  RunOptions(**objects["options"])
  # Adapters built apart hold their values as given; the model's are
  # Python's.
  model = spec.ModelSpec("mlp2", adapters=spec.AdaptersSpec(
      rank=np.int64(2), dropout=np.float32(0.5)))
  assert type(model.adapters.rank) is int
  assert type(model.adapters.dropout) is float
