"""How rounds are computed: ``Execution``. Part of
``fedjax_agg.config``.
"""

import dataclasses
from typing import Any, Optional


import jax

from fedjax_agg import checks
from fedjax_agg.declared import check_fields
from fedjax_agg.declared import Flag
from fedjax_agg.declared import spec_field


CHUNK_LOOPS = ("map", "unroll")
"""``Execution.chunk_loop``'s names: a ``lax.scan`` over chunks or an
unrolled loop."""


def _optional_at_least_1(name: str, value) -> None:
  if value is not None:
    checks.check_int(name, value, 1)


def _devices(name: str, value) -> None:
  """None, a count >= 1, or (from Python only) devices or a mesh."""
  if isinstance(value, jax.sharding.Mesh) or (
      isinstance(value, (list, tuple)) and value
      and all(isinstance(device, jax.Device) for device in value)):
    return
  _optional_at_least_1(name, value)


@dataclasses.dataclass(frozen=True)
class Execution:
  """How rounds are computed; never what they compute (to float rounding).

  Attributes:
    clients_per_step: W, the most clients trained side by side (vmap
      width); None: ``distributed.default_clients_per_step`` for the devices.
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
  # The fields declared with ``spec_field`` are keys of "train".
  clients_per_step: Optional[int] = spec_field(None, Flag(
      "--clients-per-step", "clients trained side by side (vmap width)",
      type=int), check=_optional_at_least_1)
  devices: Any = spec_field(None, Flag(
      "--devices", "shard each round's clients over this many devices "
      "(default: all devices of the job; 1: unsharded)", type=int),
      check=_devices)
  chunk_loop: str = "map"
  stream: Optional[bool] = None
  sampler: str = "auto"
  progress: bool = True

  def __post_init__(self):
    check_fields(self)
    if self.chunk_loop not in CHUNK_LOOPS:
      raise ValueError(f"chunk_loop must be one of {CHUNK_LOOPS}, got "
                       f"{self.chunk_loop!r}")
    if self.stream is not None:
      checks.check_bool("stream", self.stream)
    checks.check_bool("progress", self.progress)
