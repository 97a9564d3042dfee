"""One algorithm of an experiment config, built (``build`` -> ``Built``):
its model, data, aggregator and ``RunOptions`` (training with its local
objective, its client side or attacked local update, its privacy
accounting, evaluation, systems, the recorded config), and the rules'
full arguments. Every entry point that runs a config goes through
``build``: the command line, ``run_config`` and the ``experiments/``
scripts.

Part of ``fedjax_agg.experiment`` (its docstring describes the config).
"""

import dataclasses
import inspect
from typing import Any, NamedTuple, Optional

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import clients
from fedjax_agg import distributed
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import rounds
from fedjax_agg import spec as spec_lib
from fedjax_agg.config import client_optimizer
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.config import Privacy
from fedjax_agg.config import Systems
from fedjax_agg.federated import FederatedData
from fedjax_agg.options import RunOptions
from fedjax_agg.types import Aggregator, Model


TRAIN_DEFAULTS = spec_lib.defaults(spec_lib.TrainSpec)
"""The defaults of a config's "train" block, from the typed spec (one name and
one default per concept, ``fedjax_agg.spec``)."""
# The defaults of a config's "attack" block (see ``_checks.ATTACK_KEYS``).
# Client sides that set their own local objective (F_k plus their terms).
OWN_OBJECTIVE_CLIENTS = ("scaffold", "feddyn", "apfl")
# Client side -> (the server rule it needs, the argument both must share).
PAIRED_RULES = {"feddyn": ("feddyn", "alpha")}
ATTACK_DEFAULTS = spec_lib.defaults(spec_lib.AttackSpec)
# Aggregators whose runs record their privacy (the "privacy" block, see
# ``_checks.PRIVACY_KEYS``).
PRIVATE_AGGREGATORS = ("dp_fedavg", "dp_ftrl")


def seeds_of(config: dict) -> list[int]:
  """A config's seeds (the spec's default where it names none)."""
  return list(config.get("seeds", spec_lib.defaults(
      spec_lib.Experiment)["seeds"]))


def objective_of(algorithm: dict) -> str:
  """An algorithm entry's local objective (the spec's default where it
  names none)."""
  return algorithm.get("objective", spec_lib.defaults(
      spec_lib.AlgorithmSpec)["objective"])


def _train_config(config: dict, algorithm: str) -> dict:
  spec = config["algorithms"][algorithm]
  return {**TRAIN_DEFAULTS, **config.get("train", {}),
          **spec.get("train", {})}


def _defaults(parameters: dict[str, inspect.Parameter]) -> dict[str, Any]:
  return {name: p.default for name, p in parameters.items()
          if p.default is not inspect.Parameter.empty}


def _rule_parameters(registry, name: str) -> dict[str, inspect.Parameter]:
  """A rule's arguments a config may give (all but the context ones)."""
  return {arg: p for arg, p in registry.parameters(name).items()
          if arg not in registry.context}


def _parameters(factory) -> set[str]:
  return set(inspect.signature(factory).parameters)


def _runner_arguments(config: dict, algorithm: str) -> dict[str, Any]:
  """Aggregator arguments the runner fills in unless the spec gives them:
  the client learning rate and the cohort size (as ``build_rule``)."""
  train = _train_config(config, algorithm)
  cohort = rounds.num_sampled(config["partition"]["num_clients"],
                              train["participation"])
  filled = {"learning_rate": train["learning_rate"],
            "num_participants": cohort}
  expected = _expected_clients(config, cohort)
  if expected is not None:
    filled["expected_clients"] = expected
  return filled


def _expected_clients(config: dict, cohort: int) -> Optional[float]:
  """The fixed denominator q N = m of a private rule under Poisson
  sampling (McMahan et al. 2018), else None."""
  if (config.get("privacy") or {}).get("sampling") == "poisson":
    return float(cohort)
  return None


def rule_arguments(config: dict, algorithm: str) -> tuple[dict, dict]:
  """An algorithm's full aggregator and objective arguments.

  The factories' defaults, the arguments the runner fills in (the client
  learning rate and cohort size, to rules that take them), then the
  spec's ``aggregator_args`` / ``objective_args``; context arguments
  (``num_clients``, FedACS's model and data) are left out.

  Returns:
    ``(aggregator_args, objective_args)``.
  """
  spec = config["algorithms"][algorithm]
  parameters = _rule_parameters(aggregators.REGISTRY, spec["aggregator"])
  aggregator_args = _defaults(parameters)
  for name, value in _runner_arguments(config, algorithm).items():
    if name in parameters:
      aggregator_args[name] = value
  aggregator_args.update(spec.get("aggregator_args", {}))
  objective = objective_of(spec)
  objective_args = {
      **_defaults(_rule_parameters(objectives.REGISTRY, objective)),
      **spec.get("objective_args", {})}
  return aggregator_args, objective_args


def run_privacy(config: dict, algorithm: str) -> Optional[Privacy]:
  """The accounting of ``algorithm``'s runs (None for a non-private rule):
  the config's "privacy" block with the rule's noise multiplier."""
  spec = config["algorithms"][algorithm]
  if spec.get("aggregator") not in PRIVATE_AGGREGATORS:
    return None
  aggregator_args, _ = rule_arguments(config, algorithm)
  return Privacy(aggregator_args["noise_multiplier"],
                 **(config.get("privacy") or {}))


def build_rule(config: dict, algorithm: str, num_clients: int,
               hparams: Optional[dict] = None, aggregator=None):
  """The aggregator and local objective of one algorithm of ``config``.

  Args:
    config: the experiment config.
    algorithm: a key of ``config["algorithms"]``.
    num_clients: N, the federation size.
    hparams: name -> value replacing the aggregator's or the objective's
      argument of that name (a sweep's grid point; values may be traced).
      "learning_rate" is the client learning rate: it also reaches an
      aggregator that takes one (as the train config's rate does).
    aggregator: a ready aggregator to use instead of the spec's.

  Returns:
    ``(aggregator, objective)``.
  """
  spec = config["algorithms"][algorithm]
  train = _train_config(config, algorithm)
  hparams = dict(hparams or {})
  cohort = rounds.num_sampled(num_clients, train["participation"])
  agg_args = dict(spec.get("aggregator_args", {}))
  factory = aggregators.REGISTRY[spec["aggregator"]]
  for name, value in (("learning_rate", hparams.pop(
      "learning_rate", train["learning_rate"])), ("num_participants",
                                                  cohort),
                      ("expected_clients", _expected_clients(config,
                                                             cohort))):
    if (value is not None and name in _parameters(factory)
        and name not in agg_args):
      agg_args[name] = value
  objective_name = objective_of(spec)
  objective_args = dict(spec.get("objective_args", {}))
  objective_factory = objectives.REGISTRY[objective_name]
  for name, value in hparams.items():
    takers = [args for args, fn in ((agg_args, factory),
                                    (objective_args, objective_factory))
              if name in _parameters(fn)]
    if not takers:
      raise ValueError(
          f"hyperparameter {name!r} is an argument neither of aggregator "
          f"{spec['aggregator']!r} nor of objective {objective_name!r}")
    for args in takers:
      args[name] = value
  if aggregator is None:
    aggregator = aggregators.get(spec["aggregator"], num_clients=num_clients,
                                 **agg_args)
  return aggregator, objectives.get(objective_name, **objective_args)


class Built(NamedTuple):
  """One algorithm of a config, built for a run of one seed::

    built = experiment.build(config, "FedAvg", prepare_data(config, seed))
    simulation.run(*built, seed=seed)

  Attributes:
    model: the network (the config's "model", the algorithm's
      "model_args").
    data: the prepared ``FederatedData`` (``prepare_data``; its provenance
      is ``describe_data``'s).
    test_data: (x, y).
    aggregator: the server rule at the config's arguments.
    options: everything else (``options.RunOptions``): rounds,
      participation, training with the algorithm's objective, execution,
      evaluation (with an attack's scored sets), the client side or the
      attacked local update, privacy, systems and the recorded config.
  """
  model: Model
  data: FederatedData
  test_data: tuple[Any, Any]
  aggregator: Aggregator
  options: RunOptions


def build(config: dict, algorithm: str, prepared, *, aggregator=None,
          progress: bool = False, devices: Any = "config") -> Built:
  """Builds one algorithm of ``config`` on ``prepare_data``'s result.

  Args:
    config: a checked experiment config.
    algorithm: a key of ``config["algorithms"]``.
    prepared: ``prepare_data(config, seed)``.
    aggregator: a ready rule instead of the one the algorithm names (e.g.
      built from a pre-trained state); everything else from ``config``.
    progress: show a progress bar.
    devices: ``Execution.devices``; "config": the config's
      "train.devices".
  """
  train = _train_config(config, algorithm)
  data, test, num_classes, input_shape, _, _ = prepared
  mcfg = config["model"]
  model = models.get(mcfg["name"], num_classes=num_classes,
                     input_shape=input_shape, **{
                         **mcfg.get("args", {}),
                         **config["algorithms"][algorithm].get("model_args",
                                                               {})})
  rule, objective = build_rule(config, algorithm, data.num_clients,
                               aggregator=aggregator)
  execution = Execution(
      clients_per_step=train["clients_per_step"] or None, progress=progress,
      devices=train["devices"] if devices == "config" else devices)
  training = _training(train, objective)
  options = RunOptions(
      num_rounds=train["rounds"], participation=train["participation"],
      training=training, execution=execution,
      evaluation=Evaluation(every=train["eval_every"],
                            clients=train["eval_clients"],
                            personalized=train["personalized"],
                            finetune_steps=train["finetune_steps"],
                            extra=attack_eval_sets(config, test)),
      local_update=local_update(config, algorithm, model, training,
                                execution, data.num_clients),
      privacy=run_privacy(config, algorithm),
      systems=(None if config.get("systems") is None
               else Systems(**config["systems"])),
      config={"experiment": config.get("name"), "algorithm": algorithm,
              **{f"train.{k}": v for k, v in train.items()}})
  return Built(model, data, test, rule, options)


def _training(train: dict, objective) -> LocalTraining:
  """The clients' training of a resolved "train" block."""
  steps_fn = None
  if train["stragglers"]:
    from fedjax_agg import stragglers  # pylint: disable=g-import-not-at-top
    steps_fn = stragglers.stragglers(train["stragglers"],
                                     train["local_epochs"],
                                     train["straggler_unit"])
  return LocalTraining(
      epochs=train["local_epochs"], batch_size=train["batch_size"],
      learning_rate=train["learning_rate"],
      optimizer=client_optimizer(train["optimizer"], train["momentum"],
                                 train["weight_decay"]),
      compute_losses=train["compute_losses"], steps_fn=steps_fn,
      objective=objective, matmul_precision=train["matmul_precision"])


def attack_eval_sets(config: dict, test) -> tuple:
  """The config's attack's scored sets: a backdoor's attack success on the
  triggered test set (``attacks.backdoor_eval_set``), else none."""
  attack = config.get("attack")
  if attack is None or attack.get("name") != "backdoor":
    return ()
  return (attacks.backdoor_eval_set(*test, **attack.get("args", {})),)


def local_update(config: dict, algorithm: str, model,
                 training: LocalTraining, execution: Execution,
                 num_clients: int):
  """The algorithm's client side (``client``), the attacked local
  training (the config's "attack"), or None (plain local training)."""
  spec = config["algorithms"][algorithm]
  if spec.get("client") is None:
    return attack_update(config, model, training, execution, num_clients)
  if spec["client"] in OWN_OBJECTIVE_CLIENTS:
    # SCAFFOLD's and FedDyn's losses are F_k plus their own terms, set by
    # the client.
    training = dataclasses.replace(training, objective=None)
  mesh, _ = distributed.round_mesh(execution.devices)
  return clients.REGISTRY.build(
      spec["client"], model=model, training=training, mesh=mesh,
      clients_per_step=execution.clients_per_step,
      **spec.get("client_args", {}))


def attack_update(config: dict, model, training: LocalTraining,
                  execution: Execution, num_clients: int):
  """The run's local update with the config's attack, or None."""
  if config.get("attack") is None:
    return None
  attack = {**ATTACK_DEFAULTS, **config["attack"]}
  if attack["adversaries"] == "fixed":
    adversaries = attacks.fixed(num_clients, attack["fraction"],
                                seed=attack["seed"])
  else:
    adversaries = attacks.per_round(attack["fraction"])
  mesh, _ = distributed.round_mesh(execution.devices)
  return attacks.local_update(
      model, training, attacks.build(attack["name"], **attack["args"]),
      adversaries, execution=execution, mesh=mesh)
