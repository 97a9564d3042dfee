"""``RunOptions``: the settings of a run, shared by every entry point.

A run is a model, its federated data, the test set, the server rule (or,
in a sweep, ``build``) and ``RunOptions``: the rounds, the participation,
what the clients do and how the rounds are computed, evaluated, saved,
accounted and timed. ``simulation.run`` (one member), ``sweep.run_sweep``
(S vmapped members) and ``drivers.run_adct`` take the same object, or its
fields as keywords::

  options = RunOptions(num_rounds=50, participation=0.1,
                       training=LocalTraining(learning_rate=0.05))
  simulation.run(model, data, test, aggregators.fedavg(), options)
  simulation.run(model, data, test, aggregators.fedavg(), num_rounds=50,
                 participation=0.1)  # the same run
  sweep.run_sweep(build, grid, seeds=[0, 1], model=model, data=data,
                  test_data=test, options=options)

Keywords given beside ``options`` replace its fields. A keyword that is
not a field is refused by name, with the nearest field it may mean.
Every field is checked when the object is built.
"""

import dataclasses
import difflib
from typing import Any, Mapping, Optional

from fedjax_agg import checks
from fedjax_agg.config import (Checkpointing, Evaluation, Execution,
                               LocalTraining, NonFinite, Privacy, Systems)
from fedjax_agg.declared import check_fields
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field
from fedjax_agg.types import Params

__all__ = ["RunOptions"]


# Both bases: callers written against the earlier ValueError keep catching it,
# and new ones get the TypeError every other check raises.
class _NotAnInt(TypeError, ValueError):
  """A ``num_rounds`` that is not an int: a ``TypeError``, and the
  ``ValueError`` that ``RunOptions`` has always raised for it."""


def _check_rounds(name: str, value) -> None:
  try:
    checks.check_int(name, value, 0)
  except TypeError as error:
    raise _NotAnInt(str(error)) from None


# eq=False: fields hold arrays (``init_params``) and functions, whose ``==`` is
# elementwise or meaningless; identity is the only sound equality.
@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class RunOptions:
  """What every member of a run shares besides model, data and rule.

  Attributes:
    num_rounds: R, the rounds to run (an int >= 0).
    participation: C, the fraction of clients sampled per round
      (m = max(floor(C N), 1), without replacement, seeded).
    training: what the clients do (``config.LocalTraining``).
    execution: chunking, devices, streaming, sampler, progress bar
      (``config.Execution``); never changes a result beyond rounding.
    evaluation: when and what to evaluate (``config.Evaluation``).
    nonfinite: what to do with NaN/Inf clients and models
      (``config.NonFinite``).
    local_update: the client side (``rounds.LocalUpdate``); None: the
      engine's local training.
    init_params: start from these params instead of ``model.init``.
    checkpointing: save (and resume) the whole run
      (``config.Checkpointing``); resuming with a larger ``num_rounds``
      extends a finished run, which then equals the longer run.
    privacy: differential-privacy accounting (``config.Privacy``): the
      ``epsilon`` column, Poisson cohorts when it says so, and an early
      end before epsilon passes its target.
    systems: the clients' simulated clock and uplink codec
      (``config.Systems``).
    config: extra key/values recorded in the history's config (and in the
      checkpoint fingerprint).
  """
  # Keys of "train" (``rounds``, ``participation``), checked here once.
  num_rounds: int = spec_field(
      dataclasses.MISSING, Flag("--rounds", "R: rounds", type=int,
                                preset=10),
      check=_check_rounds, key="rounds", config_default=10)
  participation: float = spec_field(1.0, Flag(
      "--participation", "C: fraction of clients per round", type=float,
      preset=0.1), check=lambda name, value: checks.check_number(
          name, value, 0, 1, low_open=True))
  training: LocalTraining = LocalTraining()
  execution: Execution = Execution()
  evaluation: Evaluation = Evaluation()
  nonfinite: NonFinite = NonFinite()
  local_update: Optional[Any] = None
  init_params: Optional[Params] = None
  checkpointing: Optional[Checkpointing] = None
  privacy: Optional[Privacy] = None
  systems: Optional[Systems] = None
  config: Optional[dict] = None

  def __post_init__(self):
    check_fields(self)
    # A dict where a config object belongs would otherwise fail later, as an
    # attribute error deep in the run, far from the mistake.
    for name, kind, optional in _TYPED:
      value = getattr(self, name)
      if not (isinstance(value, kind) or (optional and value is None)):
        expected = kind.__name__ + (" or None" if optional else "")
        raise TypeError(f"{name} must be a config.{expected}, got "
                        f"{type(value).__name__}: {value!r:.80}")
    if self.config is not None and not isinstance(self.config, Mapping):
      raise TypeError(f"config must be a dict of recorded key/values or "
                      f"None, got {type(self.config).__name__}")
    if self.local_update is not None:
      from fedjax_agg import rounds  # pylint: disable=g-import-not-at-top
      if not isinstance(self.local_update, rounds.LocalUpdate):
        raise TypeError(f"local_update must be a rounds.LocalUpdate or "
                        f"None, got {type(self.local_update).__name__}")

  @classmethod
  def of(cls, options: Optional["RunOptions"], fields: Mapping[str, Any],
         where: str) -> "RunOptions":
    """``options`` with ``fields`` (keywords of ``where``) replacing its
    fields; without ``options``, the fields alone (``num_rounds`` then
    required)."""
    if options is not None and not isinstance(options, cls):
      raise TypeError(f"{where}: options must be a RunOptions, got "
                      f"{type(options).__name__}")
    names = [field.name for field in dataclasses.fields(cls)]
    for key in fields:
      if key not in names:
        near = difflib.get_close_matches(key, names, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise TypeError(
            f"{where}() got an unexpected keyword argument {key!r}{hint} "
            f"(its options are the fields of RunOptions: {names})")
    if options is None:
      if "num_rounds" not in fields:
        raise TypeError(f"{where}() needs num_rounds (or options="
                        "RunOptions(num_rounds=...))")
      return cls(**fields)
    # ``replace`` builds a new object, so ``__post_init__`` checks the merged
    # fields again.
    return dataclasses.replace(options, **fields)

  def replace(self, **fields) -> "RunOptions":
    """A copy with ``fields`` replaced (checked again)."""
    return self.of(self, fields, "RunOptions.replace")


_TYPED = (("training", LocalTraining, False),
          ("execution", Execution, False),
          ("evaluation", Evaluation, False),
          ("nonfinite", NonFinite, False),
          ("checkpointing", Checkpointing, True),
          ("privacy", Privacy, True),
          ("systems", Systems, True))
