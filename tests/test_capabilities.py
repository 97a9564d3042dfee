"""What a rule needs and implies is declared with it
(``registry.Capabilities``), and the checks read the declaration: a rule
of the user's that declares itself private, or for adapters, is treated
as the built-in ones are, with no table to edit."""

import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import checks as registry_checks
from fedjax_agg import clients
from fedjax_agg import evaluation
from fedjax_agg.experiment import _build as experiment_build
from fedjax_agg import experiment
from fedjax_agg import registry
from fedjax_agg import run_context
from fedjax_agg import spec
from tests.data.test_federations import CONFIG as FEDERATION_CONFIG
from tests.experiment.test_runs import MNIST_5K


def _noisy_mean(noise_multiplier: float = 0.5):
  return aggregators.dp_fedavg(noise_multiplier=noise_multiplier)


@pytest.fixture
def user_rules():
  yield
  for name in ("user_private", "user_plain"):
    aggregators.REGISTRY._entries.pop(name, None)  # pylint: disable=protected-access


def test_the_built_in_declarations_are_the_former_tables():
  assert aggregators.REGISTRY.having(private=True) == ("dp_fedavg",
                                                       "dp_ftrl")
  assert aggregators.ADAPTER_RULES == ("fedit", "ffa_lora", "flora",
                                       "hetlora")
  assert spec.RULE_OPTIONS == {"ffa_lora": {"freeze_a": True},
                               "flora": {"merged": True}}
  assert spec.PAIRED_RULES == {"feddyn": ("feddyn", "alpha")}
  assert clients.REGISTRY.having(personal=True) == (
      "fedbn", "ditto", "fedper", "fedrep", "apfl")
  assert clients.REGISTRY.capabilities("lora_ranks").adapters == "only"
  assert spec.OWN_OBJECTIVE_CLIENTS == ("scaffold", "feddyn", "apfl")
  assert attacks.TASKS == {"backdoor": ("classification",)}
  assert attacks.REGISTRY.having(eval_sets=None) == tuple(
      name for name in attacks.REGISTRY if name != "backdoor")


def test_a_users_private_rule_is_accounted_by_its_declaration(user_rules):
  del user_rules
  aggregators.register("user_private", _noisy_mean,
                       capabilities=registry.Capabilities(private=True))
  aggregators.register("user_plain", _noisy_mean)
  private = experiment.override(MNIST_5K, {
      "algorithms": {"A": {"aggregator": "user_private"}},
      "privacy": {"delta": 1e-5}})
  checked = experiment.check_config(private)
  assert checked.privacy_of("A") is not None
  plain = experiment.override(private, {
      "algorithms": {"A": {"aggregator": "user_plain"}}})
  with pytest.raises(spec.ConfigError, match="no privacy guarantee"):
    experiment.check_config(plain)


@pytest.mark.parametrize("caps, error", [
    (dict(private="yes"), "capabilities.private must be a bool"),
    (dict(adapters="sometimes"), "capabilities.adapters must be one of"),
    (dict(model_options=[1]), "model_options must map"),
    (dict(pairs_with="feddyn"), "pairs_with must be"),
    (dict(check_arguments="ranks"), "check_arguments must be callable"),
    (dict(own_objective=1), "capabilities.own_objective must be a bool"),
    (dict(tasks="classification"), "tasks must be a non-empty tuple"),
    (dict(tasks=()), "tasks must be a non-empty tuple"),
    (dict(eval_sets=[]), "eval_sets must be callable"),
])
def test_bad_capabilities_are_refused_by_name(user_rules, caps, error):
  del user_rules
  with pytest.raises((TypeError, ValueError), match=error):
    aggregators.register("user_plain", _noisy_mean,
                         capabilities=registry.Capabilities(**caps))
  assert "user_plain" not in aggregators.REGISTRY
  with pytest.raises(TypeError, match="capabilities must be"):
    aggregators.register("user_plain", _noisy_mean,
                         capabilities={"private": True})
  with pytest.raises(TypeError, match="unknown capabilities"):
    aggregators.REGISTRY.having(privat=True)


def _checked_client(model, training, width=1):
  del width
  return clients.fedper(model, training)


def _check_width(arguments, run):
  # A user's client side states what its arguments must be for the run.
  if "width" not in arguments:
    raise ValueError("width is required")
  registry.argument("client_args.width", registry_checks.check_int,
                    arguments["width"], 1, run["num_clients"])


@pytest.fixture
def user_client():
  clients.REGISTRY.register("user_checked", _checked_client,
                            capabilities=registry.Capabilities(
                                personal=True, check_arguments=_check_width))
  yield
  clients.REGISTRY._entries.pop("user_checked", None)  # pylint: disable=protected-access


@pytest.mark.parametrize("client_args, path, message", [
    ({"width": 2}, None, None),
    ({"width": 99}, "algorithms.A.client_args.width",
     "algorithms.A.client_args.width must be an int in [1, "),
    ({"width": "2"}, "algorithms.A.client_args.width", "must be an int"),
    ({"width": float("nan")}, "algorithms.A.client_args.width",
     "must be an int"),
    ({}, "algorithms.A.client_args", "width is required"),
])
def test_a_client_sides_declared_check_runs_when_the_config_is_made(
    user_client, client_args, path, message):
  del user_client
  config = experiment.override(MNIST_5K, {"algorithms": {"A": {
      "aggregator": "fedavg", "client": "user_checked",
      "client_args": client_args}}})
  if path is None:
    assert experiment.check_config(config).algorithms["A"].client_args == (
        client_args)
    return
  with pytest.raises(spec.ConfigError) as raised:
    experiment.check_config(config)
  assert raised.value.path == path and message in str(raised.value)


def test_argument_names_the_key_and_keeps_the_kind():
  with pytest.raises(registry.ArgumentTypeError) as raised:
    registry.argument("client_args.ranks[2]", registry_checks.check_int,
                      2.0, 1, 4)
  assert raised.value.key == "client_args.ranks[2]"
  assert isinstance(raised.value, TypeError)
  assert str(raised.value).startswith("client_args.ranks[2] must be")
  with pytest.raises(registry.ArgumentError) as raised:
    registry.argument("k", registry_checks.check_int, 9, 1, 4)
  assert not isinstance(raised.value, TypeError)
  assert clients.REGISTRY.capabilities("lora_ranks").check_arguments


@pytest.fixture
def user_attack():
  yield
  attacks.REGISTRY._entries.pop("user_attack", None)  # pylint: disable=protected-access
  clients.REGISTRY._entries.pop("user_own", None)  # pylint: disable=protected-access


def test_an_attacks_tasks_and_scored_sets_are_its_declaration(user_attack):
  del user_attack
  def scored(x, y, **args):
    return (evaluation.EvalSet("user_success", x[:2], y[:2] * 0
                               + args["label"]),)
  attacks.REGISTRY.register(
      "user_attack", lambda label=0: attacks.sign_flip(),
      capabilities=registry.Capabilities(tasks=("classification",),
                                         eval_sets=scored))
  # Shakespeare is a sequence task: refused by the attack's declaration.
  with pytest.raises(spec.ConfigError, match="user_attack is defined for "
                     "classification tasks"):
    experiment.check_config({**FEDERATION_CONFIG, "dataset": {
        "name": "shakespeare", "args": {"min_samples": 2000}},
        "attack": {"name": "user_attack", "args": {"label": 3}}})
  config = experiment.override(MNIST_5K, {
      "attack": {"name": "user_attack", "args": {"label": 3},
                 "fraction": 0.5}})
  attacks.REGISTRY.register(
      "user_attack", lambda label=0: attacks.sign_flip(), replace=True,
      capabilities=registry.Capabilities(eval_sets=scored))
  checked = experiment.check_config(config)
  x, y = np.zeros((4, 28, 28, 1), np.float32), np.arange(4)
  [extra] = experiment_build.attack_eval_sets(checked, (x, y))
  assert extra.name == "user_success" and list(extra.y) == [3, 3]
  assert experiment_build.attack_eval_sets(experiment.check_config(
      experiment.override(config, {"attack": {"name": "sign_flip",
                                              "fraction": 0.5}})),
      (x, y)) == ()


def test_a_client_side_declaring_its_own_objective_keeps_the_plain_one(
    user_attack):
  del user_attack
  clients.REGISTRY.register(
      "user_own", _checked_client,
      capabilities=registry.Capabilities(own_objective=True, personal=True))
  config = experiment.override(MNIST_5K, {"algorithms": {"A": {
      "aggregator": "fedavg", "client": "user_own", "objective": "fedprox",
      "objective_args": {"mu": 0.1}}}})
  with pytest.raises(spec.ConfigError, match="sets its own local objective"):
    experiment.check_config(config)


@run_context.derived_from_run(num_participants="cohort_size")
def _user_tree(noise_multiplier: float = 1.0, num_participants: int = 1):
  return aggregators.dp_ftrl(noise_multiplier=noise_multiplier,
                             num_participants=num_participants)


@pytest.mark.parametrize("rule, refused", [
    ("dp_ftrl", True), ("user_tree", True), ("dp_fedavg", False)])
def test_the_target_check_accounts_a_rule_by_its_declared_noise(
    rule, refused):
  # One round of tree aggregation costs more than one sampled round (no
  # amplification); a target between the two must refuse every rule whose
  # noise is tree-aggregated, whatever its name, as the run accounts it.
  aggregators.register("user_tree", _user_tree, replace=True,
                       capabilities=registry.Capabilities(private=True))
  try:
    config = experiment.override(MNIST_5K, {
        "algorithms": {"A": {"aggregator": rule,
                             "aggregator_args": {"noise_multiplier": 1.0}}},
        "privacy": {"delta": 1e-5, "target_epsilon": 4.4},
        "train.participation": 0.5})
    if refused:
      with pytest.raises(spec.ConfigError, match="a single round already "
                         r"costs epsilon=4\.7"):
        experiment.check_config(config)
    else:
      experiment.check_config(config)
  finally:
    aggregators.REGISTRY._entries.pop("user_tree", None)  # pylint: disable=protected-access
