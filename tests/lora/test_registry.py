"""The registered rules on LoRA adapters (``aggregators.ADAPTER_RULES``)
against the registry-wide properties, on adapter trees: the conformance
kit, full-precision products, example counts, refusal of other trees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import testing
from tests import agg_testutil as tu
from tests.lora import _util

# The model options whose adapters each rule takes.
KINDS = {"fedit": {}, "ffa_lora": {"freeze_a": True},
         "flora": {"merged": True}, "hetlora": {}}
READS_COUNTS = ("fedit", "ffa_lora", "flora")  # hetlora: sparsity weights


def _adapters(name, seed=0):
  _, _, model = _util.lora_mlp(rank=2, **KINDS[name])
  return _util.random_adapters(model, seed)


def test_every_adapter_rule_is_registered_and_listed():
  assert set(KINDS) == set(aggregators.ADAPTER_RULES)
  assert set(KINDS) <= set(aggregators.REGISTRY)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_the_conformance_kit_passes_on_adapters(name):
  testing.check_aggregator(tu.build(name), _adapters(name),
                           num_clients=tu.NUM_CLIENTS, cohort_size=tu.COHORT)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_matrix_product_is_full_precision(name):
  rule = tu.build(name)
  global_params, clients, info = _util.cohort(
      _util.lora_mlp(rank=2, **KINDS[name])[2], 4)
  jaxpr = jax.make_jaxpr(rule.aggregate)(global_params, clients, info,
                                         rule.init(global_params))
  highest = jax.lax.Precision.HIGHEST
  precisions = tu.dot_precisions(jaxpr)
  assert precisions
  for precision in precisions:
    assert precision in ((highest, highest), highest), (name, precision)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_real_clients_need_positive_example_counts(name):
  global_params = _adapters(name)
  clients = jax.tree.map(lambda x: jnp.stack([x] * 4), global_params)
  rule = tu.build(name)
  for count in (0.0, -2.0, float("nan"), float("inf")):
    info = testing.make_info([0, 1, 2, 3], [5.0, count, 1.0, 2.0])
    if name in READS_COUNTS:
      with pytest.raises(ValueError, match="num_examples"):
        rule.aggregate(global_params, clients, info, ())
    else:
      rule.aggregate(global_params, clients, info, ())
    # Padding rows may hold any count.
    padded = testing.make_info([0, 1, 2, 3], [5.0, count, 1.0, 2.0],
                               mask=[1, 0, 1, 1])
    rule.aggregate(global_params, clients, padded, ())


@pytest.mark.parametrize("name", sorted(KINDS))
def test_params_that_are_not_adapters_are_refused_naming_the_rule(name):
  plain = tu.make_params(np.random.default_rng(0))
  clients = jax.tree.map(lambda x: jnp.stack([x] * 2), plain)
  info = testing.make_info([0, 1], [1.0, 2.0])
  with pytest.raises(ValueError, match=f"{name}: global_params are not LoRA"):
    tu.build(name).aggregate(plain, clients, info, ())
