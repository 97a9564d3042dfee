"""Fixtures of the attack tests."""

import jax
import pytest

from fedjax_agg import engine
from tests.attacks._util import TRAINING
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model


@pytest.fixture(scope="module")
def setup():
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  trainer = engine.make_local_trainer(model, TRAINING, clients_per_step=2)
  return data, x, y, parts, model, params, trainer
