"""The fine-tuning rules (FedIT, FFA-LoRA, FLoRA, HetLoRA) through the
engine on tiny loaded checkpoints: the run's params are the adapters, the
frozen base is bit-identical afterwards, and the adapters moved."""

import jax
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import federated
from fedjax_agg import simulation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.models import lora
from fedjax_agg.models import pretrained
from tests.models import _pretrained_util as util

TRAINING = LocalTraining(epochs=1, batch_size=4, learning_rate=0.05)
RANKS = [1, 2, 2, 1]


def _data(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, 64, size=(16, 9))
  x, y = tokens[:, :-1].astype(np.int32), tokens[:, 1:].astype(np.int32)
  parts = [np.arange(4 * k, 4 * k + 4) for k in range(4)]
  return federated.from_partition(x, y, parts), (x[:4], y[:4])


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa"])
@pytest.mark.parametrize("rule,options,ranks", [
    ("fedit", {}, None), ("ffa_lora", {"freeze_a": True}, None),
    ("flora", {"merged": True}, RANKS), ("hetlora", {}, RANKS)])
def test_rule_runs_on_a_loaded_checkpoint(name, rule, options, ranks):
  base, variables = pretrained.load_pretrained(util.folder(name))
  model = lora.lora(base, variables, rank=2, key=jax.random.key(0),
                    **options)
  frozen = jax.tree.map(np.array, lora.spec(model).base_variables)
  data, test = _data()
  local_update = (None if ranks is None else
                  clients.lora_ranks(model, ranks, TRAINING))
  result = simulation.run(model, data, test, aggregators.get(rule),
                          num_rounds=2, participation=0.5, seed=1,
                          training=TRAINING, local_update=local_update,
                          execution=Execution(progress=False))
  for got, want in zip(jax.tree.leaves(lora.spec(model).base_variables),
                       jax.tree.leaves(frozen), strict=True):
    np.testing.assert_array_equal(np.asarray(got), want)
  params = result.state.params
  assert lora.is_adapters(params)
  assert set(params["lora"]) == set(lora.select_targets(base, None))
  assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves(params))
  moved = "merged" if rule == "flora" else "b"
  assert any(np.any(node[moved]) for node in params["lora"].values())
  assert np.isfinite(result.history.rows[-1]["test_loss"])
