"""Models that are part shared, part each client's own.

FedBN keeps the BatchNorm leaves with their client, FedPer and FedRep the
head (the last layers); the rest of the model is the server's. They share
this machinery:

* ``LocalLeaves``: which leaves stay local, by position in
  ``jax.tree.leaves`` order (static: chosen once, from the leaf paths);
* its ``merged``: the cohort's models, the global model with each client's
  own local leaves in place (a client that never trained reads the global
  ones); it is also each client's personal model (``personalize``);
* its ``write``: the trained local leaves of the cohort's real (mask 1)
  clients whose model is finite, scattered to the per-client table;
* ``keep_leaves``: the whole client side of an algorithm that trains the
  merged model as usual and keeps its local leaves (FedBN, FedPer).

The table's row of a client is the tuple of its local leaves; an empty
tuple when no leaf is local (then only ``seen`` is recorded).
"""

import re
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import engine
from fedjax_agg import tree_math
from fedjax_agg.clients import _common
from fedjax_agg.clients import _table
from fedjax_agg.types import LocalUpdate, Params

__all__ = ["LocalLeaves", "check_is_local", "keep_leaves",
           "last_dense_layer", "local_leaves"]


class LocalLeaves(NamedTuple):
  """The leaves of a model that stay with their client.

  Attributes:
    positions: their indices in ``jax.tree.leaves(params)`` order.
    shapes: their ``jax.ShapeDtypeStruct``s, in the same order.
  """
  positions: tuple[int, ...]
  shapes: tuple[Any, ...]

  def init(self, options: _common.ClientOptions, num_clients: int):
    """The table of ``num_clients`` rows of local leaves, none seen."""
    return options.init_table(num_clients, self.shapes)

  def merged(self, table, global_params: Params, client_ids: jax.Array):
    """[K] models: the global leaves with each client's local ones."""
    leaves, treedef = jax.tree.flatten(global_params)
    own = _table.gather(table, client_ids,
                        default=tuple(leaves[i] for i in self.positions))
    count = client_ids.shape[0]
    stacked = [jnp.broadcast_to(leaf, (count,) + leaf.shape)
               for leaf in leaves]
    for j, i in enumerate(self.positions):
      stacked[i] = own[j]
    return jax.tree.unflatten(treedef, stacked)

  def rows(self, client_params) -> tuple:
    """The local leaves of stacked [K, ...] models."""
    leaves = jax.tree.leaves(client_params)
    return tuple(leaves[i] for i in self.positions)

  def write(self, table, client_ids: jax.Array, client_params,
            mask: jax.Array):
    """``table`` with the local leaves of the trained [K] models written
    for the rows with mask 1 whose whole model is finite."""
    # A non-finite model is not written: the client keeps its last finite
    # leaves instead of carrying NaN into every later round it joins.
    write = (mask > 0) & engine.rows_finite(client_params)
    return _table.scatter(table, client_ids, self.rows(client_params), write)


def check_is_local(is_local) -> None:
  """``is_local`` must be a predicate on leaf paths."""
  if not callable(is_local):
    raise TypeError(f"is_local must be a function of a leaf path, got "
                    f"{type(is_local).__name__}")


def local_leaves(shapes: Any, is_local: Callable[[str], bool]
                 ) -> LocalLeaves:
  """The leaves of ``shapes`` (a model's variables or their shapes) whose
  '/'-joined path satisfies ``is_local``; possibly none."""
  check_is_local(is_local)
  flags = jax.tree.leaves(tree_math.select_leaves(shapes, is_local))
  positions = tuple(i for i, flag in enumerate(flags) if flag)
  shape_leaves = jax.tree.leaves(shapes)
  return LocalLeaves(positions, tuple(
      jax.ShapeDtypeStruct(shape_leaves[i].shape, shape_leaves[i].dtype)
      for i in positions))


def head_leaves(shapes: Any, is_local: Optional[Callable[[str], bool]],
                algorithm: str) -> LocalLeaves:
  """``local_leaves`` of ``is_local``, by default the last Dense layer
  (``last_dense_layer``); an error names ``algorithm``."""
  if is_local is None:
    try:
      is_local = last_dense_layer(shapes)
    except ValueError as error:
      raise ValueError(f"{algorithm}: {error}") from None
  return local_leaves(shapes, is_local)


def _natural_key(module: str) -> tuple:
  # "Dense_10" after "Dense_9", "fc10" after "fc2": digit runs compare as
  # numbers. re.split with a group alternates text, digits, text, ..., so
  # the keys of two names compare str with str and int with int.
  return tuple(
      tuple(int(part) if i % 2 else part
            for i, part in enumerate(re.split(r"(\d+)", name)))
      for name in module.split("/"))


def last_dense_layer(shapes: Any) -> Callable[[str], bool]:
  """The default head of FedPer and FedRep: the last Dense layer.

  A Dense layer is a module holding a 2-D leaf named ``kernel`` (flax's
  ``nn.Dense``: kernel [in, out] and bias [out]); "last" is the greatest
  module path when numbers inside names compare as numbers. Flax names
  unnamed modules ``Dense_0``, ``Dense_1``, ... in the order the model
  calls them, and numbered names (``fc1``, ``fc2``, ``fc3``, as in
  ``fedjax_agg.models``) usually follow it, so this is the output layer of
  such networks. Leaf paths alone cannot tell the order of calls in
  general (dicts are flattened by sorted key): a model that names its
  layers otherwise should pass its own ``is_local``.

  Args:
    shapes: the model's variables (or their shapes).

  Returns:
    ``is_local(path)``: True for the leaves of that module (its kernel and
    bias).

  Raises:
    ValueError: the model has no Dense layer.
  """
  paths = tree_math.leaf_paths(shapes)
  # 2-D kernels only: a convolution's kernel is 4-D, so a conv layer is
  # never taken for the head.
  modules = [path.rsplit("/", 1)[0]
             for path, leaf in zip(paths, jax.tree.leaves(shapes),
                                   strict=True)
             if "/" in path and path.rsplit("/", 1)[1] == "kernel"
             and len(leaf.shape) == 2]
  if not modules:
    raise ValueError(
        "no Dense layer to take as the head (no 2-D leaf named 'kernel'); "
        f"pass is_local. Leaf paths: {paths[:8]}")
  head = max(modules, key=_natural_key)
  return lambda path: "/" in path and path.rsplit("/", 1)[0] == head


def keep_leaves(train: Callable[..., engine.LocalResult],
                local: LocalLeaves, options: _common.ClientOptions,
                state: Callable[[Any], Any]) -> LocalUpdate:
  """A client side that trains each client's merged model with ``train``
  (the engine's trainer) and keeps its local leaves.

  Args:
    train: ``engine.make_local_trainer``'s function.
    local: the local leaves (none: plain local training from the global
      model, exactly the engine's).
    options: where the table lives.
    state: the algorithm's state type, a NamedTuple whose only field,
      ``local``, is the table.

  Returns:
    The ``LocalUpdate``; its ``personalize`` gives ``local.merged``.
    Metrics: ``num_local_leaves``.
  """

  def init(num_clients: int):
    return state(local.init(options, num_clients))

  def update(client_state, global_params, data, client_ids, mask,
             learning_rates, num_steps, round_num, key):
    del round_num
    table = client_state.local
    # Without local leaves every client starts from the global model: the
    # engine's own program, not a broadcast copy of it.
    start = (local.merged(table, global_params, client_ids)
             if local.positions else None)
    trained = train(global_params, data, client_ids, learning_rates,
                    num_steps, key, start, None)
    table = local.write(table, client_ids, trained.client_params, mask)
    return trained, state(table), {
        "num_local_leaves": jnp.asarray(len(local.positions), jnp.float32)}

  def personalize(client_state, global_params, client_ids):
    return local.merged(client_state.local, global_params, client_ids)

  return LocalUpdate(init=init, update=update, personalize=personalize)
