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
import functools
import re
from typing import Optional, Union

from fedjax_agg import aggregators
from fedjax_agg import loop
from fedjax_agg import models
from fedjax_agg.models import lora
from fedjax_agg.spec import _values as v

ADAPTER_ONLY_RULES = aggregators.REGISTRY.having(adapters="only")
"""The built-in rules defined only for LoRA adapters (each rule declares
it: ``registry.Capabilities.adapters``)."""
ADAPTER_RULES = ADAPTER_ONLY_RULES + aggregators.REGISTRY.having(
    adapters="also")
"""The built-in rules a run with LoRA adapters may use: those for
adapters, and DP-FedAvg (each client's adapters update clipped as one
vector, Gaussian noise on their mean: A and B averaged as FedIT does, with
privacy)."""
RULE_OPTIONS = {
    name: dict(aggregators.REGISTRY.capabilities(name).model_options)
    for name in aggregators.REGISTRY
    if aggregators.REGISTRY.capabilities(name).model_options}
"""The built-in rules' adapter options: rule -> the ``models.lora.lora``
options its adapters need (``registry.Capabilities.model_options``)."""
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
      ``TARGET_PRESETS`` ("transformer"), another string (one regular
      expression, as ``--lora-targets fc1`` gives) or a list of regular
      expressions, matched in full against the layers' '/'-joined module
      paths (a pattern that matches no Dense layer is refused when the
      network is built, naming the layers it has).
    dropout: the rate of dropout on the adapters' input, in [0, 1).
    seed: an int in [0, 2**32 - 1] (seeds are 32-bit unsigned, as the
      run's): draws the base where no ``model.base`` is given, FFA-LoRA's
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
      v.number(f"{path}.alpha", self.alpha, 0, lora.MAX_ALPHA,
               low_open=True)
    v.number(f"{path}.dropout", self.dropout, 0, 1, high_open=True)
    v.integer(f"{path}.seed", self.seed, 0, loop.MAX_SEED)
    targets = self.targets
    if targets is None or (isinstance(targets, str)
                           and targets in TARGET_PRESETS):
      return
    if isinstance(targets, str):
      _check_pattern(f"{path}.targets", targets)
      return
    if not isinstance(targets, (list, tuple)) or not targets or not all(
        isinstance(t, str) for t in targets):
      raise v.ConfigTypeError(
          f"{path}.targets", f"{path}.targets must be null (every Dense "
          f"layer), one of {sorted(TARGET_PRESETS)}, a regular expression "
          f"or a non-empty list of them, got {targets!r}")
    for i, pattern in enumerate(targets):
      _check_pattern(f"{path}.targets[{i}]", pattern)

  def patterns(self) -> Optional[tuple[str, ...]]:
    """The targets as ``models.lora.lora`` takes them."""
    if self.targets is None:
      return None
    if isinstance(self.targets, str):
      return tuple(TARGET_PRESETS.get(self.targets, (self.targets,)))
    return tuple(self.targets)

  def check_targets(self, path: str, model: str, model_args: dict) -> None:
    """Each pattern of the targets (at ``path``) selects a Dense layer of
    network ``model`` with ``model_args`` (its layers' names do not depend
    on the data's shapes: its default input shape stands in)."""
    if self.targets is None or model not in models.NAMES:
      return
    # Sorted pairs: hashable for ``_dense_targets``' cache, and the same for any
    # key order.
    options = tuple(sorted(model_args.items()))
    if isinstance(self.targets, str):
      v.built(f"{path}.targets", _dense_targets, model, options,
              self.patterns())
      return
    # Each pattern alone, so a refusal names the list item that selects nothing.
    for i, pattern in enumerate(self.targets):
      v.built(f"{path}.targets[{i}]", _dense_targets, model, options,
              (pattern,))


# Cached: listing a network's layers builds it, and every algorithm of an
# experiment asks again with the same model.
@functools.lru_cache(maxsize=64)
def _dense_targets(model: str, options: tuple, patterns: tuple[str, ...]
                   ) -> tuple[str, ...]:
  """``lora.select_targets`` of network ``model`` (its options as sorted
  pairs), on one example of the default shape (one token for a language
  model, within any ``max_length``)."""
  shape = (1,) if model in models.SEQUENCE_MODELS else None
  return lora.select_targets(
      models.get(model, input_shape=shape, **dict(options)), patterns)


def _check_pattern(path: str, pattern: str) -> None:
  try:
    re.compile(pattern)
  except re.error as error:
    raise v.ConfigError(path, f"{path}: {pattern!r} is not a regular "
                        f"expression ({error})") from None
