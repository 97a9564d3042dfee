"""A run's systems (``config.Systems``): population, round plan, uplink.

The run (``fedjax_agg.runner``) asks this module five things:

* ``built(systems)``: the runtime objects a ``config.Systems`` names --
  the uplink codec and the staleness weight -- built once (kept with that
  ``Systems``: a run builds its codec once, however many parts use it),
  after the checks of every name and its arguments (profiles and
  availability too, before the run knows N); a refusal is a
  ``SystemsError`` naming the attribute;
* ``check(systems, plan)``: what a run with systems refuses (a vmapped
  sweep; privacy accounting when the clock selects the clients, since the
  accountant assumes uniform cohorts of m; privacy accounting on a secure
  sum, whose rounding after the rule's clipping raises the sensitivity);
* ``server_rule(...)``: the rule on a simulated secure sum
  (``Systems.secagg_bits``) and, asynchronously, keeping the versions;
* ``uplink(systems, params)``: how the clients' local update is wrapped so
  that their updates go through the codec (``compression.with_codec``),
  or None;
* ``round_plan(...)``: every round's cohort rows, mask and history
  columns, planned up front from the seeds (``systems.plan_rounds``), or
  with ``Systems.concurrency`` every asynchronous server step's buffered
  clients, start versions and staleness (``systems.plan_async``; the step
  itself is ``fedjax_agg.fedbuff``).
"""

import re
import zlib
from typing import Callable, NamedTuple, Optional

import jax
import numpy as np

from fedjax_agg import compression
from fedjax_agg import fedbuff
from fedjax_agg import rounds
from fedjax_agg import secagg
from fedjax_agg import systems as systems_lib
from fedjax_agg.config import LocalTraining, Systems
from fedjax_agg.federated import FederatedData
from fedjax_agg.models import lora
from fedjax_agg.types import Aggregator, LocalUpdate, Params

__all__ = ["Built", "SystemsError", "SystemsTypeError", "async_plan",
           "build_system", "built", "check", "model_bytes", "round_plan",
           "server_rule", "trace_fingerprint", "uplink"]


class SystemsError(ValueError):
  """A ``config.Systems`` attribute the systems layer refuses.

  Attributes:
    field: the attribute at fault (e.g. "codec_args").
  """

  def __init__(self, field: str, message: str):
    # A message that already starts with the attribute keeps its words.
    super().__init__(message if re.match(rf"{field}\b", message)
                     else f"{field}: {message}")
    self.field = field


class SystemsTypeError(SystemsError, TypeError):
  """A ``SystemsError`` of a value of the wrong type."""


class Built(NamedTuple):
  """What a ``config.Systems`` names, built (``built``).

  Attributes:
    codec: the uplink ``compression.Codec``, or None (float32 updates).
    staleness: the staleness weight w(s) (jit-able).
  """
  codec: Optional[compression.Codec]
  staleness: Callable


_BUILT = "_built_runtime"  # where a Systems keeps its Built


def built(systems: Systems) -> Built:
  """``systems``' codec and staleness weight, built the first time they
  are asked for and kept with ``systems`` (one build a run); every name
  and its arguments are checked first.

  Raises:
    SystemsError: naming the attribute (e.g. ``codec_args``) and what is
      wrong.
  """
  if not isinstance(systems, Systems):
    raise TypeError(f"systems must be a config.Systems, got "
                    f"{type(systems).__name__}")
  kept = systems.__dict__.get(_BUILT)
  if kept is not None:
    return kept

  def named(field, build, *args, **kwargs):
    try:
      return build(*args, **kwargs)
    except TypeError as error:
      raise SystemsTypeError(field, str(error)) from None
    except ValueError as error:
      raise SystemsError(field, str(error)) from None
  named("profiles", _check_choice, "profiles", systems.profiles,
        systems_lib.PROFILES.names + ("trace",))
  named("availability", _check_choice, "availability", systems.availability,
        systems_lib.AVAILABILITY.names)
  named("over_selection", systems_lib.check_over_selection,
        systems.over_selection)
  # The models' own argument checks, before the run knows N (the error
  # names the argument; its attribute is the one of the model named).
  try:
    systems_lib.check_model_arguments(
        systems.profiles, systems.profile_args, systems.availability,
        systems.availability_args, systems.seed)
  except (TypeError, ValueError) as error:
    # Its messages start with the attribute they are about.
    field = ("availability_args"
             if str(error).startswith("availability_args")
             else "profile_args")
    kind = SystemsTypeError if isinstance(error, TypeError) else SystemsError
    raise kind(field, str(error)) from None
  codec = None
  if systems.codec is not None:
    named("codec", _check_choice, "codec", systems.codec,
          compression.CODECS.names)
    codec = named("codec_args", compression.get, systems.codec,
                  **systems.codec_args)
  named("staleness", _check_choice, "staleness", systems.staleness,
        systems_lib.STALENESS.names)
  named("staleness_args", systems_lib.STALENESS.check_arguments,
        systems.staleness, systems.staleness_args, "staleness_args")
  staleness = named("staleness_args", systems_lib.STALENESS.build,
                    systems.staleness, **systems.staleness_args)
  kept = Built(codec, staleness)
  object.__setattr__(systems, _BUILT, kept)  # a cache, not a field
  return kept


# config sits below this layer and cannot import it; its deprecated
# ``Systems.build_codec`` / ``build_staleness`` reach ``built`` through this.
Systems._runtime_builder = staticmethod(built)  # pylint: disable=protected-access


def _check_choice(name, value, names) -> None:
  if not isinstance(value, str) or value not in names:
    raise ValueError(f"{name} must be one of {list(names)}, got {value!r}")


def check(systems: Optional[Systems], *, vmapped: bool, privacy,
          local_update=None, stream: Optional[bool] = None) -> None:
  """Refuses what a run with ``systems`` cannot do (module docstring)."""
  if systems is None:
    return
  built(systems)  # its names and arguments, and its objects, once
  if vmapped:
    raise ValueError(
        "systems: a sweep steps its members with one shared cohort mask, "
        "which a simulated clock or codec per member cannot use; run the "
        "members one at a time (simulation.run, or one seed per run)")
  if privacy is not None and (systems.selects or (
      privacy.sampling == "poisson")):
    raise ValueError(
        "systems: the privacy accountant assumes cohorts of m clients drawn "
        "uniformly (or Poisson); a clock that selects clients (availability "
        f"{systems.availability!r}, over_selection="
        f"{systems.over_selection}, deadline_s={systems.deadline_s}, "
        f"concurrency={systems.concurrency}) or Poisson cohorts break that; "
        "drop one of them")
  if privacy is not None and systems.secagg_bits is not None:
    # secagg.py: stochastic rounding after the rule's L2 clip moves each
    # coordinate by up to one level R / L, so a client's decoded update
    # can reach ||clip_C(x)|| + (R / L) sqrt(d), far above the clip norm C
    # the accountant's sensitivity assumes (C = 0.5 spread over 10^5
    # coordinates, 8 bits, 10 clients: about 3.6).
    raise ValueError(
        f"systems.secagg_bits={systems.secagg_bits} with privacy: secure "
        "aggregation rounds each client's clipped update stochastically "
        "after the rule's clipping, which can move it by up to one level "
        "per coordinate, above the clip norm the privacy accountant takes "
        "as the sensitivity; the epsilon would not hold. Drop privacy or "
        "secagg_bits")
  if systems.asynchronous:
    if local_update is not None:
      raise ValueError(
          "local_update: asynchronous aggregation (systems.concurrency) "
          "trains with the engine's own trainer from each client's start "
          "version; a custom local update (stateful clients, attacks) "
          "cannot run asynchronously")
    if stream:
      raise ValueError(
          "execution.stream=True: an asynchronous step aggregates the "
          "buffered clients' virtual models (stacked), it cannot stream")


def server_rule(systems: Optional[Systems], aggregator: Aggregator,
                cohort_size: int, data: FederatedData) -> Aggregator:
  """The run's rule as the systems make it: on a secure sum
  (``secagg.secure_aggregation``, its fixed point sized for the round's
  rows) and, asynchronously, keeping the global versions clients start
  from (``fedbuff.buffered``)."""
  if systems is None:
    return aggregator
  if systems.secagg_bits is not None:
    rows = (cohort_size if systems.asynchronous else
            systems_lib.num_selected(cohort_size, systems.over_selection,
                                     data.num_clients))
    try:
      aggregator = secagg.secure_aggregation(
          aggregator, bits=systems.secagg_bits, clip=systems.secagg_clip,
          cohort_size=rows,
          max_examples=float(np.max(np.asarray(data.num_examples))))
    except ValueError as error:
      raise ValueError(f"systems.secagg_bits: {error}") from None
  if systems.asynchronous:
    aggregator = fedbuff.buffered(aggregator,
                                  systems.num_versions(cohort_size))
  return aggregator


def trace_fingerprint(systems: Optional[Systems]) -> dict:
  """The content (size and CRC-32) of every trace file the systems read,
  by argument: a checkpoint resumes only on the same traces, not merely
  the same paths."""
  if systems is None:
    return {}
  out = {}
  for name in ("profile_args", "availability_args"):
    path = getattr(systems, name).get("path")
    if path is not None:
      with open(path, "rb") as f:
        content = f.read()
      out[name] = {"bytes": len(content), "crc32": zlib.crc32(content)}
  return out


def model_bytes(params: Params) -> int:
  """Bytes of the model as sent down: every leaf in its dtype."""
  return int(sum(np.dtype(leaf.dtype).itemsize * int(np.prod(leaf.shape))
                 for leaf in jax.tree.leaves(params)))


def _update_bytes(systems: Systems, params: Params,
                  rule: Optional[Aggregator]) -> int:
  # What a client sends: of LoRA adapters A and B, not the frozen leaves
  # the server keeps (FLoRA's "merged").
  params = lora.sent(params)
  if systems.secagg_bits is not None:
    # The secure sum's b-bit message replaces whatever the codec sent.
    return secagg.message_bytes(rule, params, systems.secagg_bits)
  codec = built(systems).codec
  if codec is None:
    return model_bytes(jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, np.float32), params))
  return compression.message_bytes(codec, params)


def uplink(systems: Optional[Systems], params: Params
           ) -> Optional[Callable[[LocalUpdate], LocalUpdate]]:
  """``inner -> inner`` with its updates sent through the codec, or None
  (also for an asynchronous run, whose step applies the codec itself)."""
  if systems is None or systems.codec is None or systems.asynchronous:
    return None
  codec = built(systems).codec
  template = jax.tree.map(
      lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), params)
  return lambda inner: compression.with_codec(
      codec, inner, error_feedback=systems.error_feedback,
      model_template=template)


def build_system(systems: Systems, params: Params, data: FederatedData,
                 training: LocalTraining,
                 rule: Optional[Aggregator] = None) -> systems_lib.System:
  """The population's ``System``: profiles and availability from the
  config (seeded by ``systems.seed``) and each client's task: all its
  epochs of full batches, the model down and the update up (coded, or
  under secure aggregation the b-bit message of ``rule``'s statistics:
  ``rule`` is the run's rule before the systems wrap it)."""
  num_clients = data.num_clients
  if systems.profiles == "trace":
    profiles = systems_lib.read_profiles(systems.profile_args["path"],
                                         num_clients)
  else:
    profiles = systems_lib.PROFILES.build(
        systems.profiles, num_clients=num_clients, seed=systems.seed,
        **systems.profile_args)
  availability = systems_lib.AVAILABILITY.build(
      systems.availability, num_clients=num_clients, seed=systems.seed,
      **systems.availability_args)
  batch = training.batch_size
  counts = np.asarray(data.num_examples, np.int64)
  examples = -(-counts // batch) * batch * training.epochs
  workload = systems_lib.Workload(
      examples=examples.astype(np.float64),
      down_bytes=float(model_bytes(params)),
      up_bytes=float(_update_bytes(systems, params, rule)))
  return systems_lib.System(profiles, availability, workload)


def async_plan(systems: Systems, system: systems_lib.System,
               num_rounds: int, cohort_size: int,
               seed: int) -> systems_lib.AsyncPlan:
  """Every asynchronous server step (buffer K = ``cohort_size``), from the
  run's ``seed``; refuses C < K or C > N by name."""
  if not cohort_size <= systems.concurrency <= system.num_clients:
    raise ValueError(
        f"systems.concurrency={systems.concurrency} must lie between the "
        f"buffer size K={cohort_size} (the cohort size, participation x N) "
        f"and the number of clients N={system.num_clients}")
  plan = systems_lib.plan_async(
      system, num_rounds, systems.concurrency, cohort_size, seed,
      max_staleness=systems.num_versions(cohort_size) - 1)
  if not np.isfinite(plan.sim_time_s).all():
    raise ValueError("systems: the simulated clock ran to infinity (a "
                     "client with zero speed or bandwidth?)")
  return plan


def round_plan(systems: Systems, system: systems_lib.System,
               sample_keys: jax.Array, num_rounds: int, cohort_size: int,
               sampler: str) -> systems_lib.RoundPlan:
  """Every round's cohort rows and history columns.

  When the clock only measures (``Systems.selects`` false) round r's
  cohort is the run's own (``rounds.sample_cohort`` with the round's
  key), so the run equals the one without the clock; otherwise the
  candidates are a permutation of every client drawn from the same key.
  """
  num_clients = system.num_clients
  if systems.selects:
    draw = jax.jit(lambda key: jax.random.permutation(key, num_clients))
  else:
    draw = jax.jit(lambda key: rounds.sample_cohort(
        key, num_clients, cohort_size, sampler))
  plan = systems_lib.plan_rounds(
      system, lambda r: np.asarray(draw(sample_keys[r])), num_rounds,
      cohort_size, over_selection=systems.over_selection,
      deadline_s=systems.deadline_s)
  if not np.isfinite(plan.sim_time_s).all():
    raise ValueError("systems: the simulated clock ran to infinity (a "
                     "client with zero speed or bandwidth?)")
  return plan
