"""What a run keeps and how it meets non-finite values:
``Checkpointing`` and ``NonFinite``. Part of ``fedjax_agg.config``.
"""

import dataclasses
import os


from fedjax_agg import checks


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
"""``NonFinite.clients``: what a round does with a client whose update is
not finite."""
NONFINITE_MODEL = ("raise", "record")
"""``NonFinite.model``: what a run does when the global model is not
finite."""


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
