"""The checks that a description's rules fit the rest of it.

Part of ``Experiment``'s checks that need two of its sections
(``_experiment``): each algorithm's model arguments and optimizer, a
client side with the rule it needs (``PAIRED_RULES``), personal models
with a client side that keeps them (``PERSONAL_CLIENTS``), LoRA adapters
with the rules defined for them, its objective and aggregator built with
their full arguments and bound to the run, under secure aggregation
traced through the secure sum; an attack on a task it is defined for;
a privacy target that one round does not already miss.
"""

import inspect
import typing
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import clients
from fedjax_agg import data as data_lib
from fedjax_agg import objectives
from fedjax_agg import privacy as privacy_lib
from fedjax_agg.registry import ArgumentError
from fedjax_agg.registry import Capabilities
from fedjax_agg import secagg
from fedjax_agg import systems as systems_lib
from fedjax_agg import types
from fedjax_agg.spec import _values as v

if typing.TYPE_CHECKING:
  from fedjax_agg.spec._experiment import Experiment

PAIRED_RULES = {name: clients.REGISTRY.capabilities(name).pairs_with
                for name in clients.REGISTRY
                if clients.REGISTRY.capabilities(name).pairs_with}
"""The built-in client sides' pairs: client side -> (the server rule it
needs, the argument both must share); the checks read each entry's
``registry.Capabilities.pairs_with``."""


PERSONAL_CLIENTS = clients.REGISTRY.having(personal=True)
"""The built-in client sides with personal models (a ``personalize``);
the checks read each entry's ``registry.Capabilities.personal``."""


def _client_caps(spec):
  return (Capabilities() if spec.client is None
          else clients.REGISTRY.capabilities(spec.client))


def _check_attack(experiment: "Experiment",
                  task: Optional[str] = None) -> None:
  """An attack on a task it is defined for (``task``: the data's, where
  it was read; else the federation's where known before its files are
  read), on plain local training."""
  attack = experiment.attack
  if attack is None:
    return
  dataset = experiment.dataset
  if task is None:
    task = data_lib.federation_task(dataset.name, dataset.args)
  tasks = attacks.REGISTRY.capabilities(attack.name).tasks
  if task is not None and tasks is not None and task not in tasks:
    raise v.ConfigError(
        "attack", f"attack: {attack.name} is defined for "
        f"{' and '.join(tasks)} tasks; dataset {dataset.name!r} is a "
        f"{task} task (per-token targets, no class to relabel with)")
  for name, spec in experiment.algorithms.items():
    if spec.client is not None:
      raise v.ConfigError(
          "attack", f"attack: {name} has a client side ({spec.client!r}); "
          "attacks replace the plain local training and are not combined "
          "with a client side")


def _train_key(experiment: "Experiment", name: str, key: str) -> str:
  """Where ``key`` of ``name``'s training is set: its override, else the
  "train" section."""
  if key in experiment.algorithms[name].train:
    return f"algorithms.{name}.train.{key}"
  return f"train.{key}"


def _check_algorithm(experiment: "Experiment", name: str) -> None:
  """An algorithm with the setting: its model arguments, its optimizer,
  its client side's rule and what personal evaluation needs."""
  spec, path = experiment.algorithms[name], f"algorithms.{name}"
  v.model_arguments(f"{path}.model_args", experiment.model.name,
                    {**experiment.model.args, **spec.model_args})
  _check_adapters(experiment, name)
  _check_client_arguments(experiment, name)
  train = experiment.train_of(name)  # its keys together: TrainSpec's
  if _client_caps(spec).pairs_with:
    rule, shared = _client_caps(spec).pairs_with
    if spec.aggregator != rule:
      raise v.ConfigError(
          f"{path}.aggregator", f"{path}.aggregator: the {spec.client} "
          f"client needs the {rule!r} rule (its server side), got "
          f"{spec.aggregator!r}; pair the client side with its own rule "
          f"(e.g. clients.{spec.client} with aggregators.{rule})")
    # Both values as the run builds them: the client's falls back to its
    # factory's default, the rule's is its full argument.
    ours = spec.client_args.get(shared, clients.REGISTRY.parameters(
        spec.client)[shared].default)
    theirs = experiment.rule_arguments(name)[0][shared]
    if ours != theirs:
      raise v.ConfigError(
          f"{path}.client_args.{shared}", f"{path}.client_args.{shared}: "
          f"the {spec.client} client and rule must share {shared}, got "
          f"{ours!r} (client) and {theirs!r} (aggregator_args)")
  if train.personalized and not _client_caps(spec).personal:
    key = _train_key(experiment, name, "personalized")
    raise v.ConfigError(key, f"{key}: personal models need a client side "
                        "that keeps them "
                        f"({list(clients.REGISTRY.having(personal=True))}), "
                        f"got {path}.client={spec.client!r}")
  if ((train.personalized or train.finetune_steps)
      and not experiment.partition.holdout_fraction):
    raise v.ConfigError(
        "partition.holdout_fraction", "partition.holdout_fraction: "
        f"{name}'s personalized / finetune_steps evaluate on each client's "
        "held-out split; set a fraction in (0, 1)")


def _check_client_arguments(experiment: "Experiment", name: str) -> None:
  """The client side's own checks of its ``client_args`` against the run
  (``Capabilities.check_arguments``, declared with it), naming the key."""
  spec, path = experiment.algorithms[name], f"algorithms.{name}"
  check = _client_caps(spec).check_arguments
  if check is None:
    return
  adapters = experiment.adapters_of(name)
  # What the run fixes, from the description alone: the check runs before any
  # data is read.
  run = {"num_clients": experiment.partition.num_clients,
         "rank": None if adapters is None else adapters.rank,
         "objective": spec.objective}
  try:
    check(dict(spec.client_args), run)
  except ArgumentError as error:
    raise v.refusal(f"{path}.{error.key}", error, f"{path}.{error}") from None
  except (TypeError, ValueError) as error:  # a check that names no key
    where = f"{path}.client_args"
    raise v.refusal(where, error, f"{where}: {error}") from None


def _check_adapters(experiment: "Experiment", name: str) -> None:
  """LoRA adapters go with the rules defined for them, and only there."""
  spec, path = experiment.algorithms[name], f"algorithms.{name}"
  adapters = experiment.adapters_of(name)
  where = ("model.adapters" if adapters is None or not spec.adapters
           else f"{path}.adapters")
  rule = aggregators.REGISTRY.capabilities(spec.aggregator).adapters
  client = _client_caps(spec).adapters
  if adapters is None:
    if "only" in (rule, client):
      key = "aggregator" if rule == "only" else "client"
      raise v.ConfigError(
          f"{path}.{key}", f"{path}.{key}: {getattr(spec, key)!r} works on "
          "LoRA adapters; set model.adapters or the algorithm's adapters "
          "(e.g. {\"rank\": 8}, --lora-rank 8)")
    return
  if rule == "no":
    defined = [n for n in aggregators.REGISTRY
               if aggregators.REGISTRY.capabilities(n).adapters != "no"]
    raise v.ConfigError(
        f"{path}.aggregator", f"{path}.aggregator: {spec.aggregator!r} "
        "aggregates whole models (their coordinates, norms or angles), not "
        f"LoRA adapters ({where}); use a rule defined for adapters "
        f"{defined}, or \"adapters\": null in the algorithm "
        "to train the whole model")
  if spec.client is not None and client == "no":
    defined = [n for n in clients.REGISTRY
               if clients.REGISTRY.capabilities(n).adapters != "no"]
    raise v.ConfigError(
        f"{path}.client", f"{path}.client: the {spec.client} client side "
        f"trains whole models, not LoRA adapters ({where}); the client "
        f"sides defined for adapters are {defined}")
  adapters.check_targets(
      f"{path}.adapters" if "targets" in (spec.adapters or {})
      else "model.adapters", experiment.model.name,
      {**experiment.model.args, **spec.model_args})


def _built_rules(experiment: "Experiment", name: str) -> dict:
  """The algorithm's objective and aggregator built with their full
  arguments, at "objective_args" and "aggregator_args" (each left out
  where its factory needs what only a script passes)."""
  spec = experiment.algorithms[name]
  aggregator_args, objective_args = experiment.rule_arguments(name)
  built = {}
  for registry, rule, arguments, key in (
      (objectives.REGISTRY, spec.objective, objective_args,
       "objective_args"),
      (aggregators.REGISTRY, spec.aggregator, aggregator_args,
       "aggregator_args")):
    needs = [arg for arg, p in registry.parameters(rule).items()
             if p.default is inspect.Parameter.empty
             and arg not in arguments and arg != "num_clients"]
    if needs:  # E.g. FedACS's model and evaluation data: built by a script.
      continue
    context = ({"num_clients": experiment.partition.num_clients}
               if "num_clients" in registry.context else {})
    built[key] = v.built(f"algorithms.{name}.{key}", registry.build, rule,
                         **arguments, **context)
  return built


def _check_rules(experiment: "Experiment", name: str) -> None:
  """Builds the algorithm's objective and aggregator with their full
  arguments, binds the aggregator to what the run fixes
  (``Experiment.run_context``) and, under secure aggregation, traces its
  client statistics as the secure sum does: the factories' and the
  binding's own checks then name a bad one before anything is read or
  written, whichever entry point runs it."""
  built = _built_rules(experiment, name)
  rule = built.get("aggregator_args")
  if not isinstance(rule, types.Aggregator):
    return
  if rule.from_run is not None and "objective_args" in built:
    rule = _bound(experiment, name, rule, built["objective_args"])
  _check_secure_sum(experiment, name, rule)


def _bound(experiment: "Experiment", name: str, rule: types.Aggregator,
           objective) -> types.Aggregator:
  """``rule`` bound to the run's settings (``Aggregator.from_run``); a
  contradiction names the algorithm's argument that the run's value
  differs from, else its aggregator."""
  spec, path = experiment.algorithms[name], f"algorithms.{name}"
  try:
    return rule.from_run(experiment.run_context(name, objective))
  except (TypeError, ValueError) as error:
    # ``from_run`` names a contradicted argument as ``arg=value``; that text
    # maps the error back to the key the user wrote.
    key = next((f"{path}.aggregator_args.{arg}"
                for arg, value in spec.aggregator_args.items()
                if f"{arg}={value!r}" in str(error)), f"{path}.aggregator")
    raise v.refusal(key, error, f"{key}: {error}") from None


# A model of two leaves that the secure sum's statistics are traced on
# (their shapes only: ``jax.eval_shape``).
_PROBE_PARAMS = {"params": {"kernel": jax.ShapeDtypeStruct((2, 2),
                                                            jnp.float32),
                            "bias": jax.ShapeDtypeStruct((2,),
                                                         jnp.float32)}}


def _check_secure_sum(experiment: "Experiment", name: str,
                      rule: types.Aggregator) -> None:
  """Under secure aggregation ("systems.secagg_bits"), ``rule`` wrapped
  as the run wraps it (``secagg.secure_aggregation`` sized for the
  round's rows): a rule that is no sum over clients is refused, and so is
  one whose client statistics trace on a small model with a client's
  round information but not inside the secure sum (its range probe
  fails): refused here rather than in the first round. A rule whose
  statistics need another model (LoRA adapters) is left to the run."""
  systems = experiment.systems
  if systems is None or systems.secagg_bits is None:
    return
  cohort = experiment.cohort_size(name)
  # The secure sum is sized for the rows a round trains: the cohort, plus the
  # over-selected clients in a synchronous round.
  rows = (cohort if systems.concurrency is not None else
          systems_lib.num_selected(cohort, systems.over_selection,
                                   experiment.partition.num_clients))
  scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype)
  info = types.ClientInfo(
      client_ids=scalar(jnp.int32), num_examples=scalar(jnp.float32),
      mask=scalar(jnp.float32), loss_before=scalar(jnp.float32),
      loss_after=scalar(jnp.float32), round=scalar(jnp.int32),
      key=jax.ShapeDtypeStruct((2,), jnp.uint32),
      num_steps=scalar(jnp.int32))
  try:
    # Traced with eval_shape on shapes only: nothing is computed or allocated,
    # so the check costs a trace, not a round.
    secure = secagg.secure_aggregation(
        rule, bits=systems.secagg_bits, clip=systems.secagg_clip,
        cohort_size=rows, max_examples=1.0)
    try:
      jax.eval_shape(rule.stream.client_stats, _PROBE_PARAMS, _PROBE_PARAMS,
                     info)
    except (TypeError, ValueError):
      return  # not a model this rule aggregates: the run checks it
    jax.eval_shape(secure.stream.client_stats, _PROBE_PARAMS,
                   _PROBE_PARAMS, info)
  except (TypeError, ValueError) as error:
    raise v.ConfigError(
        "systems.secagg_bits", f"systems.secagg_bits: algorithms.{name} "
        f"({experiment.algorithms[name].aggregator}): {error}") from None


def _check_privacy_target(experiment: "Experiment") -> None:
  """A target epsilon that even one round of a private algorithm passes is
  refused here, before the data is read (the run would end at round 0)."""
  if experiment.privacy is None or experiment.privacy.target_epsilon is None:
    return
  target = experiment.privacy.target_epsilon
  num_clients = experiment.partition.num_clients
  for name in experiment.algorithms:
    privacy = experiment.privacy_of(name)
    if privacy is None:
      continue
    cohort = experiment.cohort_size(name)
    noise = getattr(_built_rules(experiment, name).get("aggregator_args"),
                    "noise_multiplier", None)
    if isinstance(noise, aggregators.TreeAggregationNoise):
      # Tree aggregation, as the rule declares its noise and the run's
      # accountant reads it: round 1 is one node, each client in it once,
      # whatever cohort is drawn (no amplification by sampling).
      first = privacy_lib.tree_epsilons(
          privacy.noise_multiplier, np.arange(cohort)[None],
          delta=privacy.delta, restart_every=noise.restart_every)[0]
    else:
      first = privacy_lib.epsilon(
          privacy.noise_multiplier, 1, num_clients=num_clients,
          cohort_size=cohort, delta=privacy.delta,
          sampling=privacy.sampling, accountant=privacy.accountant)
    if first > target:
      raise v.ConfigError(
          "privacy.target_epsilon",
          f"privacy.target_epsilon: {target} cannot be met by "
          f"{name}: a single round already costs epsilon={first:.4g} "
          f"(noise_multiplier={privacy.noise_multiplier}); raise the "
          "target or the noise")
