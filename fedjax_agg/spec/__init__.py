"""The typed description of a run: the schema of a JSON config.

One frozen dataclass per section of a config (``DataSpec`` for "dataset",
``PartitionSpec``, ``ModelSpec``, ``TrainSpec`` for "train",
``AlgorithmSpec`` for each entry of "algorithms", ``AttackSpec``,
``PrivacySpec``, ``SystemsSpec``, ``EarlyStoppingSpec``) and
``Experiment`` for the whole. Each field is one concept with ONE name and
ONE default, declared once: "systems" and "privacy" are the run objects
``config.Systems`` and ``config.Privacy``, and "train" is made of the
fields that the run objects it configures declare (``TRAIN_OBJECTS``):

* each section checks its own values when it is built (its
  ``__post_init__``), and ``Experiment`` checks once what needs two
  sections, building every rule with its full arguments and binding it
  to what the run fixes (``run_context``; under secure aggregation, its
  statistics traced through the secure sum), so that a wrong value is
  refused with the same ``ConfigError`` (naming its key path) however
  the run was described, before anything is read or written (what only
  the data tells, once it is read: ``check_loaded``);
* numpy scalars (``np.bool_``, ``np.integer``, ``np.floating``) are
  taken as the Python values they hold wherever they are given, so they
  pass the same checks and serialise to JSON;
* a JSON config is an ``Experiment`` serialised: ``Experiment.from_dict``
  is the one reader of a config's dict, ``to_dict`` writes it back with
  every default written out;
* ``Experiment`` derives what a run takes from it (``train_of``,
  ``rule_arguments`` with the values the run derives for a rule, e.g.
  FedNova's momentum, ``run_context``, ``privacy_of``), for
  ``fedjax_agg.experiment.build`` and the record;
* the command line's config flags are derived from the fields' ``Flag``
  metadata (``flags``, declared with ``fedjax_agg.declared``, on the run
  objects for "train", "systems" and "privacy"): the flag, its help,
  its choices and the config key it sets come from the field, so a flag
  and a JSON key cannot disagree.

The command line starts from a preset where a config must name something
(dataset, partition, model, rule) and, for a quick first run, with 10 % of
the clients per round at learning rate 0.05 (``Flag.preset``); a config
file states what it runs.

Modules: ``_values`` (the errors and the checks of values),
``_adapters`` (LoRA adapters of the model section), ``_train`` (the
"train" section, made of the run objects' declared fields, and what it
makes of them), ``_sections`` (the other sections), ``_experiment``
(``Experiment``), ``_rule_checks`` (its checks that the rules fit the
rest of the description: a client side and its rule, adapters, privacy,
the secure sum, an attack).
"""

from fedjax_agg.spec._experiment import check_vmapped_systems
from fedjax_agg.spec._experiment import Experiment
from fedjax_agg.spec._experiment import flags
from fedjax_agg.spec._experiment import PRIVATE_AGGREGATORS
from fedjax_agg.spec._experiment import SECTIONS
from fedjax_agg.spec._adapters import ADAPTER_ONLY_RULES
from fedjax_agg.spec._adapters import ADAPTER_RULES
from fedjax_agg.spec._adapters import AdaptersSpec
from fedjax_agg.spec._adapters import RULE_OPTIONS
from fedjax_agg.spec._rule_checks import PAIRED_RULES
from fedjax_agg.spec._rule_checks import PERSONAL_CLIENTS
from fedjax_agg.spec._sections import ADVERSARY_MODES
from fedjax_agg.spec._sections import AlgorithmSpec
from fedjax_agg.spec._sections import AttackSpec
from fedjax_agg.spec._values import check_algorithm_name
from fedjax_agg.spec._train import check_train
from fedjax_agg.spec._sections import CLIENT_OPTIONS
from fedjax_agg.spec._sections import DataSpec
from fedjax_agg.spec._sections import defaults
from fedjax_agg.spec._sections import EarlyStoppingSpec
from fedjax_agg.declared import Flag
from fedjax_agg.spec._sections import keys
from fedjax_agg.spec._sections import ModelSpec
from fedjax_agg.spec._sections import OWN_OBJECTIVE_CLIENTS
from fedjax_agg.spec._sections import PartitionSpec
from fedjax_agg.spec._sections import PrivacySpec
from fedjax_agg.spec._sections import SCRIPT_ALGORITHM_KEYS
from fedjax_agg.spec._sections import SCRIPT_KEYS
from fedjax_agg.spec._sections import SUBSET_SOURCES
from fedjax_agg.spec._sections import SystemsSpec
from fedjax_agg.spec._train import TRAIN_CHECKS
from fedjax_agg.spec._train import train_section
from fedjax_agg.spec._train import TRAIN_OBJECTS
from fedjax_agg.spec._train import TrainSpec
from fedjax_agg.spec._train import RUN_OBJECTS
from fedjax_agg.spec._values import ConfigError
from fedjax_agg.spec._values import ConfigTypeError
from fedjax_agg.spec._values import describe_parameters
from fedjax_agg.spec._values import MAX_CONFIG_DEPTH
from fedjax_agg.spec._values import model_parameters
from fedjax_agg.spec._values import model_takes_options
from fedjax_agg.spec._values import partition_parameters
from fedjax_agg.spec._values import takes_any_keyword

__all__ = ["ADAPTER_ONLY_RULES", "ADAPTER_RULES", "AdaptersSpec",
           "ADVERSARY_MODES", "AlgorithmSpec", "AttackSpec",
           "check_algorithm_name", "check_train", "check_vmapped_systems",
           "CLIENT_OPTIONS",
           "ConfigError", "ConfigTypeError", "DataSpec", "defaults",
           "describe_parameters", "EarlyStoppingSpec", "Experiment", "Flag",
           "flags", "keys", "MAX_CONFIG_DEPTH", "ModelSpec",
           "model_parameters", "model_takes_options", "OWN_OBJECTIVE_CLIENTS",
           "PAIRED_RULES", "partition_parameters", "PartitionSpec",
           "PERSONAL_CLIENTS", "PRIVATE_AGGREGATORS", "PrivacySpec",
           "RULE_OPTIONS", "RUN_OBJECTS",
           "SCRIPT_ALGORITHM_KEYS", "SCRIPT_KEYS", "SECTIONS",
           "SUBSET_SOURCES", "SystemsSpec", "takes_any_keyword",
           "TRAIN_CHECKS", "TRAIN_OBJECTS", "TrainSpec", "train_section"]
