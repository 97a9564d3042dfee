"""The attack registry and every attack factory's argument checks."""

import math

import pytest

from fedjax_agg import attacks

def test_registry_builds_every_attack():
  assert set(attacks.REGISTRY) == {
      "label_flip", "sign_flip", "scale", "gaussian", "free_rider",
      "nonfinite", "little_is_enough", "inner_product", "backdoor"}
  for name in attacks.REGISTRY:
    assert isinstance(attacks.build(name), attacks.Attack)
  assert isinstance(attacks.build("sign_flip", scale=10), attacks.Attack)
  with pytest.raises(ValueError, match="attack must be one of"):
    attacks.build("poison")
  with pytest.raises(TypeError, match="scale"):
    attacks.build("sign_flip", factor=2.0)


@pytest.mark.parametrize("build, error, name", [
    (lambda: attacks.per_round(1.0), ValueError, "fraction"),
    (lambda: attacks.per_round(-0.1), ValueError, "fraction"),
    (lambda: attacks.per_round("half"), TypeError, "fraction"),
    (lambda: attacks.fixed(10, 1.5), ValueError, "fraction"),
    (lambda: attacks.fixed(10, count=11), ValueError, "count"),
    (lambda: attacks.fixed(10, 0.1, count=1), ValueError, "exactly one"),
    (lambda: attacks.fixed(10, ids=[3, 3]), ValueError, "ids"),
    (lambda: attacks.fixed(0, 0.1), ValueError, "num_clients"),
    (lambda: attacks.gaussian(-1.0), ValueError, "stddev"),
    (lambda: attacks.gaussian(math.nan), ValueError, "stddev"),
    (lambda: attacks.sign_flip(math.inf), ValueError, "scale"),
    (lambda: attacks.sign_flip(0.0), ValueError, "scale"),
    (lambda: attacks.scale_update(math.nan), ValueError, "factor"),
    (lambda: attacks.nonfinite(1.0), ValueError, "value"),
    (lambda: attacks.little_is_enough(z=math.inf), ValueError, "z"),
    (lambda: attacks.inner_product(-0.5), ValueError, "epsilon"),
    (lambda: attacks.label_flip([0, 0, 1]), ValueError, "permutation"),
    (lambda: attacks.label_flip([0.5, 1.0]), TypeError, "permutation"),
    (lambda: attacks.label_flip([1, 0], num_classes=3), ValueError,
     "num_classes"),
    (lambda: attacks.build("nope"), ValueError, "attack"),
    (lambda: attacks.with_attack("sign_flip", attacks.per_round(0.1),
                                 lambda *a: None), TypeError, "attack"),
    (lambda: attacks.with_attack(attacks.sign_flip(), 0.1,
                                 lambda *a: None), TypeError, "adversaries"),
    (lambda: attacks.with_attack(attacks.sign_flip(), attacks.per_round(0.1),
                                 3), TypeError, "local_update"),
    (lambda: attacks.compose(attacks.sign_flip(), None), TypeError,
     "second"),
])
def test_bad_arguments_are_named(build, error, name):
  with pytest.raises(error, match=name):
    build()
