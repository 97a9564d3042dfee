"""Each public name is exported by one module, its home. A name that a
second module exported before still resolves there, with a
DeprecationWarning naming its home, and the package itself imports with
no such warning (it never uses an old place)."""

import importlib
import pkgutil
import subprocess
import sys

import pytest

import fedjax_agg
from fedjax_agg import config
from fedjax_agg import distributed
from fedjax_agg import evaluation
from fedjax_agg import fingerprint

MOVED = [
    ("checkpoint", "describe", fingerprint),
    ("checkpoint", "data_fingerprint", fingerprint),
    ("checkpoint", "config_differences", fingerprint),
    ("engine", "OptimizerFactory", config),
    ("engine", "default_clients_per_step", distributed),
    ("privacy", "ACCOUNTANTS", config),
    ("privacy", "SAMPLINGS", config),
    ("config", "EvalSet", evaluation),
]


@pytest.mark.parametrize("module, name, home", MOVED,
                         ids=lambda x: getattr(x, "__name__", x))
def test_a_moved_name_warns_and_is_its_homes(module, name, home):
  old = importlib.import_module(f"fedjax_agg.{module}")
  assert name not in old.__all__ and name in home.__all__
  with pytest.warns(DeprecationWarning, match=(
      rf"fedjax_agg\.{module}\.{name} is deprecated: use "
      rf"{home.__name__}\.{name}")):
    value = getattr(old, name)
  assert value is getattr(home, name)
  with pytest.raises(AttributeError, match="has no attribute 'nope'"):
    _ = old.nope


def test_the_package_imports_without_using_an_old_place():
  script = ("import warnings\n"
            "warnings.simplefilter('error', DeprecationWarning)\n"
            "import fedjax_agg, fedjax_agg.cli, fedjax_agg.experiment\n"
            "import fedjax_agg.report, fedjax_agg.drivers\n")
  subprocess.run([sys.executable, "-c", script], check=True)


def _public_modules():
  for found in pkgutil.walk_packages(fedjax_agg.__path__, "fedjax_agg."):
    if not any(part.startswith("_") for part in found.name.split(".")[1:]):
      yield importlib.import_module(found.name)


def test_no_function_or_class_is_exported_by_two_modules():
  # A package exports the names of its own modules (optax's ``_src``
  # layout); what no module may do is export a function or class whose
  # home is another public module.
  foreign = {}
  for module in _public_modules():
    for name in getattr(module, "__all__", ()):
      value = getattr(module, name)
      if not callable(value) or not hasattr(value, "__module__") or (
          name == "REGISTRY"):
        continue
      home = ".".join(part for part in value.__module__.split(".")
                      if not part.startswith("_"))
      own = home == module.__name__ or home.startswith(
          module.__name__ + ".")
      if home.startswith("fedjax_agg") and not own:
        foreign[f"{module.__name__}.{name}"] = home
  assert foreign == {name: home for name, (home, _) in KNOWN_SHARED.items()
                     }, foreign


# Names that stay in a second module's API, each for its own reason.
KNOWN_SHARED = {
    "fedjax_agg.experiment.check_output_dir": (
        "fedjax_agg.history", "the output folder's check that experiment "
        "documents for scripts, as the command line uses it"),
    "fedjax_agg.models.lora.Target": (
        "fedjax_agg.models", "lora's own type, kept in a private module "
        "beside it"),
    "fedjax_agg.rounds.LocalUpdate": (
        "fedjax_agg.types", "the round's extension point, documented with "
        "the round"),
    "fedjax_agg.spec.Flag": (
        "fedjax_agg.declared", "the flag of a spec field, documented with "
        "the spec"),
    "fedjax_agg.sweep.SweepMember": (
        "fedjax_agg.runner", "a sweep's result: runner.Member under the "
        "sweep's name"),
}
