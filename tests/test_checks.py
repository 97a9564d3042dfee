"""Argument checks: the helpers and every registered factory's numbers.

The table-driven test passes NaN, +-inf and a string for each numeric
keyword argument of every registered aggregator and objective (and of
FedDRL's ``AgentConfig``, ADCT and the straggler hook): each must raise
ValueError or TypeError naming the argument. No registered hyperparameter
accepts an infinite value (every documented range is finite), so the
table has no exceptions.
"""

import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import checks
from fedjax_agg import clients
from fedjax_agg import objectives
from fedjax_agg import stragglers
from tests import agg_testutil as tu

BAD_NUMBERS = (float("nan"), float("inf"), -float("inf"), "abc", None)


def _numeric_defaults(factory) -> list[str]:
  """Keyword arguments of ``factory`` whose default is an int or float."""
  return [p.name for p in inspect.signature(factory).parameters.values()
          if isinstance(p.default, (int, float))
          and not isinstance(p.default, bool)]


def _cases():
  """(label, build(name, value) -> anything, argument name) triples."""
  cases = []
  for name, factory in aggregators.REGISTRY.items():
    for arg in _numeric_defaults(factory):
      cases.append((f"aggregator {name}", name, arg,
                    lambda n, a, v: tu.build(n, **{a: v})))
  for arg, default in aggregators.AgentConfig._field_defaults.items():
    if isinstance(default, (int, float)) and not isinstance(default, bool):
      cases.append(("feddrl config", "feddrl", arg,
                    lambda n, a, v: tu.build(n, **{a: v})))
  for name, factory in objectives.REGISTRY.items():
    for arg in _numeric_defaults(factory):
      cases.append((f"objective {name}", name, arg,
                    lambda n, a, v: objectives.get(n, **{a: v})))
  for arg in _numeric_defaults(clients.adct):
    cases.append(("adct", "adct", arg,
                  lambda n, a, v: clients.adct(tu.MODEL,
                                                        **{a: v})))
  for arg in ("fraction", "num_epochs"):
    cases.append(("stragglers", "stragglers", arg, lambda n, a, v:
                  stragglers.stragglers(**{"fraction": 0.5, "num_epochs": 2,
                                           a: v})))
  return cases


CASES = _cases()


def test_the_table_covers_every_registered_factory_with_numbers():
  covered = {name for _, name, _, _ in CASES}
  for registry in (aggregators.REGISTRY, objectives.REGISTRY):
    for name, factory in registry.items():
      if _numeric_defaults(factory):
        assert name in covered
  assert {"alpha", "beta", "gamma", "min_norm", "server_learning_rate", "b1",
          "b2", "tau", "momentum", "fraction", "mu", "q", "policy_lr",
          "accuracy_threshold", "search_step"} <= {a for *_, a, _ in CASES}


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize("label,name,arg,build", CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_non_finite_and_non_numeric_values_are_refused(label, name, arg,
                                                       build, value):
  del label
  with pytest.raises((ValueError, TypeError), match=arg):
    build(name, arg, value)


@pytest.mark.parametrize("value", ["abc", None, True, ["a", "b"], 1 + 2j])
def test_non_numbers_raise_type_error_naming_the_expectation(value):
  with pytest.raises(TypeError, match=r"beta must be a number in \[0, 0.5\)"):
    aggregators.trimmed_mean(beta=value)


def test_examples_of_the_task():
  with pytest.raises(ValueError, match="alpha must be finite"):
    aggregators.get("fedadp", num_clients=3, alpha=float("1e999"))
  with pytest.raises(ValueError, match="beta"):
    aggregators.fednnnn(beta=float("nan"))
  with pytest.raises(ValueError, match="grid"):
    clients.adct(tu.MODEL, grid=[(float("inf"), 1)])
  with pytest.raises(TypeError, match="grid"):
    clients.adct(tu.MODEL, grid=[("fast", 1)])


def test_check_range_infinite_values_only_where_a_bound_names_them():
  checks.check_range("x", math.inf, 0, math.inf)
  checks.check_range("x", -math.inf, -math.inf, 0)
  checks.check_range("x", np.array([0.0, 1.0, math.inf]), 0, math.inf)
  for value, low, high, kw in [
      (math.inf, 0, None, {}), (-math.inf, None, 0, {}),
      (math.inf, 0, math.inf, dict(high_open=True)),
      (np.array([1.0, -math.inf]), 0, math.inf, {}),
      (math.nan, -math.inf, math.inf, {})]:
    with pytest.raises(ValueError, match="x must be"):
      checks.check_range("x", value, low, high, **kw)


def test_check_range_lets_tracers_through():
  # A sweep builds factories under vmap with traced hyperparameters.
  def build(alpha):
    checks.check_range("alpha", alpha, 0, low_open=True)
    checks.check_int("n", jnp.asarray(alpha, jnp.int32), 1)
    return alpha * 2
  np.testing.assert_allclose(jax.vmap(build)(jnp.array([-1.0, jnp.nan])),
                             [-2.0, jnp.nan])
  jax.jit(build)(-1.0)


def test_check_int_check_bool_check_choice():
  checks.check_int("n", 3, 1)
  checks.check_int("n", np.int64(0), 0)
  for value in (2.0, True, "3", None):
    with pytest.raises(TypeError, match="n must be an int >= 1"):
      checks.check_int("n", value, 1)
  with pytest.raises(ValueError, match="n must be an int >= 1, got 0"):
    checks.check_int("n", 0, 1)
  with pytest.raises(ValueError, match=r"n must be an int in \[1, 3\]"):
    checks.check_int("n", 4, 1, 3)
  checks.check_bool("flag", np.bool_(True))
  with pytest.raises(TypeError, match="flag must be a bool"):
    checks.check_bool("flag", "yes")
  checks.check_choice("unit", "steps", ("epochs", "steps"))
  for value in ("x", ["steps"], None):
    with pytest.raises(ValueError, match="unit must be one of"):
      checks.check_choice("unit", value, ("epochs", "steps"))
  # A misspelling keeps its hint whatever the case of either side.
  for value, meant in (("SGDM", "SGD"), ("sgdm", "SGD"), ("Stepss", "steps")):
    with pytest.raises(ValueError, match=f"did you mean '{meant}'"):
      checks.check_choice("name", value, ("SGD", "Adam", "steps"))


# ---------------------------------------------------------------------------
# Cohort values at an aggregate entry (concrete client info).


def _round(name, ids, num_examples, mask):
  """``aggregate`` on concrete client info, as an eager call gets it: the
  entry checks read its values. The rest is traced only (jax.eval_shape):
  the checks are what these tests are about, and executing every rule
  eagerly costs a compilation per operation."""
  rng = np.random.default_rng(0)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, len(ids))
  rule = tu.build(name)
  info = tu.make_info(ids, num_examples, mask)
  return jax.eval_shape(
      lambda params, stacked, state: rule.aggregate(params, stacked, info,
                                                    state),
      global_params, clients, rule.init(global_params))


HOSTILE_COUNTS = (0.0, -2.0, float("nan"), float("inf"))


# The rules on LoRA adapters refuse these trees by name; tests/lora checks
# their counts on adapters.
@pytest.mark.parametrize("name", sorted(set(aggregators.REGISTRY)
                                        - set(aggregators.ADAPTER_RULES)))
def test_real_clients_need_positive_example_counts(name):
  reads_counts = name not in ("fedmedian", "trimmed_mean", "krum",
                              "bulyan", "centered_clipping", "dp_fedavg",
                              "dp_ftrl", "qffl", "feddyn")
  for count in HOSTILE_COUNTS:
    if reads_counts:
      with pytest.raises(ValueError, match="num_examples"):
        _round(name, [0, 1, 2, 3], [5.0, count, 1.0, 2.0], [1, 1, 1, 1])
    else:
      _round(name, [0, 1, 2, 3], [5.0, count, 1.0, 2.0], [1, 1, 1, 1])
  # Padding rows may hold anything: the hostile counts two at a time in
  # the padding rows of a 4-client cohort (FedDRL's agent is built for
  # 4), beside real clients.
  for pair in (HOSTILE_COUNTS[:2], HOSTILE_COUNTS[2:]):
    _round(name, [0, 1, 2, 3], [5.0, *pair, 1.0], [1, 0, 0, 1])


@pytest.mark.parametrize("name", ["fedadp", "fedlayerwise"])
@pytest.mark.parametrize("bad_id", [tu.NUM_CLIENTS, tu.NUM_CLIENTS + 5, -1])
def test_per_client_state_rules_refuse_ids_outside_the_federation(name,
                                                                  bad_id):
  with pytest.raises(ValueError, match=f"num_clients={tu.NUM_CLIENTS}"):
    _round(name, [0, bad_id, 2, 3], [1.0] * 4, [1, 1, 1, 1])
  _round(name, [0, bad_id, 2, 3], [1.0] * 4, [1, 0, 1, 1])


def test_check_cohort_checks_shapes_of_the_named_fields():
  rng = np.random.default_rng(0)
  global_params = tu.make_params(rng)
  clients = tu.make_clients(rng, global_params, 3)
  info = tu.make_info([0, 1, 2], [1.0, 1.0, 1.0])
  assert checks.check_cohort(global_params, clients, info) == 3
  with pytest.raises(ValueError, match=r"shape \[K=3\]"):
    checks.check_cohort(global_params, clients,
                        info._replace(loss_after=jnp.ones(2)),
                        fields=("loss_after",))


def test_check_range_messages_and_traced_values():
  checks.check_range("alpha", 5.0, 0, low_open=True)
  checks.check_range("b1", np.array([0.0, 0.5]), 0, 1, high_open=True)
  for value, low, high, kw, message in [
      (0.0, 0, None, dict(low_open=True), "alpha must be > 0, got 0.0"),
      (-1, 0, None, {}, "alpha must be >= 0, got -1"),
      (1.0, 0, 1, dict(high_open=True), r"alpha must be in \[0, 1\), got"),
      (2.0, None, 1, {}, "alpha must be <= 1"),
      (float("nan"), 0, None, {}, "alpha must be >= 0, got nan")]:
    with pytest.raises(ValueError, match=message):
      checks.check_range("alpha", value, low, high, **kw)
  for value in ("x", True, None):
    with pytest.raises(TypeError, match="alpha must be a number"):
      checks.check_range("alpha", value, 0)

  @jax.jit
  def traced(alpha):
    assert checks.is_traced(alpha)
    checks.check_range("alpha", alpha, 0, low_open=True)  # skipped
    return aggregators.fedadp(alpha, num_clients=2) is not None

  assert traced(-1.0)
  assert not checks.is_traced(1.0)
