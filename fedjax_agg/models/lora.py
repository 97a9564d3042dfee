"""LoRA adapters on a frozen network: the trainable part is the adapters.

Hu, Shen, Wallis, Allen-Zhu, Li, Wang, Wang, Chen, "LoRA: Low-Rank
Adaptation of Large Language Models", ICLR 2022.

A targeted layer with kernel W0 (out x in, the paper's orientation) computes

  h = W0 x + (alpha / r) B A x                                    # Eq. (3)

with A [r, d_in] and B [d_out, r] (rank r << min(d_in, d_out)); W0 stays
frozen. A starts random and B at zero (Sec. 4.1), so the adapted network
equals the base network at initialisation.

``lora(model, base_variables, rank=...)`` returns a ``types.Model`` whose
``init`` returns ONLY the adapters and whose ``apply(adapters, x, train)``
runs the base network with every targeted layer adapted. The base variables
are closed over: one copy serves every client. The engine vmaps local
training over the stacked adapters [K, ...] and the base weights enter as
unbatched operands of the same program (the adapter branch ``B (A x)`` is
the only per-client computation), so nothing of the base is replicated.
Since the params the library sees are the adapters, local training,
aggregation, checkpoints, byte counts and evaluation all act on adapters
only, and the base is bit-identical after any number of rounds.

The adapters tree (``is_adapters``)::

  {"lora": {"<module path>": {"a": [r, d_in], "b": [d_out, r]}}}

keyed by the '/'-joined path of the adapted module ("fc1",
"_Block_0/MultiHeadDotProductAttention_0/query"). d_in and d_out are the
products of the layer's input and output feature axes (flax's attention
projections have kernels [width, heads, head_dim] and [heads, head_dim,
width]). ``freeze_a=True`` (FFA-LoRA) keeps A in the closure, fixed at its
random initialisation, and the tree holds only "b". ``merged=True`` (FLoRA)
adds a frozen "merged" [d_out, d_in] per layer, which the server
accumulates and the model adds to W0 (``h = W0 x + (alpha / r) (merged + B
A) x``); it never receives a gradient.

Interpretation choices:

* Targets: ``nn.Dense`` and ``nn.DenseGeneral`` layers only (the papers'
  dense and attention projections; LoRA's Sec. 4.2 adapts W_q, W_k, W_v,
  W_o). A pattern that matches no such layer, or matches any other kernel
  (a convolution, a recurrent cell's), is refused naming ``targets``.
* A ~ N(0, 1 / d_in) (the paper says "random Gaussian" without a scale;
  this keeps ``A x`` of the size of x's entries), B = 0.
* Dropout (the LoRA reference implementation's ``lora_dropout``) applies to
  the adapter's input x only, in training. ``types.Model.apply`` takes no
  random key, so the mask's key is derived from ``key``, the bits of the
  current adapters and the batch: a new mask at every local step and for
  every client (its adapters differ), the same for the same run.
* The base runs in inference mode (``train=False``): BatchNorm layers use
  the base's running statistics and never update them (they are part of
  the frozen base); ``train`` only switches the adapter dropout.
* Gradients: the adapter product has its own VJP (``_low_rank``, chosen
  for the layout XLA's CPU compiler reads fastest), so a LoRA model is
  differentiable in reverse mode only (``jax.grad``, not ``jax.jvp``).
  Its rows are independent in training (``engine.ROWS_INDEPENDENT``):
  local training leaves the padding rows out of an epoch's last batch,
  which also changes the batch bits the dropout masks are drawn from.
* Precision: the network computes in its adapters' dtype. Adapters in
  bfloat16 (``models.mixed``, ``matmul_precision="bfloat16"``) cast the
  frozen base's floating variables and a frozen A to bfloat16 for the
  products, once per call and outside the client axis; float32 adapters
  leave the base as it is.
"""

import dataclasses
from typing import (Any, Callable, Mapping, NamedTuple, Optional,
                    Sequence)

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg import tree_math
from fedjax_agg.models._lora_targets import _discover
from fedjax_agg.models._lora_targets import _select
from fedjax_agg.models._lora_targets import Target
from fedjax_agg.types import Model, Params, PRNGKey

__all__ = ["ADAPTERS", "LoRASpec", "MAX_ALPHA", "TRANSFORMER_TARGETS",
           "Target", "check_adapters", "init_a", "is_adapters", "lora",
           "merge", "num_trainable", "select_targets", "sent", "spec",
           "truncate", "uplink_bytes", "weighted_product"]

ADAPTERS = "lora"
"""The top-level key of an adapters tree (it marks a tree as adapters)."""

TRANSFORMER_TARGETS = (
    r"_Block_\d+/MultiHeadDotProductAttention_\d+/(query|key|value|out)",
    r"_Block_\d+/Dense_\d+")
"""``transformer_lm``'s attention projections and MLP layers (every Dense
layer but the output layer)."""

MAX_ALPHA = float(np.finfo(np.float32).max)
"""The largest ``alpha``: the scale alpha / r is a float32 factor."""

_LEAVES = ("a", "b", "merged")
_TRAINABLE = ("a", "b")


class LoRASpec(NamedTuple):
  """What ``lora`` fixed (``spec(model)``).

  Attributes:
    base_variables: the frozen base network's variables.
    targets: the adapted layers.
    rank: r.
    scale: alpha / r.
    dropout: the adapter input's dropout rate.
    frozen_a: path -> A [r, d_in] for FFA-LoRA (``freeze_a=True``), else
      None.
    merged: whether the adapters carry FLoRA's frozen "merged" leaf.
  """
  base_variables: Params
  targets: tuple[Target, ...]
  rank: int
  scale: float
  dropout: float
  frozen_a: Optional[Mapping[str, jax.Array]]
  merged: bool


@dataclasses.dataclass(frozen=True, eq=False)
class _AdaptedApply:
  """``apply(adapters, x, train)`` of a LoRA model; carries its spec. A
  dataclass, so that a checkpoint's fingerprint (``fingerprint.describe``)
  holds its fields: the base's variables, rank, scale, dropout, frozen A."""
  spec: LoRASpec
  _base_apply: Callable
  _dropout_key: jax.Array
  # ``engine.ROWS_INDEPENDENT``: the base runs in inference mode (no batch
  # statistics), so local training may leave out an epoch's padding rows.
  rows_independent = True

  @property
  def _by_path(self) -> dict:
    return {t.path: t for t in self.spec.targets}

  def __call__(self, adapters, x, train: bool = False):
    lora_spec = self.spec
    by_path = self._by_path
    nodes = check_adapters(adapters, "apply", "adapters")
    # The adapted paths are tree structure, not data: a mismatch is refused at
    # trace time, before anything is compiled.
    if set(nodes) != set(by_path):
      raise ValueError(f"adapters must adapt {sorted(by_path)}, got "
                       f"{sorted(nodes)}")
    use_dropout = bool(train) and lora_spec.dropout > 0
    step_key = _step_key(self._dropout_key, nodes, x) if use_dropout else None
    # The network computes in its adapters' dtype, as a plain network in
    # its variables': bfloat16 adapters (``models.mixed``) multiply the
    # frozen base (and a frozen A) in bfloat16 too.
    dtype = jnp.result_type(*[node["b"] for node in nodes.values()])
    base_variables = _cast_floats(lora_spec.base_variables, dtype)
    frozen_a = (None if lora_spec.frozen_a is None
                else _cast_floats(lora_spec.frozen_a, dtype))

    def adapt(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      path = "/".join(context.module.path)
      # The interceptor sees every method of every module; only a target's
      # __call__ is adapted.
      if context.method_name != "__call__" or path not in by_path:
        return out
      target = by_path[path]
      node = nodes[path]
      a = frozen_a[path] if frozen_a is not None else node["a"]
      inputs = args[0]
      # The layer contracts its trailing in_shape axes; the leading ones (batch,
      # sequence) are kept, so the branch runs on [..., d_in] and is reshaped
      # back to the layer's output axes.
      lead = inputs.shape[:inputs.ndim - len(target.in_shape)]
      flat = inputs.reshape(lead + (target.d_in,))
      dropped = flat
      if use_dropout:
        # Each layer folds in its index: two layers of one step draw different
        # masks.
        layer_key = jax.random.fold_in(
            step_key, list(by_path).index(path))
        keep = jax.random.bernoulli(layer_key, 1.0 - lora_spec.dropout,
                                    flat.shape)
        dropped = jnp.where(keep, flat / (1.0 - lora_spec.dropout), 0.0)
      # Eq. (3): (alpha / r) B A x, never forming B A.
      delta = _low_rank(dropped, a, node["b"])
      if lora_spec.merged:
        # "merged" is part of the frozen weight, not of the adapter branch:
        # it reads x without dropout and never gets a gradient (the server
        # writes it).
        delta = delta + flat @ jax.lax.stop_gradient(node["merged"]).T
      delta = lora_spec.scale * delta
      return out + delta.reshape(lead + target.out_shape).astype(out.dtype)

    with nn.intercept_methods(adapt):
      # The base runs in inference mode whatever ``train``: its BatchNorm
      # statistics are frozen with the rest of it.
      outputs, _ = self._base_apply(base_variables, x, False)
    return outputs, adapters


@jax.custom_vjp
def _low_rank(x, a, b):
  """(x A^T) B^T, never forming B A: x [..., d_in], A [r, d_in], B [d_out,
  r] -> [..., d_out]. Its VJP is written out so that every gradient is a
  product whose large operand (x, or the output's cotangent) is read in
  the layout it is stored in: autodiff's own dB = g^T (x A^T) made XLA's
  CPU compiler transpose g [N, d_out] (with the MLP's GELU derivative
  fused into that strided copy), 24 % of FedIT's local-training call of
  ``experiments/bench/finetune_bench.py``. Reverse mode only (no jvp)."""
  return (x @ a.T) @ b.T


def _low_rank_fwd(x, a, b):
  projected = x @ a.T
  return projected @ b.T, (x, a, b, projected)


def _low_rank_bwd(residuals, g):
  x, a, b, projected = residuals
  rows = lambda z: z.reshape(-1, z.shape[-1])  # [N, features]
  over_rows = ((0,), (0,)), ((), ())
  g_projected = g @ b  # [..., r]
  grad_a = jax.lax.dot_general(rows(g_projected), rows(x), over_rows)
  # B's gradient as [r, d_out] = (x A^T)^T g, transposed once it is small;
  # the barrier keeps XLA from folding that transpose back into the
  # product (which reads g transposed again).
  grad_b_t = jax.lax.optimization_barrier(
      jax.lax.dot_general(rows(projected), rows(g), over_rows))
  return g_projected @ a, grad_a, grad_b_t.T


_low_rank.defvjp(_low_rank_fwd, _low_rank_bwd)


def _cast_floats(tree, dtype):
  """``tree`` with its floating leaves of another dtype cast to ``dtype``
  (the same tree where there are none)."""
  return jax.tree.map(
      lambda leaf: leaf.astype(dtype) if jnp.issubdtype(
          leaf.dtype, jnp.floating) and leaf.dtype != dtype else leaf, tree)


def _step_key(dropout_key, nodes, x):
  """A key that changes with the adapters' and the batch's bits."""
  def bits(leaf):
    leaf = jax.lax.stop_gradient(leaf)
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      # Sums of the raw bits: a change of an entry changes the key (but for
      # a 2^-32 collision), where a float sum could absorb a small change.
      leaf = jax.lax.bitcast_convert_type(leaf.astype(jnp.float32),
                                          jnp.uint32)
    return jnp.sum(leaf.astype(jnp.uint32), dtype=jnp.uint32)
  key = jax.random.fold_in(dropout_key, bits(x))
  # Sorted paths: the key must not depend on the dict's insertion order.
  for path in sorted(nodes):
    for name in _TRAINABLE:
      if name in nodes[path]:
        key = jax.random.fold_in(key, bits(nodes[path][name]))
  return key


def init_a(key: PRNGKey, rank: int, d_in: int) -> jax.Array:
  """A random LoRA A [rank, d_in] ~ N(0, 1 / d_in) (Hu et al. Sec. 4.1:
  A Gaussian, B zero)."""
  return jax.random.normal(key, (rank, d_in), jnp.float32) / np.sqrt(d_in)


def select_targets(model: Model, targets: Optional[Sequence[str]]
                   ) -> tuple[str, ...]:
  """The paths of the Dense layers of the network ``model`` that
  ``targets`` selects, as ``lora`` selects them (from shapes only:
  nothing is computed); a pattern that is no regular expression or
  matches no Dense layer (naming those there are) is refused naming
  ``targets``."""
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  dense, kernels = _discover(model, shapes)
  if targets is None:
    targets = getattr(model.apply, "lora_targets", None)
  return tuple(target.path for target in _select(targets, dense, kernels))


def lora(model: Model, base_variables: Params, *, rank: int,
         alpha: Optional[float] = None,
         targets: Optional[Sequence[str]] = None, dropout: float = 0.0,
         freeze_a: bool = False, merged: bool = False,
         key: PRNGKey) -> Model:
  """The network ``model`` with LoRA adapters on its Dense layers.

  Args:
    model: the base network (a flax network behind ``types.Model``, such
      as ``models.get(...)``).
    base_variables: its (pre-trained) variables, frozen and closed over.
    rank: r, the adapters' rank (an int >= 1, at most min(d_in, d_out) of
      every targeted layer).
    alpha: the scale's numerator (the update is (alpha / r) B A), a
      number in (0, ``MAX_ALPHA``]; default r (scale 1), the paper's
      "alpha = the first r tried".
    targets: regular expressions matched in full against the Dense layers'
      '/'-joined module paths (``TRANSFORMER_TARGETS`` for
      ``transformer_lm``; "fc1", "fc\\d+" for the CNNs); None: the
      model's ``apply.lora_targets`` where it has them (a checkpoint from
      ``models.pretrained``: its attention and MLP projections), else
      every Dense layer.
    dropout: the rate of dropout on the adapters' input in training, in
      [0, 1).
    freeze_a: FFA-LoRA: A fixed at its random initialisation (drawn from
      ``key``) in the model, only B in the params.
    merged: FLoRA: a frozen "merged" [d_out, d_in] leaf per layer in the
      params (zero at init), added to the base weight (scaled by alpha /
      r, like B A).
    key: a PRNG key (``jax.random.key(seed)``): draws a frozen A and
      seeds the dropout masks.

  Returns:
    A ``types.Model``: ``init(key) -> adapters`` (A from ``key``, B zero),
    ``apply(adapters, x, train) -> (outputs, adapters)``, the base's loss.
    ``spec(model)`` gives what was fixed here.
  """
  if not isinstance(model, Model):
    raise TypeError(f"model must be a types.Model, got "
                    f"{type(model).__name__}")
  checks.check_int("rank", rank, 1)
  if alpha is None:
    alpha = float(rank)
  # alpha / r scales a float32 product: beyond float32's range the update
  # would be inf (and 0 * inf = NaN at B = 0).
  _check_scalar("alpha", alpha, 0, MAX_ALPHA, low_open=True)
  _check_scalar("dropout", dropout, 0, 1, high_open=True)
  _check_key(key)
  checks.check_bool("freeze_a", freeze_a)
  checks.check_bool("merged", merged)
  if freeze_a and merged:
    raise ValueError("freeze_a and merged: FLoRA (merged) re-initialises "
                     "A every round, FFA-LoRA (freeze_a) never does; "
                     "choose one")
  if not isinstance(base_variables, Mapping) or "params" not in (
      base_variables):
    raise ValueError("base_variables must be the base network's variables "
                     "({'params': ...})")
  shapes = jax.eval_shape(model.init, jax.random.key(0))
  # Checked before anything closes over them: a wrong tree would otherwise
  # surface only inside apply's trace, far from this call.
  if jax.tree.structure(shapes) != jax.tree.structure(base_variables) or any(
      s.shape != np.shape(v) for s, v in zip(
          jax.tree.leaves(shapes), jax.tree.leaves(base_variables),
          strict=True)):
    raise ValueError("base_variables do not have the tree and shapes of "
                     "model.init's variables")
  dense, kernels = _discover(model, base_variables)
  if targets is None:  # a loaded checkpoint's own (models.pretrained)
    targets = getattr(model.apply, "lora_targets", None)
  chosen = _select(targets, dense, kernels)
  for target in chosen:
    if rank > min(target.d_in, target.d_out):
      raise ValueError(f"rank={rank} exceeds min(d_in, d_out) = "
                       f"{min(target.d_in, target.d_out)} of {target.path!r}")
  frozen = None
  if freeze_a:
    # Indices 0..len(chosen)-1 of ``key`` draw frozen As, len(chosen) the
    # dropout key: separate streams from the one key the caller gives.
    frozen = {t.path: init_a(jax.random.fold_in(key, i), rank, t.d_in)
              for i, t in enumerate(chosen)}
  lora_spec = LoRASpec(jax.tree.map(jnp.asarray, base_variables), chosen,
                       int(rank), float(alpha) / rank, float(dropout),
                       frozen, merged)

  def init(init_key):
    adapters = {}
    for i, target in enumerate(chosen):
      node = {"b": jnp.zeros((target.d_out, rank), jnp.float32)}
      if not freeze_a:
        node["a"] = init_a(jax.random.fold_in(init_key, i), rank,
                           target.d_in)
      if merged:
        node["merged"] = jnp.zeros((target.d_out, target.d_in), jnp.float32)
      adapters[target.path] = node
    return {ADAPTERS: adapters}

  apply = _AdaptedApply(lora_spec, model.apply,
                        jax.random.fold_in(key, len(chosen)))
  return Model(init, apply, model.loss)


def _check_scalar(name: str, value, low, high, **bounds) -> None:
  """``checks.check_range`` for one number (a list or an array of one
  entry is not a number here)."""
  if not checks.is_traced(value) and np.ndim(value) != 0:
    expected = checks.describe_range(low, high, **bounds)
    raise TypeError(f"{name} must be a number {expected}, got {value!r} "
                    f"({type(value).__name__})")
  checks.check_range(name, value, low, high, **bounds)


def _check_key(key) -> None:
  """A PRNG key: a typed key of shape () (``jax.random.key``) or a raw
  uint32 [2] (``jax.random.PRNGKey``)."""
  dtype, shape = getattr(key, "dtype", None), np.shape(key) if hasattr(
      key, "shape") else None
  typed = dtype is not None and jax.dtypes.issubdtype(
      dtype, jax.dtypes.prng_key) and shape == ()
  raw = dtype == np.uint32 and shape == (2,)
  if not (typed or raw):
    raise TypeError(f"key must be a PRNG key (jax.random.key(seed)), got "
                    f"{key!r} ({type(key).__name__})")


def spec(model: Model) -> LoRASpec:
  """The ``LoRASpec`` of a model built by ``lora`` (TypeError naming
  ``model`` for any other)."""
  apply = getattr(model, "apply", None)
  if not isinstance(apply, _AdaptedApply):
    raise TypeError("model must be built by models.lora.lora")
  return apply.spec


def is_adapters(params: Params) -> bool:
  """Whether ``params`` (one model or stacked [K, ...]) is an adapters
  tree: only the "lora" key, each node holding "b" and at most "a" and
  "merged"."""
  if not isinstance(params, Mapping) or set(params) != {ADAPTERS}:
    return False
  nodes = params[ADAPTERS]
  return isinstance(nodes, Mapping) and bool(nodes) and all(
      isinstance(node, Mapping) and "b" in node and set(node) <= set(_LEAVES)
      and not any(isinstance(v, Mapping) for v in node.values())
      for node in nodes.values())


def check_adapters(params: Params, rule: str, name: str = "params", *,
                   need: Sequence[str] = ("b",),
                   refuse: Sequence[str] = ()) -> Mapping[str, Any]:
  """``params[ADAPTERS]`` (path -> node) of an adapters tree; ValueError
  naming ``rule`` for anything else.

  Args:
    params: the tree to check.
    rule: who asks (named in the error).
    name: the argument's name (named in the error).
    need: leaves every node must hold.
    refuse: leaves no node may hold.
  """
  if not is_adapters(params):
    keys = sorted(params) if isinstance(params, Mapping) else type(
        params).__name__
    raise ValueError(f"{rule}: {name} are not LoRA adapters (a tree "
                     f"{{'{ADAPTERS}': {{path: {{'a', 'b'}}}}}} from "
                     f"models.lora.lora); got keys {keys}")
  nodes = params[ADAPTERS]
  for path, node in nodes.items():
    missing = [leaf for leaf in need if leaf not in node]
    extra = [leaf for leaf in refuse if leaf in node]
    if missing or extra:
      raise ValueError(
          f"{rule}: the adapters of {path!r} hold {sorted(node)}; "
          f"{rule} needs {list(need)} and cannot take {list(refuse)}")
  return nodes


def check_round(rule: str, global_params: Params, client_params: Params,
                info, *, weighting: str, need: Sequence[str],
                refuse: Sequence[str] = ()) -> tuple[Mapping, Mapping]:
  """An adapter rule's checks of one aggregation: both trees are adapters
  holding ``need`` and none of ``refuse`` (``check_adapters``), and the
  cohort is well formed (``checks.check_cohort``; ``num_examples`` read
  only for example weighting). -> (global nodes, client nodes)."""
  nodes = tuple(check_adapters(params, rule, name, need=need, refuse=refuse)
                for name, params in (("global_params", global_params),
                                     ("client_params", client_params)))
  checks.check_cohort(global_params, client_params, info,
                      uses_num_examples=weighting == "num_examples")
  return nodes


def merge(model: Model, adapters: Params) -> Params:
  """The base variables with every targeted kernel replaced by W0 + (alpha /
  r) (merged + B A), in the base's kernel shape (for saving or evaluating
  the adapted network as a plain one: ``base_model.apply(merge(...), x,
  False)`` equals the LoRA model's output)."""
  lora_spec = spec(model)
  nodes = check_adapters(adapters, "merge", "adapters")
  params = dict(lora_spec.base_variables["params"])
  for target in lora_spec.targets:
    node = nodes[target.path]
    a = (lora_spec.frozen_a[target.path] if lora_spec.frozen_a is not None
         else node["a"])
    product = jnp.matmul(node["b"], a, precision=tree_math.FULL)
    if "merged" in node:
      product = product + node["merged"]
    *parents, leaf = target.path.split("/")
    where = params
    for parent in parents:
      # Copies along the target's path only: the base's own dicts are shared
      # with the model's closure and must not change.
      where[parent] = dict(where[parent])
      where = where[parent]
    where[leaf] = dict(where[leaf])
    kernel = where[leaf]["kernel"]
    # product is [d_out, d_in] (the paper's orientation); a flax kernel is
    # [in axes..., out axes...], hence the transpose before the reshape.
    delta = (lora_spec.scale * product).T.reshape(kernel.shape)
    where[leaf]["kernel"] = (kernel + delta).astype(kernel.dtype)
  return {**lora_spec.base_variables, "params": params}


def num_trainable(model: Model) -> int:
  """The trainable scalars of a LoRA model: r (d_in + d_out) per targeted
  layer (r d_out with a frozen A); FLoRA's frozen "merged" leaves are not
  counted. From shapes only."""
  spec(model)
  shapes = jax.eval_shape(model.init, jax.random.key(0))[ADAPTERS]
  return sum(int(np.prod(node[leaf].shape)) for node in shapes.values()
             for leaf in _TRAINABLE if leaf in node)


def sent(params: Params) -> Params:
  """What a client sends up of ``params`` (one model or stacked [K, ...]):
  of an adapters tree its A and B only (FLoRA's frozen "merged" leaves
  are the server's: it adds the stacked product to them itself); any
  other tree whole. The systems' clock counts the uplink of this tree."""
  if not is_adapters(params):
    return params
  return {ADAPTERS: {path: {leaf: value for leaf, value in node.items()
                            if leaf in _TRAINABLE}
                     for path, node in params[ADAPTERS].items()}}


def uplink_bytes(params: Params) -> int:
  """Bytes a client sends up per round: its A and B (``sent``) in
  float32; FLoRA's frozen "merged" leaves stay on the server's side."""
  check_adapters(params, "uplink_bytes")
  return sum(4 * int(np.prod(np.shape(leaf)))
             for leaf in jax.tree.leaves(sent(params)))


def truncate(params: Params, rank) -> Params:
  """The adapters with rank components >= ``rank`` set to zero (rows of A,
  columns of B; HetLoRA's truncation, written as zero padding to keep the
  shapes). ``rank`` may be traced (vmappable over clients)."""
  nodes = check_adapters(params, "truncate")
  out = {}
  for path, node in nodes.items():
    columns = jnp.arange(node["b"].shape[-1]) < rank
    new = dict(node)
    new["b"] = jnp.where(columns, node["b"], 0.0).astype(node["b"].dtype)
    if "a" in node:
      new["a"] = jnp.where(columns[:, None], node["a"], 0.0).astype(
          node["a"].dtype)
    out[path] = new
  return {ADAPTERS: out}


def weighted_product(a: jax.Array, b: jax.Array, weights: jax.Array
                     ) -> jax.Array:
  """sum_k w_k B_k A_k [d_out, d_in] of K stacked adapters, by stacking.

  The K adapters are stacked along the rank axis, B = [B_1 ... B_K]
  [d_out, K r] and A = [w_1 A_1; ...; w_K A_K] [K r, d_in], so that B A
  is the weighted sum of the products (FLoRA's stacking). Rows of weight
  0 (padding) are selected out, NaN or not.

  Args:
    a: [K, r, d_in].
    b: [K, d_out, r].
    weights: [K].
  """
  live = weights != 0
  a = jnp.where(live[:, None, None], a * weights[:, None, None], 0.0)
  b = jnp.where(live[:, None, None], b, 0.0)
  num, rank, d_in = a.shape
  stacked_a = a.reshape(num * rank, d_in)
  stacked_b = jnp.moveaxis(b, 0, 1).reshape(b.shape[1], num * rank)
  return jnp.matmul(stacked_b, stacked_a, precision=tree_math.FULL)
