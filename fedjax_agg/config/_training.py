"""What each client does: ``LocalTraining`` and its optimizer
factories (``client_optimizer``, described by ``ClientOptimizer``). Part of
``fedjax_agg.config``.

The fields a description's "train" section sets are declared here with
their default, flag and check (``declared.spec_field``): the section is
made of them (``spec.TrainSpec``).
"""

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Optional, Union

import jax
import numpy as np
import optax

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.declared import check_fields
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field
from fedjax_agg.types import LocalObjective, PRNGKey


OptimizerFactory = Callable[..., optax.GradientTransformation]
"""``f(learning_rate) -> optax.GradientTransformation``, e.g. ``optax.sgd``."""
OPTIMIZERS = ("sgd", "adam")
"""The client optimizer names ``client_optimizer`` takes."""


def _at_least(low: int):
  return lambda name, value: checks.check_int(name, value, low)


def _choice(names):
  return lambda name, value: checks.check_choice(name, value, names)


@dataclasses.dataclass(frozen=True)
class ClientOptimizer:
  """The client optimizer as a description's "train" section names it
  (its keys ``optimizer``, ``momentum`` and ``weight_decay``);
  ``factory()`` is ``client_optimizer``'s factory for
  ``LocalTraining.optimizer``.

  Attributes:
    name: "sgd" (with ``momentum``, 0 = plain SGD) or "adam".
    momentum: SGD momentum in [0, 1).
    weight_decay: L2 weight decay added to the gradient (coupled, as
      PyTorch's SGD ``weight_decay``), of the parameters only: BatchNorm
      statistics (the ``batch_stats`` collection) never decay.
  """
  name: str = spec_field("sgd", Flag(
      "--optimizer", "client optimizer", choices=OPTIMIZERS, preset="sgd"),
      check=_choice(OPTIMIZERS), key="optimizer")
  momentum: float = spec_field(0.0, Flag(
      "--momentum", "client SGD momentum", type=float, preset=0.0),
      check=lambda name, value: checks.check_number(name, value, 0, 1,
                                                    high_open=True))
  weight_decay: float = spec_field(0.0, Flag(
      "--weight-decay", "client L2 weight decay (parameters only, not "
      "BatchNorm statistics)", type=float, preset=0.0),
      check=lambda name, value: checks.check_number(name, value, 0))

  def __post_init__(self):
    check_fields(self)
    if self.name == "adam" and self.momentum:
      raise ValueError(f"momentum is for optimizer 'sgd' (Adam has its own "
                       f"betas), got momentum={self.momentum!r} with "
                       "optimizer 'adam'")

  def factory(self) -> "OptimizerFactory":
    """``client_optimizer(name, momentum, weight_decay)``."""
    return client_optimizer(self.name, self.momentum, self.weight_decay)


def client_optimizer(name: str = "sgd", momentum: float = 0.0,
                     weight_decay: float = 0.0) -> OptimizerFactory:
  """A client optimizer factory ``f(learning_rate)`` for ``LocalTraining``.

  Args: ``name`` ("sgd" or "adam"), ``momentum`` (SGD's, in [0, 1)) and
  ``weight_decay`` (coupled L2, of the parameters only), as
  ``ClientOptimizer``'s attributes say.
  """
  ClientOptimizer(name, momentum, weight_decay)  # each value checked there

  # BatchNorm statistics are running means, not parameters: decaying them would
  # bias every later normalization.
  def decays(params):
    return tree_math.select_leaves(
        params, lambda path: not tree_math.is_statistic(path))

  def make(learning_rate):
    base = (optax.adam(learning_rate) if name == "adam" else
            # None rather than 0.0: plain SGD then carries no momentum buffer in
            # its state.
            optax.sgd(learning_rate, momentum=momentum or None))
    if not weight_decay:
      return base
    # Decay before the optimizer: coupled L2 enters the gradient that momentum
    # or Adam sees, as PyTorch's SGD ``weight_decay`` does.
    return optax.chain(optax.add_decayed_weights(weight_decay, mask=decays),
                       base)
  # What rules that normalise by the local solver read (``sgd_momentum``).
  make.sgd_momentum = momentum if name == "sgd" else None
  # A checkpoint's fingerprint names the factory by module and qualname
  # (``fingerprint.describe``): the module it was written from before
  # ``config`` became a package, so that those checkpoints still resume.
  make.__module__ = "fedjax_agg.config"
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
      # Nesterov's look-ahead is not the heavy-ball momentum the solver-aware
      # rules normalise by: such a factory answers None.
      and not optimizer.keywords.get("nesterov", False)):
    return float(optimizer.keywords.get("momentum") or 0.0)
  return None
LocalStepsFn = Callable[[PRNGKey, jax.Array], jax.Array]
"""``(key, full_steps [K]) -> num_steps [K]``: per-round step budgets."""
# "auto": per-client losses only where the aggregator reads them.
ComputeLosses = Union[bool, str]
"""``LocalTraining.compute_losses``: True, False or "auto"."""
MATMUL_PRECISIONS = ("highest", "default", "bfloat16")
"""What ``LocalTraining.matmul_precision`` takes: "highest" (full float32
on every backend), "default" (the backend's: full float32 on a CPU, TF32
on an NVIDIA GPU, one bfloat16 pass on a TPU, unless JAX's
``jax_default_matmul_precision`` says otherwise) or "bfloat16" (bfloat16
operands, float32 master weights: ``models.mixed``)."""


def _true_false_or_auto(name: str, value) -> None:
  if not (isinstance(value, (bool, np.bool_)) or value == "auto"):
    raise TypeError(f"{name} must be true, false or \"auto\", got "
                    f"{value!r}")


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
  # A field declared with ``spec_field`` is a key of "train" (``key``
  # where its name there differs): declared here once.
  epochs: int = spec_field(1, Flag("--epochs", "E: local epochs", type=int,
                                   preset=1),
                           check=_at_least(1), key="local_epochs")
  batch_size: int = spec_field(16, Flag(
      "--batch-size", "B: local batch size", type=int, preset=16),
      check=_at_least(1))
  learning_rate: Any = spec_field(0.01, Flag(
      "--lr", "client learning rate", type=float, preset=0.05),
      check=lambda name, value: checks.check_number(name, value, 0,
                                                    low_open=True))
  optimizer: OptimizerFactory = optax.sgd
  objective: Optional[LocalObjective] = None
  compute_losses: ComputeLosses = spec_field("auto",
                                             check=_true_false_or_auto)
  unroll: Union[int, bool] = 1
  eval_batch_size: int = 256
  steps_fn: Optional[LocalStepsFn] = None
  matmul_precision: str = spec_field("highest", Flag(
      "--matmul-precision", "precision of local training's matrix products: "
      "highest (full float32 on every backend) or default (the backend's: "
      "TF32 on an NVIDIA GPU, bfloat16 on a TPU)",
      choices=MATMUL_PRECISIONS), check=_choice(MATMUL_PRECISIONS))

  def __post_init__(self):
    check_fields(self)
    checks.check_int("eval_batch_size", self.eval_batch_size, 1)
    if not callable(self.optimizer):
      raise TypeError(f"optimizer must be an optax optimizer factory, got "
                      f"{self.optimizer!r}")
    if self.objective is not None and not isinstance(self.objective,
                                                     LocalObjective):
      raise TypeError(f"objective must be a LocalObjective or None, got "
                      f"{type(self.objective).__name__}")
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
