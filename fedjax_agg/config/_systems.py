"""The clients' systems: ``Systems``, whose fields declare their
command-line flags (it is the description's "systems" section). Part of
``fedjax_agg.config``.
"""

import dataclasses
import math
from typing import Optional
import warnings


from fedjax_agg import checks
from fedjax_agg import registry
from fedjax_agg import systems as systems_lib
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field as _field


def _check_arguments(name: str, value) -> None:
  if not isinstance(value, dict) or not all(
      isinstance(k, str) for k in value):
    raise TypeError(f"{name} must be a dict of keyword arguments, got "
                    f"{value!r}")


@dataclasses.dataclass(frozen=True)
class Systems:
  """The clients' systems: a simulated clock and what travels on the wire.

  Every run with a ``Systems`` records, after each round, ``sim_time_s``
  (simulated wall-clock since the start), ``uplink_bytes`` and
  ``downlink_bytes`` (cumulative, exact: the model's bytes down to every
  selected client, the codec's message up from every aggregated one) and
  ``dropped`` (selected clients that went offline or missed the deadline).
  A client's task takes epochs x its batches x batch size / speed + model
  bytes / downlink + message bytes / uplink (``systems.task_time``).

  With every client always online, no over-selection and no deadline the
  clock only measures: the run's cohorts and results are those of the run
  without it. Otherwise each round's candidates are the seeded cohort
  order's clients online at the round's start; the round aggregates the
  first m to finish (m = the cohort size) and ends when the last of them
  reports (``systems.sync_round_from_order``).

  Its codec and staleness weight are built once a run by ``clock.built``,
  which checks the names and their arguments (``clock.SystemsError``).

  Attributes:
    profiles: how fast clients are: a ``systems.PROFILES`` name
      ("constant", "lognormal") or "trace" (``profile_args={"path":
      csv}``, ``systems.read_profiles``).
    profile_args: the profile factory's arguments (e.g. ``speed_sigma``).
    availability: when clients are online: a ``systems.AVAILABILITY``
      name ("always", "markov", "diurnal", "intervals" with a ``path``).
    availability_args: its arguments (e.g. ``mean_online_s``); these and
      ``profile_args`` are checked by ``clock.built``
      (``systems.check_model_arguments``).
    over_selection: x in [0, ``systems.MAX_OVER_SELECTION`` = 100]: select
      ceil(m (1 + x)) clients (all online ones if that exceeds N),
      aggregate the first m to finish.
    deadline_s: drop clients that finish later than this after the round's
      start (None: no deadline).
    codec: the uplink codec (a ``compression.CODECS`` name; None: float32
      updates, uncompressed). Rules then aggregate the decoded models.
    codec_args: its arguments (e.g. ``bits``).
    error_feedback: keep each client's compression residual and add it to
      its next update (a model-sized table per client).
    seed: seeds the profiles and availability (the population's, apart
      from the run's seed).
    concurrency: C, set for asynchronous buffered aggregation (FedBuff,
      ``fedjax_agg.fedbuff``; None: synchronous rounds). C clients train
      at once, each from the global version it downloaded; a server step
      (a "round" of the run: ``num_rounds`` steps) aggregates the buffer
      of the K = cohort size (participation x N) first updates to arrive,
      scaled by the staleness weight. C >= K; C = K with equal speeds is
      the synchronous run. Incompatible with over-selection, deadlines,
      error feedback and custom local updates (refused by name).
    staleness: the staleness weight w(s) (a ``systems.STALENESS`` name:
      "constant", "polynomial" (1 + s)^-a, FedBuff's 1 / sqrt(1 + s) at its
      default a = 0.5, "hinge").
    staleness_args: its arguments (e.g. ``a``).
    max_staleness: updates older than this many versions are discarded
      (counted in the history's ``stale``); the run keeps max_staleness + 1
      global models. None: 10 ceil(C / K).
    secagg_bits: b in 1..32: the rule runs on a simulated secure sum
      (``fedjax_agg.secagg``): each client's update is clipped to
      [-secagg_clip, secagg_clip] per coordinate, its statistics converted
      to fixed point and summed modulo 2^b, the server sees only the
      survivors' sum. Only rules that are a sum over clients (FedAvg, the
      server optimizers over it, DP-FedAvg, norm bounding, FedNNNN) can;
      the others are refused by name. None: no secure aggregation.
    secagg_clip: the clipping range of an update coordinate.
  """
  # Each field's command-line flag is declared with it (the description's
  # "systems" section, ``spec.SystemsSpec``, is this class).
  profiles: str = _field("constant", Flag(
      "--profiles", "client speeds and bandwidths: constant, lognormal or "
      "trace (with --profile-arg path=FILE.csv); records sim_time_s",
      choices=lambda: systems_lib.PROFILES.names + ("trace",)))
  profile_args: dict = _field({}, Flag(
      "--profile-arg", "argument of the profiles (repeatable), e.g. "
      "speed_sigma=1.5", kind="pairs"))
  availability: str = _field("always", Flag(
      "--availability", "when clients are online (default always)",
      choices=lambda: systems_lib.AVAILABILITY.names))
  availability_args: dict = _field({}, Flag(
      "--availability-arg", "argument of the availability (repeatable), "
      "e.g. mean_online_s=3600", kind="pairs"))
  over_selection: float = _field(0.0, Flag(
      "--over-selection", "select m(1 + x) clients, aggregate the first m "
      "to finish", type=float))
  deadline_s: Optional[float] = _field(None, Flag(
      "--deadline", "drop clients that finish later than this many "
      "simulated seconds after the round starts", type=float))
  codec: Optional[str] = _field(None, Flag(
      "--codec", "compress the clients' updates (see --list codecs); "
      "records uplink_bytes", choices=lambda: registry.names_of("codec")))
  codec_args: dict = _field({}, Flag(
      "--codec-arg", "argument of the codec (repeatable), e.g. bits=2",
      kind="pairs"))
  error_feedback: bool = _field(False, Flag(
      "--error-feedback", "keep each client's compression residual for its "
      "next update", kind="switch"))
  seed: int = _field(0)
  concurrency: Optional[int] = _field(None, Flag(
      "--concurrency", "C: asynchronous buffered aggregation (FedBuff) with "
      "C clients training at once, a server step per buffer of m updates",
      type=int))
  staleness: str = _field("polynomial", Flag(
      "--staleness", "with --concurrency: weight of an update s versions "
      "old (default polynomial: (1 + s)^-0.5)",
      choices=lambda: systems_lib.STALENESS.names))
  staleness_args: dict = _field({}, Flag(
      "--staleness-arg", "argument of the staleness weight (repeatable), "
      "e.g. a=1.0", kind="pairs"))
  max_staleness: Optional[int] = _field(None, Flag(
      "--max-staleness", "with --concurrency: discard updates older than "
      "this many versions (default 10 ceil(C / m))", type=int))
  secagg_bits: Optional[int] = _field(None, Flag(
      "--secagg-bits", "simulated secure aggregation: fixed-point sums "
      "modulo 2^b (1..32) of the clients' clipped updates", type=int))
  secagg_clip: float = _field(1.0, Flag(
      "--secagg-clip", "with --secagg-bits: clipping range of an update "
      "coordinate (default 1.0)", type=float))

  def __post_init__(self):
    # Names and their arguments: where their objects are built
    # (``clock.built``); here, what a description alone says.
    for name in ("profiles", "availability", "staleness", "codec"):
      if not isinstance(getattr(self, name), str) and not (
          name == "codec" and self.codec is None):
        raise TypeError(f"{name} must be a name (str), got "
                        f"{getattr(self, name)!r}")
    for name in ("profile_args", "availability_args", "codec_args",
                 "staleness_args"):
      _check_arguments(name, getattr(self, name))
    checks.check_int("seed", self.seed, 0, 2**32 - 1)
    checks.check_range("over_selection", self.over_selection, 0)
    if self.deadline_s is not None:
      checks.check_range("deadline_s", self.deadline_s, 0, low_open=True)
      if not math.isfinite(self.deadline_s):
        raise ValueError(f"deadline_s must be finite (None: no deadline), "
                         f"got {self.deadline_s!r}")
    if self.codec is None and self.codec_args:
      raise ValueError(f"codec_args {self.codec_args!r} without a codec")
    checks.check_bool("error_feedback", self.error_feedback)
    if self.error_feedback and self.codec is None:
      raise ValueError("error_feedback=True needs a codec (the residual of "
                       "an uncompressed update is 0)")
    if self.secagg_bits is not None:
      checks.check_int("secagg_bits", self.secagg_bits, 1, 32)
    checks.check_range("secagg_clip", self.secagg_clip, 0, low_open=True)
    if not math.isfinite(self.secagg_clip):
      raise ValueError(f"secagg_clip must be finite, got {self.secagg_clip}")
    if self.secagg_bits is None and self.secagg_clip != 1.0:
      raise ValueError(f"secagg_clip={self.secagg_clip} applies to secure "
                       "aggregation only: set secagg_bits too")
    if self.concurrency is None:
      defaults = Systems.__dataclass_fields__
      for name in ("staleness", "staleness_args", "max_staleness"):
        field = defaults[name]
        default = (field.default_factory() if field.default is
                   dataclasses.MISSING else field.default)
        if getattr(self, name) != default:
          raise ValueError(f"{name}={getattr(self, name)!r} applies to "
                           "asynchronous aggregation only: set concurrency "
                           "too (or leave it at its default)")
      return
    checks.check_int("concurrency", self.concurrency, 1)
    if self.max_staleness is not None:
      checks.check_int("max_staleness", self.max_staleness, 0)
    for name, value in (("over_selection", self.over_selection > 0),
                        ("deadline_s", self.deadline_s is not None),
                        ("error_feedback", self.error_feedback)):
      if value:
        raise ValueError(
            f"{name}: asynchronous aggregation (concurrency="
            f"{self.concurrency}) has no rounds to over-select or time out"
            if name != "error_feedback" else
            f"{name}: not available with asynchronous aggregation "
            f"(concurrency={self.concurrency}); use a codec without it")

  @property
  def asynchronous(self) -> bool:
    """Whether the run is FedBuff's buffered asynchronous aggregation."""
    return self.concurrency is not None

  @property
  def selects(self) -> bool:
    """Whether the clock changes who takes part (else it only measures)."""
    return (self.availability != "always" or self.over_selection > 0
            or self.deadline_s is not None or self.asynchronous)

  def num_versions(self, cohort_size: int) -> int:
    """The global models an asynchronous run keeps: max staleness + 1."""
    if self.max_staleness is not None:
      return self.max_staleness + 1
    return 10 * -(-self.concurrency // cohort_size) + 1

  # The runtime objects are built by ``clock.built``, in the systems layer
  # above config, which config must not import. ``clock`` hands its
  # builder down to this class when it is imported, so that the two
  # deprecated shims below keep working without an upward import.
  _runtime_builder = None

  def _runtime(self):
    if Systems._runtime_builder is None:
      raise RuntimeError("Systems.build_codec()/build_staleness() are "
                         "deprecated and need fedjax_agg.clock: import it "
                         "and call clock.built(systems)")
    return Systems._runtime_builder(self)  # pylint: disable=not-callable

  def build_staleness(self):
    """Deprecated: ``clock.built(systems).staleness``."""
    warnings.warn("Systems.build_staleness() is deprecated: use "
                  "clock.built(systems).staleness", DeprecationWarning, 2)
    return self._runtime().staleness

  def build_codec(self):
    """Deprecated: ``clock.built(systems).codec``."""
    warnings.warn("Systems.build_codec() is deprecated: use "
                  "clock.built(systems).codec", DeprecationWarning, 2)
    return self._runtime().codec
