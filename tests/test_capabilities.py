"""What a rule needs and implies is declared with it
(``registry.Capabilities``), and the checks read the declaration: a rule
of the user's that declares itself private, or for adapters, is treated
as the built-in ones are, with no table to edit."""

import pytest

from fedjax_agg import aggregators
from fedjax_agg import clients
from fedjax_agg import experiment
from fedjax_agg import registry
from fedjax_agg import spec
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
