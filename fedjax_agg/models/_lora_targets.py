"""Which Dense layers LoRA adapts (part of ``fedjax_agg.models.lora``):
the adaptable layers found in one abstract pass of a network's ``init``,
and the ``targets`` patterns matched against their paths.
"""

import re
from typing import NamedTuple, Sequence

import flax.linen as nn
import jax
import numpy as np

from fedjax_agg import tree_math
from fedjax_agg.types import Model, Params


class Target(NamedTuple):
  """One adapted layer.

  Attributes:
    path: the module's '/'-joined path (the adapters' key).
    in_shape: the layer's input feature axes (d_in is their product).
    out_shape: its output feature axes (d_out is their product).
  """
  path: str
  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]

  @property
  def d_in(self) -> int:
    """The number of input features (A's columns)."""
    return int(np.prod(self.in_shape))

  @property
  def d_out(self) -> int:
    """The number of output features (B's rows)."""
    return int(np.prod(self.out_shape))


def _discover(model: Model, base_variables: Params):
  """(adaptable Dense layers, paths of every kernel-holding module), from
  one abstract pass of ``model.init`` (nothing is computed)."""
  dense = {}

  def record(next_fun, args, kwargs, context):
    module = context.module
    if (context.method_name == "__call__" and args
        and isinstance(module, (nn.Dense, nn.DenseGeneral))):
      path = "/".join(module.path)
      inputs = args[0]
      if isinstance(module, nn.Dense):
        axes, features = (inputs.ndim - 1,), (module.features,)
      else:
        axis = module.axis if isinstance(module.axis, Sequence) else (
            module.axis,)
        # Negative axes normalised: -1 and ndim - 1 name one contraction.
        axes = tuple(sorted(int(a) % inputs.ndim for a in axis))
        features = (tuple(module.features) if isinstance(
            module.features, Sequence) else (module.features,))
        # Only a contraction of the trailing axes without batch dims is
        # [..., d_in] @ A^T; any other layout keeps its kernel in ``kernels``
        # below, so a pattern naming it is refused rather than skipped.
        if module.batch_dims or axes != tuple(
            range(inputs.ndim - len(axes), inputs.ndim)):
          axes = None  # a kernel this module does not adapt
      if axes is not None:
        dense[path] = Target(path, tuple(inputs.shape[a] for a in axes),
                             tuple(int(f) for f in features))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    # A new function: a cached trace of model.init would call no module.
    jax.eval_shape(lambda key: model.init(key), jax.random.key(0))
  # Every module holding a kernel, Dense or not: a pattern matching a
  # convolution or a recurrent cell is refused instead of ignored.
  kernels = [p[len("params/"):-len("/kernel")]
             for p in tree_math.leaf_paths(base_variables)
             if p.startswith("params/") and p.endswith("/kernel")]
  return dense, kernels


def _select(targets, dense, kernels) -> tuple[Target, ...]:
  if targets is None:
    # Sorted paths fix the adapters' order, and with it the keys ``lora``
    # folds in by index, whatever order the network calls its layers in.
    chosen = sorted(dense)
  else:
    if isinstance(targets, str) or not isinstance(targets, Sequence) or (
        not targets):
      raise TypeError(f"targets must be a non-empty sequence of regular "
                      f"expressions (or None), got {targets!r}")
    chosen = set()
    for pattern in targets:
      try:
        regex = re.compile(pattern)
      except (re.error, TypeError) as error:
        raise ValueError(f"targets: {pattern!r} is not a regular expression "
                         f"({error})") from None
      other = [k for k in kernels if k not in dense and regex.fullmatch(k)]
      if other:
        raise ValueError(f"targets: {pattern!r} matches {other}, kernels "
                         "that are not Dense layers (convolutions, recurrent "
                         "cells); LoRA adapts Dense layers only")
      hits = [path for path in dense if regex.fullmatch(path)]
      if not hits:
        raise ValueError(f"targets: {pattern!r} matches no Dense layer; "
                         f"the Dense layers are {sorted(dense)}")
      chosen.update(hits)
    chosen = sorted(chosen)
  if not chosen:
    raise ValueError("targets: the model has no Dense layer to adapt")
  return tuple(dense[path] for path in chosen)
