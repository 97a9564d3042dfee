"""RunOptions: one typed description of a run's settings for every entry.

The entry points take a ``RunOptions`` or its fields as keywords; both give
the same run. Wrong types, typos and bad values are refused by name.
"""

import inspect

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import cli
from fedjax_agg import drivers
from fedjax_agg import experiment
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg.config import Evaluation, Execution, LocalTraining, Privacy
from fedjax_agg.options import RunOptions
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

OPTIONS = RunOptions(
    num_rounds=2, participation=0.6,
    training=LocalTraining(epochs=1, batch_size=3, learning_rate=0.2),
    execution=Execution(clients_per_step=2, progress=False),
    evaluation=Evaluation(clients=False))


def _strip(rows):
  return [{k: v for k, v in row.items() if k != "time_s"} for row in rows]


def test_options_and_keywords_give_the_same_run():
  data, x, y, _ = tiny_data()
  by_object = simulation.run(tiny_model(), data, (x, y),
                             aggregators.fedavg(), OPTIONS, seed=1)
  by_keywords = simulation.run(
      tiny_model(), data, (x, y), aggregators.fedavg(), seed=1,
      num_rounds=2, participation=0.6, training=OPTIONS.training,
      execution=OPTIONS.execution, evaluation=OPTIONS.evaluation)
  # A keyword beside options replaces that field only.
  replaced = simulation.run(tiny_model(), data, (x, y),
                            aggregators.fedavg(),
                            OPTIONS.replace(num_rounds=5), seed=1,
                            num_rounds=2)
  assert _strip(by_object.history.rows) == _strip(by_keywords.history.rows)
  assert _strip(by_object.history.rows) == _strip(replaced.history.rows)
  assert len(by_object.history.rows) == 3
  for a, b in zip(jax.tree.leaves(by_object.state.params),
                  jax.tree.leaves(by_keywords.state.params), strict=True):
    np.testing.assert_array_equal(a, b)


def test_a_sweep_member_is_the_run_of_the_same_options():
  data, x, y, _ = tiny_data()
  member, = sweep.run_sweep(lambda h: aggregators.fedavg(), seeds=[1],
                            model=tiny_model(), data=data, test_data=(x, y),
                            options=OPTIONS)
  run = simulation.run(tiny_model(), data, (x, y), aggregators.fedavg(),
                       OPTIONS, seed=1)
  for a, b in zip(_strip(member.history.rows), _strip(run.history.rows),
                  strict=True):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_allclose(a[key], b[key], rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("entry", ["run", "run_sweep", "run_adct"])
def test_typos_are_refused_with_the_nearest_field(entry):
  data, x, y, _ = tiny_data()
  model = tiny_model()
  call = {
      "run": lambda **kw: simulation.run(model, data, (x, y),
                                         aggregators.fedavg(), **kw),
      "run_sweep": lambda **kw: sweep.run_sweep(
          lambda h: aggregators.fedavg(), model=model, data=data,
          test_data=(x, y), **kw),
      "run_adct": lambda **kw: drivers.run_adct(
          model, data, (x, y), aggregators.fedavg(), None, **kw),
  }[entry]
  with pytest.raises(TypeError, match=f"{entry}.*'particpation'.*did you "
                     "mean 'participation'"):
    call(num_rounds=1, particpation=0.5)
  with pytest.raises(TypeError, match="needs num_rounds"):
    call(participation=0.5)
  with pytest.raises(TypeError, match="options must be a RunOptions"):
    call(options={"num_rounds": 1})


@pytest.mark.parametrize("fields, error, match", [
    ({"num_rounds": -1}, ValueError, "num_rounds"),
    ({"num_rounds": 2.0}, ValueError, "num_rounds"),
    ({"num_rounds": True}, ValueError, "num_rounds"),
    ({"participation": 0.0}, ValueError, "participation"),
    ({"participation": float("nan")}, ValueError, "participation"),
    ({"participation": "0.5"}, TypeError, "participation"),
    ({"training": {"learning_rate": 0.1}}, TypeError,
     "training must be a config.LocalTraining"),
    ({"execution": None}, TypeError, "execution must be a config.Execution"),
    ({"evaluation": Execution()}, TypeError, "evaluation"),
    ({"privacy": 1.0}, TypeError, "privacy must be a config.Privacy or None"),
    ({"checkpointing": "ckpt"}, TypeError, "checkpointing"),
    ({"systems": {}}, TypeError, "systems"),
    ({"config": ["a"]}, TypeError, "config"),
    ({"local_update": lambda *a: None}, TypeError, "local_update"),
])
def test_bad_fields_are_named(fields, error, match):
  with pytest.raises(error, match=match):
    RunOptions(**{"num_rounds": 1, **fields})
  with pytest.raises(error, match=match):
    OPTIONS.replace(**fields)


def test_options_are_checked_before_anything_runs():
  data, x, y, _ = tiny_data()
  # A model that would fail at init shows that nothing ran.
  with pytest.raises(ValueError, match="participation"):
    simulation.run(None, data, (x, y), aggregators.fedavg(), num_rounds=1,
                   participation=2.0)
  assert RunOptions(num_rounds=0, privacy=Privacy(delta=1e-5)).privacy


# The structure of the public entry points: each takes at most 10
# parameters and is at most 80 lines long, so that a new option goes into
# the typed objects it takes, never into another argument list.
ENTRY_POINTS = [simulation.run, sweep.run_sweep, drivers.run_adct,
                experiment.run_config, experiment.run_algorithm,
                experiment.sweep_algorithm, experiment.build,
                cli.main]


@pytest.mark.parametrize("entry", ENTRY_POINTS,
                         ids=lambda f: f.__qualname__)
def test_entry_points_are_small(entry):
  parameters = inspect.signature(entry).parameters
  assert len(parameters) <= 10, list(parameters)
  lines, _ = inspect.getsourcelines(entry)
  assert len(lines) <= 80, len(lines)


def test_no_module_is_over_600_lines():
  import pathlib  # pylint: disable=g-import-not-at-top
  package = pathlib.Path(simulation.__file__).parent
  sizes = {str(path.relative_to(package)): len(path.read_text().splitlines())
           for path in package.rglob("*.py")}
  assert len(sizes) > 50
  assert {name: n for name, n in sizes.items() if n > 600} == {}
