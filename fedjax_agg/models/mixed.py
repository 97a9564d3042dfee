"""Mixed precision for local training: bfloat16 products on float32 master
variables (``LocalTraining(matmul_precision="bfloat16")``).

Micikevicius et al., "Mixed Precision Training", ICLR 2018: the forward
and backward passes compute in a 16-bit format while the weights, their
updates and the optimizer state stay in float32 (the "master weights"),
so that small updates are not lost to 16-bit rounding. bfloat16 keeps
float32's exponent range, so no loss scaling is needed (Kalamkar et al.,
"A Study of BFLOAT16 for Deep Learning Training", 2019).

Here ``bfloat16_compute(model)`` is ``model`` whose ``apply`` casts every
floating variable and input to bfloat16, runs the network, and casts the
outputs (and updated variables, e.g. BatchNorm statistics) back to their
float32 dtypes. Differentiated through those casts, the gradient arrives
in float32 on the float32 parameters, the optimizer updates them in
float32, and the loss is computed from float32 outputs. Integer inputs
(token ids) pass unchanged. Only local training uses it; evaluation and
aggregation stay in float32.

A LoRA model (``models.lora``) computes in its adapters' dtype: with the
adapters cast to bfloat16 here, its frozen base (closed over, not a
variable of ``apply``) and a frozen FFA-LoRA A are cast to bfloat16 for
the products too, so that every product of local training, the base's
included, takes bfloat16 operands.
"""

import jax
import jax.numpy as jnp

from fedjax_agg.types import Model

__all__ = ["bfloat16_compute"]


def _cast(tree, dtype):
  return jax.tree.map(
      lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating)
      else a, tree)


def bfloat16_compute(model: Model) -> Model:
  """``model`` computing in bfloat16 on float32 master variables."""

  def apply(params, x, train):
    outputs, new_params = model.apply(_cast(params, jnp.bfloat16),
                                      _cast(x, jnp.bfloat16), train)
    # Updated variables (BatchNorm statistics) go back to their master
    # dtypes, so the carried state stays float32 from step to step.
    new_params = jax.tree.map(lambda new, old: new.astype(old.dtype),
                              new_params, params)
    return _cast(outputs, jnp.float32), new_params

  return model._replace(apply=apply)
