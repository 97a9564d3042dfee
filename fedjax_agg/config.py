"""Configuration objects: one name and one default per concept.

Hyperparameters travel as small frozen objects passed whole, from the
driver (``simulation.run``, ``sweep.run_sweep``) down to the round
(``rounds.make_round_fn``) and the engine (``engine.make_local_trainer``):

* ``LocalTraining``: what each client does (epochs, batch size, optimizer,
  learning rate, local objective, per-client losses, step budgets);
* ``Execution``: how the rounds are computed (chunk width, devices, chunk
  loop, streaming, cohort sampler, progress bar); it never changes a
  result beyond float rounding;
* ``Evaluation``: when and on what the global model is evaluated;
* ``Checkpointing``: where and how often the whole run is saved;
* ``Systems``: the clients' simulated clock (speeds, bandwidths,
  availability, over-selection, deadlines) and the uplink codec.

Every field is checked when the object is built, so a bad value raises a
``ValueError``/``TypeError`` naming the field before anything runs. The
learning rate may be a traced value (sweeps build ``LocalTraining`` inside
``jax.vmap``); its range is then checked on the concrete values first.
"""

import contextlib
import dataclasses
import functools
import math
import os
from typing import Any, Callable, Optional, Union
import warnings

import jax
import optax

from fedjax_agg import checks
from fedjax_agg.evaluation import check_eval_sets as _check_eval_sets
from fedjax_agg.evaluation import EvalSet
from fedjax_agg import tree_math
from fedjax_agg.types import LocalObjective, PRNGKey

__all__ = ["ACCOUNTANTS", "Checkpointing", "EvalSet", "Evaluation",
           "Execution",
           "LocalStepsFn", "LocalTraining", "MATMUL_PRECISIONS", "NonFinite",
           "OptimizerFactory", "sgd_momentum",
           "OPTIMIZERS", "Privacy", "SAMPLINGS", "Systems", "client_optimizer"]

OptimizerFactory = Callable[..., optax.GradientTransformation]
"""``f(learning_rate) -> optax.GradientTransformation``, e.g. ``optax.sgd``."""
OPTIMIZERS = ("sgd", "adam")
"""The client optimizer names ``client_optimizer`` takes."""


def client_optimizer(name: str = "sgd", momentum: float = 0.0,
                     weight_decay: float = 0.0) -> OptimizerFactory:
  """A client optimizer factory ``f(learning_rate)`` for ``LocalTraining``.

  Args:
    name: "sgd" (with ``momentum``, 0 = plain SGD) or "adam".
    momentum: SGD momentum in [0, 1).
    weight_decay: L2 weight decay added to the gradient (coupled, as
      PyTorch's SGD ``weight_decay``), of the parameters only: BatchNorm
      statistics (the ``batch_stats`` collection) never decay.
  """
  checks.check_choice("name", name, OPTIMIZERS)
  checks.check_range("momentum", momentum, 0, 1, high_open=True)
  checks.check_range("weight_decay", weight_decay, 0)
  if name == "adam" and momentum:
    raise ValueError("momentum is for name='sgd' (Adam has its own betas)")

  def decays(params):
    return tree_math.select_leaves(
        params, lambda path: not tree_math.is_statistic(path))

  def make(learning_rate):
    base = (optax.adam(learning_rate) if name == "adam" else
            optax.sgd(learning_rate, momentum=momentum or None))
    if not weight_decay:
      return base
    return optax.chain(optax.add_decayed_weights(weight_decay, mask=decays),
                       base)
  # What rules that normalise by the local solver read (``sgd_momentum``).
  make.sgd_momentum = momentum if name == "sgd" else None
  return make


def sgd_momentum(optimizer: OptimizerFactory) -> Optional[float]:
  """The SGD momentum of a ``LocalTraining.optimizer`` (0 for plain SGD),
  None when it is not SGD or cannot be told (FedNova refuses such runs).

  Known: ``client_optimizer``'s factories, ``optax.sgd`` and
  ``functools.partial(optax.sgd, momentum=...)``.
  """
  if hasattr(optimizer, "sgd_momentum"):
    return optimizer.sgd_momentum
  if optimizer is optax.sgd:
    return 0.0
  if (isinstance(optimizer, functools.partial) and optimizer.func is optax.sgd
      and not optimizer.args
      and set(optimizer.keywords) <= {"momentum", "nesterov"}
      and not optimizer.keywords.get("nesterov", False)):
    return float(optimizer.keywords.get("momentum") or 0.0)
  return None
LocalStepsFn = Callable[[PRNGKey, jax.Array], jax.Array]
"""``(key, full_steps [K]) -> num_steps [K]``: per-round step budgets."""
# "auto": per-client losses only where the aggregator reads them.
ComputeLosses = Union[bool, str]

CHUNK_LOOPS = ("map", "unroll")
MATMUL_PRECISIONS = ("highest", "default", "bfloat16")
"""What ``LocalTraining.matmul_precision`` takes: "highest" (full float32
on every backend), "default" (the backend's: full float32 on a CPU, TF32
on an NVIDIA GPU, one bfloat16 pass on a TPU, unless JAX's
``jax_default_matmul_precision`` says otherwise) or "bfloat16" (bfloat16
operands, float32 master weights: ``models.mixed``)."""


@dataclasses.dataclass(frozen=True)
class LocalTraining:
  """What every client of a round does.

  Attributes:
    epochs: E, local epochs (the static maximum; ``steps_fn`` can stop a
      client earlier).
    batch_size: B, minibatch size; the last partial batch of an epoch is
      masked, never dropped.
    learning_rate: client learning rate (a number, or a traced scalar
      inside a sweep).
    optimizer: optax optimizer factory taking ``learning_rate``
      (``optax.sgd``, ``functools.partial(optax.sgd, momentum=0.9)``, ...);
      its state is fresh every round.
    objective: local objective (``fedjax_agg.objectives``); the model's
      task loss alone when None.
    compute_losses: compute each participant's ``loss_before`` /
      ``loss_after`` (two extra forward passes over its data, about 40 %
      of a small CNN's round on CPU): "auto" (the default: only when the
      aggregator reads them, ``Aggregator.uses_losses``), True or False.
      The run's setting also holds for a client side's own trainer (a run
      without losses reads zeros; their passes are compiled away).
      Without them the history has no ``cohort_loss_*`` columns; its
      ``train_loss`` (the mean minibatch loss of local training) is always
      there.
    unroll: unroll factor of the loop over local steps (``True``: fully).
      At 1 (the default) the loop is a ``while_loop`` that runs only the
      client's own steps (the longest client's in a vmapped chunk); above 1
      it is a ``scan`` over the steps of the largest client of the
      federation, each client's extra steps masked.
    eval_batch_size: batch size of the per-client loss passes.
    steps_fn: optional per-round step budgets (``fedjax_agg.stragglers``).
    matmul_precision: precision of local training's matrix products and
      convolutions, one of ``MATMUL_PRECISIONS``. "highest" (the default)
      gives a GPU or TPU the CPU's answers to float32 rounding; "default"
      lets an NVIDIA GPU use TF32 (10-bit mantissas, about 1e-3 relative
      per product) and a TPU bfloat16. The CPU computes the same either
      way. "bfloat16": products in bfloat16 on float32 master weights
      (``models.mixed``). The aggregation math is always at full
      precision (``tree_math.FULL``).
  """
  epochs: int = 1
  batch_size: int = 16
  learning_rate: Any = 0.01
  optimizer: OptimizerFactory = optax.sgd
  objective: Optional[LocalObjective] = None
  compute_losses: ComputeLosses = "auto"
  unroll: Union[int, bool] = 1
  eval_batch_size: int = 256
  steps_fn: Optional[LocalStepsFn] = None
  matmul_precision: str = "highest"

  def __post_init__(self):
    checks.check_int("epochs", self.epochs, 1)
    if self.matmul_precision not in MATMUL_PRECISIONS:
      raise ValueError(f"matmul_precision must be one of "
                       f"{MATMUL_PRECISIONS}, got {self.matmul_precision!r}")
    checks.check_int("batch_size", self.batch_size, 1)
    checks.check_int("eval_batch_size", self.eval_batch_size, 1)
    checks.check_range("learning_rate", self.learning_rate, 0,
                       low_open=True)
    if not callable(self.optimizer):
      raise TypeError(f"optimizer must be an optax optimizer factory, got "
                      f"{self.optimizer!r}")
    if self.objective is not None and not isinstance(self.objective,
                                                     LocalObjective):
      raise TypeError(f"objective must be a LocalObjective or None, got "
                      f"{type(self.objective).__name__}")
    if self.compute_losses not in (True, False, "auto"):
      raise ValueError(f"compute_losses must be True, False or 'auto', got "
                       f"{self.compute_losses!r}")
    if not isinstance(self.unroll, bool):
      checks.check_int("unroll", self.unroll, 1)
    if self.steps_fn is not None and not callable(self.steps_fn):
      raise TypeError(f"steps_fn must be callable, got {self.steps_fn!r}")

  def precision(self):
    """The context in which local training is traced: its products at
    ``matmul_precision`` ("default": JAX's own setting)."""
    if self.matmul_precision != "highest":  # bfloat16: the operands'
      return contextlib.nullcontext()
    return jax.default_matmul_precision(self.matmul_precision)

  def losses_for(self, uses_losses: bool) -> bool:
    """Whether a round computes per-client losses for such an aggregator."""
    if self.compute_losses == "auto":
      return bool(uses_losses)
    return bool(self.compute_losses)


@dataclasses.dataclass(frozen=True)
class Execution:
  """How rounds are computed; never what they compute (to float rounding).

  Attributes:
    clients_per_step: W, the most clients trained side by side (vmap
      width); None: ``engine.default_clients_per_step`` for the devices.
    devices: where rounds run (``distributed.client_mesh``): None = every
      device of the job, an int count, a list of devices or a ``Mesh``
      with a "clients" axis.
    chunk_loop: "map" (``lax.scan`` over chunks, compile time independent
      of K) or "unroll".
    stream: aggregate on the fly with the rule's ``StreamingForm`` (None:
      whenever it has one; False: always stack the [K, ...] models).
    sampler: cohort sampler (``fedjax_agg.sampling``).
    progress: show a progress bar.
  """
  clients_per_step: Optional[int] = None
  devices: Any = None
  chunk_loop: str = "map"
  stream: Optional[bool] = None
  sampler: str = "auto"
  progress: bool = True

  def __post_init__(self):
    if self.clients_per_step is not None:
      checks.check_int("clients_per_step", self.clients_per_step, 1)
    if self.chunk_loop not in CHUNK_LOOPS:
      raise ValueError(f"chunk_loop must be one of {CHUNK_LOOPS}, got "
                       f"{self.chunk_loop!r}")
    if self.stream is not None:
      checks.check_bool("stream", self.stream)
    checks.check_bool("progress", self.progress)


@dataclasses.dataclass(frozen=True, eq=False)
class Evaluation:
  """When and on what the global model is evaluated.

  Attributes:
    every: evaluate on the test set every this many rounds (and after the
      last round, and before the first).
    clients: also compute the global model's mean loss on every client's
      training data (``client_loss_mean`` / ``client_loss_var``), a pass
      over the whole training set (as costly as several rounds of a small
      cohort): True (at every test evaluation), False, or an int ``n``: at
      the test evaluations whose round is a multiple of ``n``, before the
      first and after the last round. The default "auto" does it before
      the first and after the last round only.
    batch_size: examples per forward pass of the evaluation.
    personalized: at the client evaluations (``clients``), also evaluate
      every client's own model (the local update's ``personalize``: Ditto,
      FedBN) on its held-out split (``data.validation``):
      ``personal_accuracy_mean`` / ``_std`` / ``_p10`` across clients.
    finetune_steps: k > 0: at the client evaluations, also fine-tune the
      global model for k local steps on each client's training data (the
      run's ``LocalTraining``) and evaluate it on the client's held-out
      split (``finetuned_accuracy_*``), next to ``global_accuracy_*``, the
      global model itself on the same splits.
    extra: ``EvalSet``s scored at every test evaluation, each in a column
      of its own name (e.g. a backdoor's ``attack_success``).
  """
  every: int = 1
  clients: Union[bool, int, str] = "auto"
  batch_size: int = 2048
  personalized: bool = False
  finetune_steps: int = 0
  extra: tuple = ()

  def __post_init__(self):
    checks.check_int("every", self.every, 1)
    if self.clients != "auto" and not isinstance(self.clients, bool):
      checks.check_int("clients", self.clients, 1)
    checks.check_int("batch_size", self.batch_size, 1)
    checks.check_bool("personalized", self.personalized)
    checks.check_int("finetune_steps", self.finetune_steps, 0)
    _check_eval_sets(self.extra)

  @property
  def per_client(self) -> bool:
    """Whether client evaluations include held-out accuracies."""
    return self.personalized or self.finetune_steps > 0

  def due(self, round_num: int, num_rounds: int) -> bool:
    """Whether round ``round_num`` (1-based; 0 = before the first) is
    evaluated on the test set."""
    return (round_num == 0 or round_num % self.every == 0
            or round_num == num_rounds)

  def clients_due(self, round_num: int, num_rounds: int) -> bool:
    """Whether that evaluation also covers every client's training data."""
    if isinstance(self.clients, bool):
      return self.clients
    if round_num in (0, num_rounds):
      return True
    return self.clients != "auto" and round_num % self.clients == 0


@dataclasses.dataclass(frozen=True)
class Checkpointing:
  """Saving a run (``fedjax_agg.checkpoint``).

  Attributes:
    directory: the run's checkpoint folder; without ``resume`` it must hold
      none.
    every: save every this many rounds and after the last one (0: never,
      e.g. to resume a finished run's checkpoint without saving).
    resume: continue from the latest checkpoint in ``directory`` (round 0
      when there is none).
  """
  directory: str
  every: int = 0
  resume: bool = False

  def __post_init__(self):
    if not isinstance(self.directory, (str, os.PathLike)) or not str(
        self.directory):
      raise TypeError(f"directory must be a non-empty path string, got "
                      f"{self.directory!r}")
    checks.check_int("every", self.every, 0)
    checks.check_bool("resume", self.resume)


NONFINITE_CLIENTS = ("exclude", "raise", "propagate")
NONFINITE_MODEL = ("raise", "record")


@dataclasses.dataclass(frozen=True)
class NonFinite:
  """What a run does with NaN/Inf values.

  Attributes:
    clients: a participant whose trained model (or, for rules that read
      them, whose losses) holds a non-finite value: "exclude" it from the
      round exactly as a masked client (counted in the history's
      ``nonfinite_clients``), "raise" (exclude, then stop with an error
      naming the round and the clients), or "propagate" (hand it to the
      rule as it is; for debugging).
    model: the global model or its test loss turns non-finite: "raise"
      (stop with an error naming the round) or "record" (write the row and
      go on).
  """
  clients: str = "exclude"
  model: str = "raise"

  def __post_init__(self):
    if self.clients not in NONFINITE_CLIENTS:
      raise ValueError(f"clients must be one of {NONFINITE_CLIENTS}, got "
                       f"{self.clients!r}")
    if self.model not in NONFINITE_MODEL:
      raise ValueError(f"model must be one of {NONFINITE_MODEL}, got "
                       f"{self.model!r}")


SAMPLINGS = ("without_replacement", "poisson")
"""``Privacy.sampling``'s names: fixed-size cohorts or Poisson cohorts."""
ACCOUNTANTS = ("rdp", "pld")
"""The privacy accountants ``Privacy.accountant`` may name: RDP or PLD."""


@dataclasses.dataclass(frozen=True)
class Privacy:
  """Differential-privacy accounting of a run (``fedjax_agg.privacy``).

  The run records epsilon at ``delta`` after every round (column
  ``epsilon``) for the cohorts it actually draws, and ends early, after
  the last round whose epsilon stays within ``target_epsilon``.

  The noise accounted for is the noise the run's aggregator adds: its
  ``Aggregator.noise_multiplier`` (``aggregators.dp_fedavg``). A run whose
  rule adds no calibrated noise is refused, never accounted. A rule whose
  noise is tree-aggregated (``aggregators.dp_ftrl``, its multiplier an
  ``aggregators.TreeAggregationNoise``) is accounted as its trees, with no
  amplification by sampling, from how often each client takes part in
  the run's fixed-size cohorts (``privacy.tree_epsilons``; RDP accountant,
  "without_replacement" cohorts only).

  Attributes:
    noise_multiplier: None (the default): the aggregator's own z. A number
      states the z the caller expects: a run whose aggregator adds another
      is refused (it would report a guarantee the run does not have).
    delta: in (0, 1).
    accountant: "rdp" or "pld" (PLD: Poisson sampling only).
    sampling: "without_replacement": the run's cohorts of m = floor(C N)
      distinct clients; "poisson": every client joins each round with
      probability q = m / N (the run then draws Poisson cohorts, padded
      to a fixed capacity, ``sampling.poisson_capacity``); the rule must
      then divide by the fixed expected cohort size qN
      (``dp_fedavg(expected_clients=q * N)``), as McMahan et al. 2018 do.
    target_epsilon: stop before epsilon would exceed it (None: never).
  """
  noise_multiplier: Optional[float] = None
  delta: float = 1e-5
  accountant: str = "rdp"
  sampling: str = "without_replacement"
  target_epsilon: Optional[float] = None

  def __post_init__(self):
    if self.noise_multiplier is not None:
      checks.check_range("noise_multiplier", self.noise_multiplier, 0)
    checks.check_range("delta", self.delta, 0, 1, low_open=True,
                       high_open=True)
    checks.check_choice("accountant", self.accountant, ACCOUNTANTS)
    checks.check_choice("sampling", self.sampling, SAMPLINGS)
    if self.accountant == "pld" and self.sampling != "poisson":
      raise ValueError("accountant='pld' needs sampling='poisson' (the PLD "
                       "accountant has no fixed-size sampling)")
    if self.target_epsilon is not None:
      checks.check_range("target_epsilon", self.target_epsilon, 0,
                         low_open=True)


def _clock():
  """The systems layer, for ``Systems``' deprecated builders only."""
  from fedjax_agg import clock  # pylint: disable=g-import-not-at-top
  return clock


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
  profiles: str = "constant"
  profile_args: dict = dataclasses.field(default_factory=dict)
  availability: str = "always"
  availability_args: dict = dataclasses.field(default_factory=dict)
  over_selection: float = 0.0
  deadline_s: Optional[float] = None
  codec: Optional[str] = None
  codec_args: dict = dataclasses.field(default_factory=dict)
  error_feedback: bool = False
  seed: int = 0
  concurrency: Optional[int] = None
  staleness: str = "polynomial"
  staleness_args: dict = dataclasses.field(default_factory=dict)
  max_staleness: Optional[int] = None
  secagg_bits: Optional[int] = None
  secagg_clip: float = 1.0

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

  def build_staleness(self):
    """Deprecated: ``clock.built(systems).staleness``."""
    warnings.warn("Systems.build_staleness() is deprecated: use "
                  "clock.built(systems).staleness", DeprecationWarning, 2)
    return _clock().built(self).staleness

  def build_codec(self):
    """Deprecated: ``clock.built(systems).codec``."""
    warnings.warn("Systems.build_codec() is deprecated: use "
                  "clock.built(systems).codec", DeprecationWarning, 2)
    return _clock().built(self).codec
