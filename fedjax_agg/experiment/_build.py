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
from typing import Any, NamedTuple, Optional, Sequence

import jax

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import checkpoint
from fedjax_agg import clients
from fedjax_agg import distributed
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg import registry
from fedjax_agg import rounds
from fedjax_agg import spec as spec_lib
from fedjax_agg.experiment import _base
from fedjax_agg.models import lora
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.federated import FederatedData
from fedjax_agg.options import RunOptions
from fedjax_agg.types import Aggregator, Model


def check_config(config, allow_imports: Sequence[str] = ()
                 ) -> spec_lib.Experiment:
  """A JSON config (or an ``Experiment``, returned as it is) -> the
  checked ``spec.Experiment`` (``Experiment.from_dict``: every key and
  value checked before anything runs, a ``spec.ConfigError`` naming the
  key path of the first bad entry).

  Checking imports and calls nothing outside the library: a
  ``module:factory`` name resolves only for a module in ``allow_imports``
  (or allowed with ``fedjax_agg.registry.allow_imports``) and an object
  declared as that kind of factory."""
  with registry.allowing_imports(allow_imports):
    return spec_lib.Experiment.from_dict(config)


def _parameters(factory) -> set[str]:
  return set(inspect.signature(factory).parameters)


def build_rule(experiment: spec_lib.Experiment, algorithm: str,
               num_clients: int, hparams: Optional[dict] = None,
               aggregator=None):
  """The aggregator and local objective of one algorithm.

  Args:
    experiment: the ``spec.Experiment`` (or a JSON config, read by
      ``spec.Experiment.from_dict``).
    algorithm: a key of its ``algorithms``.
    num_clients: N, the federation size.
    hparams: name -> value replacing the aggregator's or the objective's
      argument of that name (a sweep's grid point; values may be traced).
      "learning_rate" is the client learning rate: it also reaches an
      aggregator that takes one (as the training's rate does).
    aggregator: a ready aggregator to use instead of the spec's.

  Returns:
    ``(aggregator, objective)``.
  """
  experiment = spec_lib.Experiment.from_dict(experiment)
  spec = experiment.algorithms[algorithm]
  train = experiment.train_of(algorithm)
  hparams = dict(hparams or {})
  # The description's cohort size, computed once (its data has the
  # partition's clients); other data (a caller's) gets its own.
  cohort = (experiment.cohort_size(algorithm)
            if num_clients == experiment.partition.num_clients
            else rounds.num_sampled(num_clients, train.participation))
  agg_args = dict(spec.aggregator_args)
  factory = aggregators.REGISTRY[spec.aggregator]
  expected = (float(cohort) if experiment.expected_clients(algorithm)
              is not None else None)
  for name, value in (("learning_rate", hparams.pop(
      "learning_rate", train.learning_rate)), ("num_participants", cohort),
                      ("expected_clients", expected)):
    # Only to rules that take the argument, and never over one the algorithm
    # gives itself.
    if (value is not None and name in _parameters(factory)
        and name not in agg_args):
      agg_args[name] = value
  objective_name = spec.objective
  objective_args = dict(spec.objective_args)
  objective_factory = objectives.REGISTRY[objective_name]
  for name, value in hparams.items():
    takers = [args for args, fn in ((agg_args, factory),
                                    (objective_args, objective_factory))
              if name in _parameters(fn)]
    if not takers:
      raise ValueError(
          f"hyperparameter {name!r} is an argument neither of aggregator "
          f"{spec.aggregator!r} nor of objective {objective_name!r}")
    # An argument of both the rule and the objective is set in both, so a grid
    # point never leaves the two disagreeing.
    for args in takers:
      args[name] = value
  if aggregator is None:
    aggregator = aggregators.get(spec.aggregator, num_clients=num_clients,
                                 **agg_args)
  return aggregator, objectives.get(objective_name, **objective_args)


class Built(NamedTuple):
  """One algorithm of a config, built for a run of one seed::

    built = experiment.build(spec, "FedAvg", prepare_data(spec, seed))
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


def build(experiment: spec_lib.Experiment, algorithm: str, prepared, *,
          aggregator=None, progress: bool = False,
          devices: Any = "config") -> Built:
  """Builds one algorithm of ``experiment`` on ``prepare_data``'s result.

  Args:
    experiment: the ``spec.Experiment`` (a JSON config is read with
      ``spec.Experiment.from_dict``).
    algorithm: a key of its ``algorithms``.
    prepared: ``prepare_data(experiment, seed)``.
    aggregator: a ready rule instead of the one the algorithm names (e.g.
      built from a pre-trained state); everything else from
      ``experiment``.
    progress: show a progress bar.
    devices: ``Execution.devices``; "config": the training's ``devices``.
  """
  experiment = spec_lib.Experiment.from_dict(experiment)
  train = experiment.train_of(algorithm)
  data, test, num_classes, input_shape, _, _ = prepared
  model, init_params = _model(experiment, algorithm, num_classes,
                              input_shape)
  rule, objective = build_rule(experiment, algorithm, data.num_clients,
                               aggregator=aggregator)
  # Each run object made from its "train" keys (``TrainSpec.make``).
  execution = train.make(Execution, progress=progress, **(
      {} if devices == "config" else {"devices": devices}))
  training = train.training(objective)
  systems = experiment.systems
  options = train.make(
      RunOptions, training=training, execution=execution,
      evaluation=train.make(Evaluation,
                            extra=attack_eval_sets(experiment, test)),
      local_update=local_update(experiment, algorithm, model, training,
                                execution, data.num_clients),
      privacy=experiment.privacy_of(algorithm), init_params=init_params,
      systems=None if systems is None else systems.run_object(),
      config={"experiment": experiment.name, "algorithm": algorithm,
              **_base.base_files(experiment.model),
              **{f"train.{k}": value
                 for k, value in dataclasses.asdict(train).items()}})
  return Built(model, data, test, rule, options)


def _model(experiment: spec_lib.Experiment, algorithm: str, num_classes,
           input_shape):
  """-> (the run's network, its initial params or None for
  ``model.init``): the network of the "model" section, started from its
  pre-trained ``base``, or with adapters (the model's, or the
  algorithm's over them: ``Experiment.adapters_of``) the LoRA network
  over that base (frozen, shared by every client) whose params are the
  adapters."""
  spec = experiment.model
  options = {**spec.args, **experiment.algorithms[algorithm].model_args}
  variables = None
  if spec.name == models.PRETRAINED:  # a downloaded checkpoint's network
    model, variables = _base.pretrained_model(spec.base, options,
                                              num_classes, input_shape)
  elif spec.name in models.NAMES:
    model = models.get(spec.name, num_classes=num_classes,
                       input_shape=input_shape, **options)
  else:  # a declared network of the user's (``module:factory``)
    try:
      model = models.REGISTRY.build(spec.name, num_classes=num_classes,
                                    input_shape=tuple(input_shape),
                                    **options)
    except (TypeError, ValueError) as error:
      raise spec_lib.ConfigError("model.name",
                                 f"model.name: {error}") from None
    if not isinstance(model, Model):
      raise spec_lib.ConfigError(
          "model.name", f"model.name: {spec.name!r} returned a "
          f"{type(model).__name__}, not a fedjax_agg.types.Model")
  if spec.base is not None and variables is None:
    # Shapes only: the template tells the restore the tree and shapes without
    # initializing a network that is about to be replaced.
    template = jax.eval_shape(model.init, jax.random.key(0))
    try:
      variables = checkpoint.load_variables(spec.base, template)
    except checkpoint.CheckpointError as error:
      raise spec_lib.ConfigError("model.base", f"model.base: {error}"
                                 ) from None
  adapters = experiment.adapters_of(algorithm)
  if adapters is None:
    return model, variables
  where = ("model.adapters" if not experiment.algorithms[algorithm].adapters
           else f"algorithms.{algorithm}.adapters")
  # The adapters' seed, not the run's: every seed of a run shares one base and
  # one frozen A. The base draws from a key folded apart from the one the
  # adapters use.
  key = jax.random.key(adapters.seed)
  if variables is None:
    variables = model.init(jax.random.fold_in(key, 1))
  aggregator = experiment.algorithms[algorithm].aggregator
  try:
    adapted = lora.lora(model, variables, rank=adapters.rank,
                        alpha=adapters.alpha, targets=adapters.patterns(),
                        dropout=adapters.dropout, key=key,
                        **aggregators.REGISTRY.capabilities(
                            aggregator).model_options)
  except (TypeError, ValueError) as error:
    raise spec_lib.ConfigError(where, f"{where}: {error}") from None
  return adapted, None


def attack_eval_sets(experiment: spec_lib.Experiment, test) -> tuple:
  """The attack's scored sets: a backdoor's attack success on the
  triggered test set (``attacks.backdoor_eval_set``), else none."""
  attack = experiment.attack
  if attack is None:
    return ()
  # Declared with the attack (``Capabilities.eval_sets``).
  scored = attacks.REGISTRY.capabilities(attack.name).eval_sets
  return () if scored is None else tuple(scored(*test, **attack.args))


def local_update(experiment: spec_lib.Experiment, algorithm: str, model,
                 training: LocalTraining, execution: Execution,
                 num_clients: int):
  """The algorithm's client side (``client``), the attacked local
  training (the experiment's ``attack``), or None (plain local
  training)."""
  spec = experiment.algorithms[algorithm]
  if spec.client is None:
    return attack_update(experiment, model, training, execution, num_clients)
  if clients.REGISTRY.capabilities(spec.client).own_objective:
    # Such a client side (SCAFFOLD, FedDyn, APFL) sets its own loss, F_k
    # plus its own terms; the plain objective is left to it.
    training = dataclasses.replace(training, objective=None)
  mesh, _ = distributed.round_mesh(execution.devices)
  return clients.REGISTRY.build(
      spec.client, model=model, training=training, mesh=mesh,
      clients_per_step=execution.clients_per_step, **spec.client_args)


def attack_update(experiment: spec_lib.Experiment, model,
                  training: LocalTraining, execution: Execution,
                  num_clients: int):
  """The run's local update with the experiment's attack, or None."""
  attack = experiment.attack
  if attack is None:
    return None
  if attack.adversaries == "fixed":
    adversaries = attacks.fixed(num_clients, attack.fraction,
                                seed=attack.seed)
  else:
    adversaries = attacks.per_round(attack.fraction)
  mesh, _ = distributed.round_mesh(execution.devices)
  return attacks.local_update(
      model, training, attacks.build(attack.name, **attack.args),
      adversaries, execution=execution, mesh=mesh)
