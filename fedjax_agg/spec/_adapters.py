"""``AdaptersSpec``: LoRA adapters on a network (``models.lora``), the
"adapters" entry of a description's "model" section, and the rules
defined for adapters.

With adapters, the network's variables (the pre-trained ``model.base``,
else the seed's initialisation) are frozen and shared by every client;
only each client's adapters train, travel and are aggregated. The rules
that aggregate adapters fix how the adapters are built: FFA-LoRA freezes
A at its random start, FLoRA carries the merged products
(``RULE_OPTIONS``); a rule that reads the full model is refused.
"""

import dataclasses
import re
from typing import Optional, Union

from fedjax_agg.models import lora
from fedjax_agg.spec import _values as v

ADAPTER_ONLY_RULES = ("fedit", "ffa_lora", "flora", "hetlora")
"""The rules defined only for LoRA adapters."""
ADAPTER_RULES = ADAPTER_ONLY_RULES + ("dp_fedavg",)
"""The rules a run with LoRA adapters may use: those for adapters, and
DP-FedAvg (each client's adapters update clipped as one vector, Gaussian
noise on their mean: A and B averaged as FedIT does, with privacy)."""
RULE_OPTIONS = {"ffa_lora": {"freeze_a": True}, "flora": {"merged": True}}
"""Rule -> the ``models.lora.lora`` options its adapters need."""
TARGET_PRESETS = {"transformer": lora.TRANSFORMER_TARGETS}
"""Named target sets: "transformer" is ``transformer_lm``'s attention
projections and MLP layers."""


@dataclasses.dataclass(frozen=True)
class AdaptersSpec:
  """"model.adapters": LoRA adapters of rank ``rank`` (Hu et al., ICLR
  2022) on the network's Dense layers.

  Attributes:
    rank: r, an int >= 1 (at most min(d_in, d_out) of every adapted
      layer).
    alpha: the update's scale numerator, (alpha / r) B A (None: r).
    targets: which Dense layers: None (every one), a name of
      ``TARGET_PRESETS`` ("transformer"), or a list of regular expressions
      matched in full against the layers' '/'-joined module paths.
    dropout: the rate of dropout on the adapters' input, in [0, 1).
    seed: draws the base where no ``model.base`` is given, FFA-LoRA's
      frozen A and the dropout masks: one network for all of a run's
      seeds, so that a sweep's members are the runs of their seeds.
  """
  rank: int
  alpha: Optional[float] = None
  targets: Union[None, str, list] = None
  dropout: float = 0.0
  seed: int = 0
  # Where the adapters sit in a config (an algorithm may set its own), for
  # the errors.
  path: dataclasses.InitVar[str] = "model.adapters"

  def __post_init__(self, path: str):
    v.integer(f"{path}.rank", self.rank, 1)
    if self.alpha is not None:
      v.number(f"{path}.alpha", self.alpha, 0, low_open=True)
    v.number(f"{path}.dropout", self.dropout, 0, 1, high_open=True)
    v.integer(f"{path}.seed", self.seed, 0)
    targets = self.targets
    if isinstance(targets, str) and targets in TARGET_PRESETS:
      return
    if targets is None:
      return
    if not isinstance(targets, (list, tuple)) or not targets or not all(
        isinstance(t, str) for t in targets):
      raise v.ConfigTypeError(
          f"{path}.targets", f"{path}.targets must be null (every Dense "
          f"layer), one of {sorted(TARGET_PRESETS)} or a non-empty list of "
          f"regular expressions, got {targets!r}")
    for i, pattern in enumerate(targets):
      try:
        re.compile(pattern)
      except re.error as error:
        raise v.ConfigError(f"{path}.targets[{i}]", f"{path}.targets[{i}]: "
                            f"{pattern!r} is not a regular expression "
                            f"({error})") from None

  def patterns(self) -> Optional[tuple[str, ...]]:
    """The targets as ``models.lora.lora`` takes them."""
    if self.targets is None:
      return None
    if isinstance(self.targets, str):
      return tuple(TARGET_PRESETS[self.targets])
    return tuple(self.targets)
