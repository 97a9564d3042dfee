"""How rounds are computed: ``Execution``. Part of
``fedjax_agg.config``.
"""

import dataclasses
from typing import Any, Optional


from fedjax_agg import checks


CHUNK_LOOPS = ("map", "unroll")
"""``Execution.chunk_loop``'s names: a ``lax.scan`` over chunks or an
unrolled loop."""


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
