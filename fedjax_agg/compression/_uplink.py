"""A round's uplink through a codec: ``compress_tree`` /
``compress_updates`` of a client's update, message sizes, and
``with_codec``, the client side that sends every update through a codec
(with error feedback) inside the jitted round.
"""

import math
from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import checks
from fedjax_agg import engine
from fedjax_agg import rounds
from fedjax_agg import tree_math
from fedjax_agg.compression._codecs import CODEC_STREAM
from fedjax_agg.compression._codecs import Codec
from fedjax_agg.types import LocalUpdate, Params, PRNGKey, StackedParams


def _shape(leaf) -> tuple[int, ...]:
  return tuple(leaf.shape) if hasattr(leaf, "shape") else np.shape(leaf)


def compress_tree(codec: Codec, tree: Params, key: PRNGKey) -> Params:
  """Every leaf of ``tree`` flattened, sent through ``codec`` and decoded.

  Leaf i uses ``jax.random.fold_in(key, i)``; the result has the leaf's
  shape and dtype. A leaf with a non-finite entry decodes as all NaN (see
  the module docstring); empty leaves are kept as they are.
  """
  leaves, treedef = jax.tree.flatten(tree)
  decoded = []
  for i, leaf in enumerate(leaves):
    leaf = jnp.asarray(leaf)
    if leaf.size == 0:
      decoded.append(leaf)
      continue
    x = leaf.reshape(-1).astype(jnp.float32)
    x_hat = codec.decode(codec.encode(x, jax.random.fold_in(key, i)), x.size)
    x_hat = jnp.where(jnp.all(jnp.isfinite(x)), x_hat, jnp.nan)
    decoded.append(x_hat.reshape(leaf.shape).astype(leaf.dtype))
  return jax.tree.unflatten(treedef, decoded)


def compress_updates(codec: Codec, updates: StackedParams,
                     client_ids: jax.Array, key: PRNGKey) -> StackedParams:
  """The cohort's updates, each sent through ``codec`` and decoded.

  Row k goes through ``compress_tree`` with the key fold_in(fold_in(key,
  CODEC_STREAM), client_ids[k]): a client's draw depends on the round's
  key and its id, not on its row.

  Args:
    codec: the compressor.
    updates: [K, ...] one update per row.
    client_ids: [K] int, the client of each row.
    key: the round's key.

  Returns:
    [K, ...] the decoded updates, shaped and typed as ``updates``.
  """
  keys = jax.vmap(jax.random.fold_in, (None, 0))(
      jax.random.fold_in(key, CODEC_STREAM), client_ids)
  return jax.vmap(lambda u, k: compress_tree(codec, u, k))(updates, keys)


def message_bits(codec: Codec, tree: Any) -> int:
  """Bits of one client's message: the sum of ``codec.bits`` over the
  non-empty leaves of ``tree`` (arrays or ``jax.ShapeDtypeStruct``s)."""
  sizes = [math.prod(_shape(leaf)) for leaf in jax.tree.leaves(tree)]
  return sum(codec.bits(size) for size in sizes if size > 0)


def message_bytes(codec: Codec, tree: Any) -> int:
  """``message_bits`` rounded up to whole bytes."""
  return -(-message_bits(codec, tree) // 8)


class CompressionState(NamedTuple):
  """The client state of ``with_codec``.

  Attributes:
    inner: the wrapped update's client state.
    residuals: with error feedback, e_i per client: a tree like the model
      of float32 [N, ...] leaves (zeros at first); else ``()``.
  """
  inner: Any
  residuals: Any


def _relative_error(sent, decoded, rows: jax.Array) -> jax.Array:
  """Mean over ``rows`` of ||decoded - sent||^2 / max(||sent||^2, tiny)."""
  error = jax.vmap(tree_math.tree_norm)(
      jax.tree.map(jnp.subtract, decoded, sent))
  norm = jax.vmap(tree_math.tree_norm)(sent)
  ratio = jnp.square(error / jnp.maximum(norm, jnp.finfo(jnp.float32).tiny))
  total = jnp.sum(jnp.where(rows, ratio, 0.0))
  return total / jnp.maximum(jnp.sum(rows), 1).astype(jnp.float32)


def with_codec(codec: Codec, local_update: LocalUpdate | Callable[..., Any],
               *, error_feedback: bool = False,
               model_template: Optional[Params] = None) -> LocalUpdate:
  """``local_update`` whose clients send their updates through ``codec``.

  After the inner update, row k (client i) sends u = w_k - g, plus e_i
  with error feedback (EF-SGD of Karimireddy et al., ICML 2019),
  through ``compress_updates`` (the key fold_in(fold_in(round key,
  CODEC_STREAM), i)); its model becomes g + C(u). With error feedback
  e_i <- u - C(u) for the real rows (mask > 0) whose u and C(u) are
  finite; other rows change no residual. The result's losses are the
  inner update's (of the uncompressed models).

  Args:
    codec: the compressor (``compression.get(...)``).
    local_update: the clients' training: a ``LocalUpdate`` (its state and
      ``personalize`` are kept) or a function with the engine's interface
      ``(global_params, data, client_ids, learning_rates, num_steps, key)
      -> LocalResult``.
    error_feedback: keep a residual per client (a model-sized [N, ...]
      table: N x the model in memory).
    model_template: the model's params (or their ``jax.ShapeDtypeStruct``),
      needed for the residual table; when given, the round's global params
      are checked against its shapes.

  Returns:
    A ``LocalUpdate`` whose state is a ``CompressionState``. Metrics: the
    inner update's and ``compression_error`` (mean over the real rows of
    ||C(u) - u||^2 / ||u||^2).

  Raises:
    TypeError: an argument of the wrong kind.
    ValueError: ``error_feedback`` without ``model_template``; (traced)
      global params shaped unlike ``model_template``.
  """
  if not isinstance(codec, Codec):
    raise TypeError(f"codec must be a Codec, got {type(codec).__name__}")
  checks.check_bool("error_feedback", error_feedback)
  if error_feedback and model_template is None:
    raise ValueError("model_template: error_feedback=True keeps a residual "
                     "per client shaped like the model; pass the model's "
                     "params (or their jax.ShapeDtypeStruct) as "
                     "model_template")
  inner = rounds.as_local_update(local_update)
  template = None if model_template is None else jax.tree.map(
      lambda leaf: jax.ShapeDtypeStruct(_shape(leaf), jnp.float32),
      model_template)

  def init(num_clients):
    checks.check_int("num_clients", num_clients, low=1)
    residuals = ()
    if error_feedback:
      residuals = jax.tree.map(
          lambda s: jnp.zeros((num_clients,) + s.shape, jnp.float32),
          template)
    return CompressionState(inner.init(num_clients), residuals)

  def check_template(global_params):
    want = jax.tree.map(lambda s: s.shape, template)
    got = jax.tree.map(_shape, global_params)
    if template is not None and (
        jax.tree.structure(template) != jax.tree.structure(global_params)
        or jax.tree.leaves(want) != jax.tree.leaves(got)):
      raise ValueError(f"model_template: its shapes {want} differ from the "
                       f"round's global params {got}")

  def update(client_state, global_params, data, client_ids, mask,
             learning_rates, num_steps, round_num, key):
    chex.assert_rank([client_ids, mask], 1)
    check_template(global_params)
    result, inner_state, metrics = inner.update(
        client_state.inner, global_params, data, client_ids, mask,
        learning_rates, num_steps, round_num, key)
    trained = result.client_params
    chex.assert_tree_shape_prefix(trained, client_ids.shape)
    update_of = jax.tree.map(
        lambda w, g: w.astype(jnp.float32) - g.astype(jnp.float32)[None],
        trained, global_params)
    sent = update_of
    residuals = client_state.residuals
    if error_feedback:
      sent = jax.tree.map(
          lambda u, table: u + tree_math.gather_clients(table, client_ids,
                                                        0.0),
          sent, residuals)
    decoded = compress_updates(codec, sent, client_ids, key)
    # Where the decoded update is the client's own (w - g), the server has
    # w: g + (w - g) may round away from it, so the identity codec (and a
    # coordinate sent exactly) changes nothing, bit for bit.
    client_params = jax.tree.map(
        lambda g, x, u, w: jnp.where(
            x == u, w, (g.astype(jnp.float32)[None] + x).astype(w.dtype)),
        global_params, decoded, update_of, trained)
    written = ((mask > 0) & engine.rows_finite(sent)
               & engine.rows_finite(decoded))
    if error_feedback:
      residuals = jax.tree.map(
          lambda table, u, x: tree_math.scatter_clients(
              table, client_ids, written.astype(jnp.float32), u - x),
          residuals, sent, decoded)
    metrics = {**metrics,
               "compression_error": _relative_error(sent, decoded, written)}
    return (result._replace(client_params=client_params),
            CompressionState(inner_state, residuals), metrics)

  personalize = None
  if inner.personalize is not None:
    def personalize(client_state, global_params, client_ids):
      return inner.personalize(client_state.inner, global_params, client_ids)
  return LocalUpdate(init=init, update=update, personalize=personalize)
