"""Layers whose lowering can be chosen for speed under ``jax.vmap``.

``Conv`` is a drop-in for ``flax.linen.Conv`` (same parameter names, shapes
and initialisers: ``kernel`` [kh, kw, in, out] lecun-normal, ``bias`` [out]
zeros) with an ``impl`` switch for how the convolution is lowered. All
implementations compute the same function and the same gradients (up to
float32 rounding); they differ in speed, mostly when the engine ``vmap``-s
a training step over clients that each hold their own kernel.

impl="xla"
  ``lax.conv_general_dilated`` as ``nn.Conv`` does, with JAX's own gradient
  and batching rules. Under ``vmap`` over per-client kernels a convolution
  becomes a *grouped* convolution (``feature_group_count`` = clients), and
  its gradients become convolutions in non-canonical layouts. The plain
  choice on GPU/TPU. On XLA:CPU both are slow: grouped convolutions and the
  kernel-/input-gradient convolutions inside a ``while`` loop (the engine's
  ``lax.scan`` over local steps) are not given to the fast convolution
  kernels (measured: 348 ms instead of 3.8 ms for one kernel gradient of
  the 5x5x32x64 layer at batch 16).
impl="im2col"
  The convolution as a matmul: the kh*kw shifted windows of the padded input
  are stacked into patches [B, H', W', kh*kw*C] and multiplied with the
  kernel reshaped to [kh*kw*C, F]. A custom VJP computes the kernel
  gradient as the matmul dy^T @ patches (the forward patches are kept as
  residuals) and the input gradient as a canonical convolution (as in
  "conv" below; folding dy @ kernel^T back onto the input, "col2im", was
  slower). Per-client matmuls are one batched matmul under ``vmap``.
impl="conv"
  Three canonical NHWC/HWIO ``lax.conv_general_dilated`` calls, one for the
  forward pass and one for each gradient (a custom VJP: the input gradient
  is the convolution of dy with the flipped, transposed kernel; the kernel
  gradient a convolution with batch and features swapped), so that XLA:CPU
  keeps them on its fast convolution kernels inside loops.
impl="auto"
  Decided when the function is traced, from ``jax.default_backend()`` and
  from whether the engine is tracing local training (where every client
  trains its own kernel, ``per_client_training``): "conv" on the CPU;
  on a GPU or TPU "im2col" inside local training and "xla" (the vendor
  library's convolution) everywhere else. Measured on one H200
  (``experiments/bench/README.md``): 100 clients side by side trained
  1.19x faster with "im2col" than with "xla" (264,643 against 222,910
  samples/s) and 2.0x faster than with "conv"; one shared model trained
  1.9x faster with "xla" (915 k against 494 k samples/s at batch 1,600).

Batching ("im2col" and "conv"). Every primitive step (forward, input
gradient, kernel gradient) has its own ``vmap`` rule: when only the input
carries the vmapped axis (e.g. one global model evaluated on every client's
data) the axis is folded into the batch, one large un-grouped op; when only
the kernel does, it is folded into the output features; when both do (each
client trains its own kernel) the op is issued once per client, unrolled,
never as a grouped convolution. Higher-order derivatives and forward-mode
differentiation are not supported by these two (custom VJP); use "xla".
"""

import contextlib
import functools
import threading
from typing import Callable, Iterator, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["CONV_IMPLS", "Conv", "Padding", "auto_impl", "conv2d",
    "explicit_padding", "max_pool", "per_client_training", "resolve_impl"]

CONV_IMPLS = ("xla", "im2col", "conv", "auto")
"""The convolution lowerings ``impl`` may name (see the module docstring)."""

Padding = Union[str, Sequence[tuple[int, int]]]
"""A convolution's padding: "SAME", "VALID" or explicit ``((lo, hi), (lo, hi))``
pads of height and width."""
_DIMENSION_NUMBERS = ("NHWC", "HWIO", "NHWC")


# Per thread: one thread tracing local training must not switch the
# lowering of another thread's evaluation.
_TRACING = threading.local()


@contextlib.contextmanager
def per_client_training() -> Iterator[None]:
  """Marks what is traced inside as local training of per-client kernels
  (the engine enters it around its vmapped trainer), for "auto"."""
  # The outer value is restored, not False, so nested uses stay marked.
  outer = getattr(_TRACING, "per_client", False)
  _TRACING.per_client = True
  try:
    yield
  finally:
    _TRACING.per_client = outer


def auto_impl(backend: str, per_client: bool) -> str:
  """What "auto" stands for on ``backend`` ("cpu", "gpu", "tpu", ...)
  where kernels are per client (local training) or shared."""
  if backend == "cpu":
    return "conv"
  return "im2col" if per_client else "xla"


def resolve_impl(impl: str) -> str:
  """The concrete implementation ``impl`` stands for ("auto": by backend
  and by ``per_client_training``, see ``auto_impl``)."""
  if impl not in CONV_IMPLS:
    raise ValueError(f"impl must be one of {CONV_IMPLS}, got {impl!r}")
  if impl == "auto":
    # Read when the layer is traced, not when it is built: one model traced
    # in the trainer and in evaluation gets a lowering for each.
    return auto_impl(jax.default_backend(),
                     getattr(_TRACING, "per_client", False))
  return impl


def explicit_padding(padding: Padding, kernel_hw, input_hw
                     ) -> tuple[tuple[int, int], tuple[int, int]]:
  """'SAME' / 'VALID' / ((lo, hi), (lo, hi)) -> explicit non-negative pads."""
  if isinstance(padding, str):
    if padding.upper() not in ("SAME", "VALID"):
      raise ValueError(
          f"padding must be 'SAME', 'VALID' or ((lo, hi), (lo, hi)), got "
          f"{padding!r}")
    pads = lax.padtype_to_pads(tuple(input_hw), tuple(kernel_hw), (1, 1),
                               padding.upper())
  else:
    pads = tuple(padding)
  try:
    pads = tuple((int(lo), int(hi)) for lo, hi in pads)
  except (TypeError, ValueError):
    raise ValueError(f"padding must be 'SAME', 'VALID' or ((lo, hi), "
                     f"(lo, hi)), got {padding!r}") from None
  if len(pads) != 2 or min(min(p) for p in pads) < 0:
    raise ValueError(f"padding must be two non-negative (lo, hi) pairs, got "
                     f"{padding!r}")
  return pads  # type: ignore[return-value]


# ---------------------------------------------------------------------------
# One-client building blocks (no client axis).


def _conv(x, kernel, pads):
  return lax.conv_general_dilated(x, kernel, (1, 1), pads,
                                  dimension_numbers=_DIMENSION_NUMBERS)


def _output_hw(input_hw, kernel_hw, pads):
  return tuple(n + lo + hi - k + 1
               for n, k, (lo, hi) in zip(input_hw, kernel_hw, pads,
                                        strict=True))


def _patches(x, kernel_hw, pads):
  """x [B, H, W, C] -> [B, H', W', kh*kw*C], (i, j, c) order as HWIO."""
  kh, kw = kernel_hw
  batch, _, _, channels = x.shape
  out_h, out_w = _output_hw(x.shape[1:3], kernel_hw, pads)
  padded = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
  # Window (i, j) then channel c: patch index (i * kw + j) * C + c, the
  # row order of an HWIO kernel reshaped to [kh * kw * C, F].
  windows = [padded[:, i:i + out_h, j:j + out_w, :]
             for i in range(kh) for j in range(kw)]
  return jnp.stack(windows, axis=3).reshape(batch, out_h, out_w,
                                            kh * kw * channels)


def _col2im(patch_grads, kernel_hw, pads, input_hw):
  """Adjoint of ``_patches``: [B, H', W', kh*kw*C] -> [B, H, W, C]."""
  kh, kw = kernel_hw
  batch, out_h, out_w, _ = patch_grads.shape
  grads = patch_grads.reshape(batch, out_h, out_w, kh * kw, -1)
  padded_h = input_hw[0] + pads[0][0] + pads[0][1]
  padded_w = input_hw[1] + pads[1][0] + pads[1][1]
  total = None
  for i in range(kh):
    for j in range(kw):
      window = jnp.pad(grads[:, :, :, i * kw + j, :],
                       ((0, 0), (i, padded_h - out_h - i),
                        (j, padded_w - out_w - j), (0, 0)))
      total = window if total is None else total + window
  return total[:, pads[0][0]:pads[0][0] + input_hw[0],
               pads[1][0]:pads[1][0] + input_hw[1], :]


def _conv_input_grad(dy, kernel, pads):
  """d(conv)/dx as a canonical convolution of dy with the flipped kernel."""
  kh, kw = kernel.shape[:2]
  flipped = jnp.transpose(jnp.flip(kernel, (0, 1)), (0, 1, 3, 2))
  # Stride 1: these pads make the flipped-kernel convolution of dy
  # [H', W'] come out exactly [H, W] again.
  back_pads = ((kh - 1 - pads[0][0], kh - 1 - pads[0][1]),
               (kw - 1 - pads[1][0], kw - 1 - pads[1][1]))
  return _conv(dy, flipped, back_pads)


def _conv_kernel_grad(x, dy, pads):
  """d(conv)/dkernel as a canonical convolution, batch <-> features."""
  x_t = jnp.transpose(x, (3, 1, 2, 0))  # [C, H, W, B]: B as features.
  dy_t = jnp.transpose(dy, (1, 2, 0, 3))  # [H', W', B, F]: a "kernel".
  return jnp.transpose(_conv(x_t, dy_t, pads), (1, 2, 0, 3))


# ---------------------------------------------------------------------------
# Batching rules.


def _fold_or_unroll(fn: Callable, fold_first=None, fold_second=None):
  """Wraps a two-array function ``fn(a, b)`` with a ``vmap`` rule.

  Args:
    fn: one-client function of two arrays.
    fold_first: ``(fn, a_batched [K, ...], b) -> [K, ...]`` used when only
      ``a`` is batched (one un-batched call); None to unroll instead.
    fold_second: the same when only ``b`` is batched.

  Returns:
    ``fn`` with a custom vmap rule: fold when one side is shared, otherwise
    one call per batch element (unrolled; never a grouped op).
  """
  wrapped = jax.custom_batching.custom_vmap(fn)

  @wrapped.def_vmap
  def rule(axis_size, in_batched, a, b):
    a_batched, b_batched = in_batched
    if a_batched and not b_batched and fold_first is not None:
      return fold_first(wrapped, a, b), True
    if b_batched and not a_batched and fold_second is not None:
      return fold_second(wrapped, a, b), True
    # Both sides batched (each client its own kernel): one call per client,
    # never the grouped convolution this module exists to avoid.
    outs = [wrapped(a[i] if a_batched else a, b[i] if b_batched else b)
            for i in range(axis_size)]
    return jnp.stack(outs), True

  return wrapped


def _fold_into_batch(fn, x, other):
  """x [K, B, ...] shared ``other``: one call on [K*B, ...]."""
  k, b = x.shape[:2]
  out = fn(x.reshape((k * b,) + x.shape[2:]), other)
  return out.reshape((k, b) + out.shape[1:])


def _fold_into_features(fn, x, kernel):
  """Shared x, kernel [K, ..., F]: one call with K*F output features."""
  k, f = kernel.shape[0], kernel.shape[-1]
  # K outer within the output features, so the output's last axis splits
  # back into (K, F).
  merged = jnp.moveaxis(kernel, 0, -2).reshape(kernel.shape[1:-1] + (k * f,))
  out = fn(x, merged)
  out = out.reshape(out.shape[:-1] + (k, f))
  return jnp.moveaxis(out, -2, 0)


# How "im2col" computes the input gradient ("conv": a canonical convolution;
# "col2im": patch-gradient matmul folded back by summing shifted windows,
# measured slower on XLA:CPU) and batches per-client matmuls ("batched": one
# batched dot; "unroll": one dot per client). Private, for benchmarks.
_OPTIONS = {"input_grad": "conv", "batching": "batched"}


def _per_client_matmul(spec):
  """A matmul ``einsum(spec)`` of two per-client arrays, batched or unrolled."""
  def one(a, b):
    return jnp.einsum(spec, a, b)
  if _OPTIONS["batching"] == "unroll":
    return _fold_or_unroll(one)
  lhs, rest = spec.split(",")
  rhs, out = rest.split("->")
  wrapped = jax.custom_batching.custom_vmap(one)

  @wrapped.def_vmap
  def rule(axis_size, in_batched, a, b):
    del axis_size
    # "z" is the vmapped axis: a batched matmul when both sides carry it, a
    # plain matmul with z as a free dimension when one side is shared.
    batched_spec = (("z" if in_batched[0] else "") + lhs + "," +
                    ("z" if in_batched[1] else "") + rhs + "->z" + out)
    return jnp.einsum(batched_spec, a, b), True

  return wrapped


# Cached by (pads, sizes), hashable tuples: each layer shape builds its
# custom-VJP functions once, not at every trace.
@functools.lru_cache(maxsize=None)
def _make_im2col(pads, kernel_hw, input_hw):
  """im2col convolution for fixed padding and sizes (custom VJP + vmap)."""
  # The unused second argument fits ``_fold_or_unroll``'s two-array
  # interface; it is never batched, so a batched x folds into the batch.
  patches = _fold_or_unroll(
      lambda x, unused: _patches(x, kernel_hw, pads),
      fold_first=_fold_into_batch)
  # [B, H', W', P] @ [P, F].
  forward_matmul = _per_client_matmul("bhwp,pf->bhwf")
  # dk^T = dy^T @ patches: contracting over the leading positions of both
  # lets XLA transpose the small dy instead of the large patch tensor.
  kernel_grad_t = _per_client_matmul("bhwf,bhwp->fp")
  patch_grad = _per_client_matmul("bhwf,pf->bhwp")
  col2im = _fold_or_unroll(
      lambda g, unused: _col2im(g, kernel_hw, pads, input_hw),
      fold_first=_fold_into_batch)
  input_grad = _fold_or_unroll(
      lambda dy, k: _conv_input_grad(dy, k, pads),
      fold_first=_fold_into_batch)

  def forward(x, kernel):
    p = patches(x, jnp.zeros((), x.dtype))
    return forward_matmul(p, kernel.reshape(-1, kernel.shape[-1])), p

  @jax.custom_vjp
  def conv(x, kernel):
    return forward(x, kernel)[0]

  def conv_fwd(x, kernel):
    y, p = forward(x, kernel)
    # The patches are kept for the backward pass: the kernel gradient is
    # then one matmul, for kh * kw times the input's memory.
    return y, (p, kernel)

  def conv_bwd(residuals, dy):
    p, kernel = residuals
    flat_kernel = kernel.reshape(-1, kernel.shape[-1])
    dkernel = kernel_grad_t(dy, p).T.reshape(kernel.shape)
    if _OPTIONS["input_grad"] == "col2im":
      dx = col2im(patch_grad(dy, flat_kernel), jnp.zeros((), dy.dtype))
    else:
      dx = input_grad(dy, kernel)
    return dx, dkernel

  conv.defvjp(conv_fwd, conv_bwd)
  return conv


@functools.lru_cache(maxsize=None)
def _make_canonical(pads):
  """Canonical-convolution implementation (custom VJP + vmap)."""
  forward = _fold_or_unroll(
      lambda x, k: _conv(x, k, pads), fold_first=_fold_into_batch,
      fold_second=_fold_into_features)
  input_grad = _fold_or_unroll(
      lambda dy, k: _conv_input_grad(dy, k, pads),
      fold_first=_fold_into_batch)
  kernel_grad = _fold_or_unroll(
      lambda x, dy: _conv_kernel_grad(x, dy, pads))

  @jax.custom_vjp
  def conv(x, kernel):
    return forward(x, kernel)

  def conv_fwd(x, kernel):
    return forward(x, kernel), (x, kernel)

  def conv_bwd(residuals, dy):
    x, kernel = residuals
    return input_grad(dy, kernel), kernel_grad(x, dy)

  conv.defvjp(conv_fwd, conv_bwd)
  return conv


def conv2d(x, kernel, padding: Padding = "SAME", impl: str = "auto"):
  """2-D convolution, stride 1, no dilation.

  Args:
    x: [B, H, W, C] (NHWC).
    kernel: [kh, kw, C, F] (HWIO).
    padding: 'SAME', 'VALID' or explicit ((top, bottom), (left, right)).
    impl: one of ``CONV_IMPLS`` (see the module docstring).

  Returns:
    [B, H', W', F], equal to ``lax.conv_general_dilated`` with the same
    padding for every ``impl``.
  """
  impl = resolve_impl(impl)
  if x.ndim != 4 or kernel.ndim != 4 or x.shape[-1] != kernel.shape[2]:
    raise ValueError(
        f"x must be [B, H, W, C] and kernel [kh, kw, C, F] with the same C, "
        f"got x {x.shape} and kernel {kernel.shape}")
  pads = explicit_padding(padding, kernel.shape[:2], x.shape[1:3])
  # Refused here, in Python: an empty output would otherwise fail inside
  # the custom VJPs' reshapes with a less helpful message.
  if min(_output_hw(x.shape[1:3], kernel.shape[:2], pads)) < 1:
    raise ValueError(f"kernel {kernel.shape[:2]} is larger than the padded "
                     f"input {x.shape[1:3]} with padding {pads}")
  if impl == "xla":
    return _conv(x, kernel, pads)
  if impl == "im2col":
    return _make_im2col(pads, tuple(kernel.shape[:2]), tuple(x.shape[1:3]))(
        x, kernel)
  return _make_canonical(pads)(x, kernel)


def max_pool(x, window: tuple[int, int] = (2, 2), strides=None,
             padding: str = "VALID"):
  """Max pooling over [B, H, W, C], as ``flax.linen.max_pool``.

  Non-overlapping 'VALID' windows (``strides`` None or equal to ``window``)
  take a fast path: a reshape and a max, with a custom VJP that routes
  each window's gradient to its first maximal element (row-major order
  within the window), as ``flax.linen.max_pool``'s gradient does for
  windows without ties. That avoids both XLA:CPU's select-and-scatter and
  the tie counting of ``jnp.max``'s gradient. Other settings call
  ``flax.linen.max_pool``.

  Args:
    x: [B, H, W, C].
    window: (wh, ww) window size.
    strides: (sh, sw), default ``window``.
    padding: 'VALID' or 'SAME'.

  Returns:
    [B, H', W', C].
  """
  # Plain int tuples: they key ``_window_max``'s cache.
  window = tuple(int(w) for w in window)
  strides = window if strides is None else tuple(int(s) for s in strides)
  if x.ndim != 4:
    raise ValueError(f"x must be [B, H, W, C], got shape {x.shape}")
  if strides != window or padding != "VALID":
    return nn.max_pool(x, window, strides=strides, padding=padding)
  return _window_max(window)(x)


@functools.lru_cache(maxsize=None)
def _window_max(window):
  wh, ww = window

  def windows(x):
    batch, h, w, c = x.shape
    x = x[:, :h // wh * wh, :w // ww * ww, :]  # VALID drops the remainder
    return x.reshape(batch, h // wh, wh, w // ww, ww, c)

  @jax.custom_vjp
  def pool(x):
    return jnp.max(windows(x), axis=(2, 4))

  def pool_fwd(x):
    y = pool(x)
    return y, (x, y)

  def pool_bwd(residuals, dy):
    x, y = residuals
    blocks = windows(x)
    # Row-major scan within each window: ``seen`` lets only the first
    # maximal element take dy, so ties do not split the gradient.
    seen = jnp.zeros(y.shape, bool)
    rows = []
    for i in range(wh):
      cols = []
      for j in range(ww):
        is_max = (blocks[:, :, i, :, j, :] == y) & ~seen
        seen = seen | is_max
        cols.append(jnp.where(is_max, dy, jnp.zeros_like(dy)))
      rows.append(jnp.stack(cols, axis=3))
    grads = jnp.stack(rows, axis=2).reshape(blocks.shape)
    batch, h, w, c = x.shape
    grads = grads.reshape(batch, grads.shape[1] * wh, grads.shape[3] * ww, c)
    # Rows and columns that VALID pooling dropped get zero gradient.
    return (jnp.pad(grads, ((0, 0), (0, h - grads.shape[1]),
                            (0, w - grads.shape[2]), (0, 0))),)

  pool.defvjp(pool_fwd, pool_bwd)
  return pool


class Conv(nn.Module):
  """2-D convolution, NHWC, stride 1, 'SAME' or 'VALID' padding."""
  features: int
  kernel_size: tuple[int, int]
  padding: Padding = "SAME"
  use_bias: bool = True
  impl: str = "auto"

  @nn.compact
  def __call__(self, x):
    # float32 parameters whatever the input's dtype, as flax's default;
    # ``models.mixed`` casts them per call and keeps these as masters.
    kernel = self.param(
        "kernel", nn.initializers.lecun_normal(),
        tuple(self.kernel_size) + (x.shape[-1], self.features), jnp.float32)
    y = conv2d(x, kernel, self.padding, self.impl)
    if self.use_bias:
      bias = self.param("bias", nn.initializers.zeros, (self.features,),
                        jnp.float32)
      y = y + bias
    return y
