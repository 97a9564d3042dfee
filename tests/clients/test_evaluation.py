"""Personalised evaluation: the history's columns, sweep members, what it
needs.
"""

import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import simulation
from fedjax_agg import sweep
from fedjax_agg.config import Evaluation
from tests.clients._util import _run_data
from tests.clients._util import linear_model
from tests.clients._util import QUIET
from tests.clients._util import RUN_TRAINING


def test_personalised_evaluation_in_the_history():
  data, test = _run_data()
  model = linear_model()
  training = RUN_TRAINING
  update = clients.ditto(model, training, lam=0.5)
  result = simulation.run(
      model, data, test, aggregators.fedavg(), num_rounds=3,
      participation=0.5, training=training, execution=QUIET,
      evaluation=Evaluation(personalized=True, finetune_steps=2),
      local_update=update, seed=0)
  last = result.history.rows[-1]
  for name in ("personal_accuracy", "finetuned_accuracy",
               "global_accuracy"):
    assert 0.0 <= last[f"{name}_mean"] <= 1.0
    assert last[f"{name}_std"] >= 0.0
  assert "personal_accuracy_mean" in result.history.rows[0]
  assert "personal_accuracy_mean" not in result.history.rows[1]
  # Clients that never trained hold the global model: their personal
  # accuracy before round 1 is the global one.
  first = result.history.rows[0]
  assert first["personal_accuracy_mean"] == pytest.approx(
      first["global_accuracy_mean"])


def test_sweep_members_get_the_personalised_evaluation_of_their_run():
  data, test = _run_data()
  model = linear_model()
  update = clients.ditto(model, RUN_TRAINING, lam=0.5)
  evaluation = Evaluation(personalized=True, finetune_steps=2)
  members = sweep.run_sweep(
      lambda h: aggregators.fedavg(), None, seeds=[0, 3], model=model,
      data=data, test_data=test, num_rounds=2, participation=0.5,
      training=RUN_TRAINING, execution=QUIET, evaluation=evaluation,
      local_update=update)
  columns = [f"{name}_{stat}" for name in ("personal_accuracy",
                                           "finetuned_accuracy",
                                           "global_accuracy")
             for stat in ("mean", "std")]
  for member in members:
    alone = simulation.run(
        model, data, test, aggregators.fedavg(), num_rounds=2,
        participation=0.5, training=RUN_TRAINING, execution=QUIET,
        evaluation=evaluation, local_update=update, seed=member.seed)
    for got, want in zip(member.history.rows, alone.history.rows,
                         strict=True):
      assert set(got) == set(want)
      for column in set(columns) & set(want):
        assert got[column] == pytest.approx(want[column], abs=1e-6), column
    assert set(columns) <= set(member.history.rows[0])


def test_personalised_evaluation_needs_a_split_and_personal_models():
  data, test = _run_data()
  model = linear_model()
  with pytest.raises(ValueError, match="validation split"):
    simulation.run(model, data._replace(validation=None), test,
                   aggregators.fedavg(), num_rounds=1, execution=QUIET,
                   evaluation=Evaluation(finetune_steps=1))
  with pytest.raises(ValueError, match="personalize"):
    simulation.run(model, data, test, aggregators.fedavg(), num_rounds=1,
                   execution=QUIET, evaluation=Evaluation(personalized=True))
  with pytest.raises(ValueError, match="finetune_steps"):
    Evaluation(finetune_steps=-1)
