"""Conformance checks for aggregation rules, for users' own rules too.

``check_aggregator(aggregator)`` runs the properties every rule of this
library is held to and raises ``AssertionError`` naming the first broken
one:

* it runs under ``jax.jit`` and a second round with new values reuses the
  first round's compilation (no retracing);
* the new global model has the input's tree, shapes and dtypes; the state
  keeps its tree, shapes and dtypes from round to round;
* the output, state and metrics are finite (the metrics arrays), also over
  two rounds in which every update is zero;
* padding rows (mask 0) change nothing, whatever they hold (huge values,
  NaN, Inf, huge example counts);
* permuting the clients changes nothing (``symmetric=True``);
* the streaming form, where the rule has one, equals the stacked rule over
  two rounds (padding rows included).

``stacked_params``, ``client_info`` and ``cohorts`` are hypothesis
strategies for property tests of rules (hypothesis is in the ``test``
extra). The library's own conformance suite calls this kit for every
registered rule.

Example::

  from fedjax_agg import testing
  testing.check_aggregator(my_rule(), num_clients=100)
"""

import functools
from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg.types import Aggregator, ClientInfo, INFO_AXES, Params

__all__ = ["DEFAULT_SHAPES", "check_aggregator", "client_info", "cohorts",
           "make_info", "make_params", "stacked_params"]

DEFAULT_SHAPES = {"conv": {"kernel": (3, 3, 1, 2), "bias": (2,)},
                  "dense": {"kernel": (5, 3), "bias": (3,)}}
"""The default params shapes of the test helpers: two layers, a conv and a dense
one, each a kernel and a bias."""


def make_params(rng: np.random.Generator, shapes=None) -> Params:
  """A params tree of float32 leaves of ``shapes`` (default: two layers)."""
  shapes = DEFAULT_SHAPES if shapes is None else shapes
  return jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s), jnp.float32),
                      shapes, is_leaf=lambda x: isinstance(x, tuple))


def make_info(client_ids, num_examples, mask=None, round_num=1,
              seed=0, num_steps=None) -> ClientInfo:
  """A ``ClientInfo`` for the given [K] ids and counts (mask 1 default);
  ``num_steps`` [K] local steps (default: 4 for each real client, 0 for
  padding rows, as a round with equal local work fills it in)."""
  client_ids = np.asarray(client_ids, np.int32)
  num = client_ids.shape[0]
  mask = np.ones(num) if mask is None else np.asarray(mask)
  if num_steps is None:
    num_steps = np.where(mask > 0, 4, 0)
  return ClientInfo(
      client_ids=jnp.asarray(client_ids),
      num_examples=jnp.asarray(num_examples, jnp.float32),
      mask=jnp.asarray(mask, jnp.float32),
      loss_before=jnp.ones((num,), jnp.float32),
      loss_after=jnp.full((num,), 0.5, jnp.float32),
      round=jnp.asarray(round_num, jnp.int32), key=jax.random.key(seed),
      num_steps=jnp.asarray(num_steps, jnp.int32))


def _clients(rng, global_params, num, scale=0.1, zero_rows=()):
  def leaf(g):
    noise = rng.normal(size=(num,) + g.shape) * scale
    noise[list(zero_rows)] = 0.0
    return jnp.asarray(np.asarray(g)[None] + noise, jnp.float32)
  return jax.tree.map(leaf, global_params)


def _rows(stacked, rows):
  return jax.tree.map(lambda x: x[np.asarray(rows)], stacked)


def _fail(prop: str, error: Exception):
  raise AssertionError(f"aggregator breaks '{prop}': {error}") from error


def _close(prop, actual, expected, rtol=1e-5, atol=1e-6):
  try:
    chex.assert_trees_all_equal_structs(actual, expected)
    chex.assert_trees_all_close(actual, expected, rtol=rtol, atol=atol)
  except AssertionError as e:
    _fail(prop, e)


def _finite(prop, tree):
  leaves = [leaf for leaf in jax.tree.leaves(tree)
            if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)]
  try:
    chex.assert_tree_all_finite(leaves)
  except AssertionError as e:
    _fail(prop, e)


def _avals(tree):
  return jax.tree.map(jax.typeof, tree)


def check_aggregator(aggregator: Aggregator,
                     global_params: Optional[Params] = None, *,
                     num_clients: int = 7, cohort_size: int = 4,
                     symmetric: bool = True, padding: str = "anywhere",
                     seed: int = 0,
                     rtol: float = 2e-5, atol: float = 2e-6) -> None:
  """Raises AssertionError naming the first property ``aggregator`` breaks.

  Args:
    aggregator: the rule (``types.Aggregator``).
    global_params: the model tree to test on (default: two small layers).
    num_clients: N the rule was built for (client ids are drawn below it).
    cohort_size: K real clients per round (at most ``num_clients``).
    symmetric: also check that permuting the clients changes nothing.
    padding: where the padding rows of the check go: "anywhere" (front
      and middle) or "end" (after the real clients, as the engine pads;
      for rules that read cohort positions, such as FedDRL's agent).
    seed: seeds the random cohorts.
    rtol, atol: tolerance of the comparisons.
  """
  if not isinstance(aggregator, Aggregator):
    raise TypeError(f"aggregator must be an Aggregator, got "
                    f"{type(aggregator).__name__}")
  if not 1 <= cohort_size <= num_clients:
    raise ValueError(f"cohort_size must be in [1, num_clients="
                     f"{num_clients}], got {cohort_size}")
  rng = np.random.default_rng(seed)
  if global_params is None:
    global_params = make_params(rng)
  k = cohort_size
  ids = rng.choice(num_clients, size=k, replace=False)
  counts = rng.integers(1, 50, size=k).astype(np.float32)
  # One client sends a zero update: rules that normalise by an update's norm
  # must cope with a zero norm (angles, cosines) without a NaN.
  clients = _clients(rng, global_params, k, zero_rows=(0,))
  info = make_info(ids, counts)
  traces = []

  def traced(*args):
    # A Python side effect runs only while tracing, so this counts compilations,
    # not calls.
    traces.append(1)
    return aggregator.aggregate(*args)

  aggregate = jax.jit(traced)
  close = functools.partial(_close, rtol=rtol, atol=atol)

  def two_rounds(params, stacked, round_info):
    state = aggregator.init(params)
    out1, state1, metrics = aggregate(params, stacked, round_info, state)
    out2, state2, _ = aggregate(out1, stacked, round_info._replace(
        round=round_info.round + 1), state1)
    return state, (out1, state1, metrics), (out2, state2)

  def models_and_states(params, stacked, round_info):
    """Both rounds' outputs and states (per-client metrics follow rows)."""
    _, (out1, state1, _), (out2, state2) = two_rounds(params, stacked,
                                                      round_info)
    return out1, state1, out2, state2

  # jit, shapes, fixed state, finiteness, no retracing; then the same two
  # rounds when every update is zero.
  zero = _clients(rng, global_params, k, zero_rows=range(k))
  for cohort, what in ((clients, ""), (zero, " for zero updates")):
    try:
      state0, (out1, state1, metrics), (out2, state2) = two_rounds(
          global_params, cohort, info)
    except Exception as e:  # pylint: disable=broad-except
      _fail("runs under jax.jit", e)
    if len(traces) != 1:
      _fail("second round reuses the compilation",
            AssertionError(f"traced {len(traces)} times for two rounds"))
    for out in (out1, out2):
      if _avals(out) != _avals(global_params):
        _fail("output has the input's tree, shapes and dtypes" + what,
              AssertionError(f"{_avals(out)} != {_avals(global_params)}"))
    if not _avals(state0) == _avals(state1) == _avals(state2):
      _fail("state keeps its tree, shapes and dtypes" + what,
            AssertionError(f"{_avals(state0)} -> {_avals(state1)}"))
    not_arrays = sorted(name for name, value in metrics.items()
                        if not isinstance(value, jax.Array))
    if not_arrays:
      _fail("metrics are arrays", AssertionError(f"not arrays: {not_arrays}"))
    _finite("finite output, state and metrics" + what,
            (out1, out2, state1, state2, metrics))

  # Padding rows: garbage anywhere in the cohort changes nothing.
  reference = models_and_states(global_params, clients, info)
  # NaN and 1e30 catch a rule that masks by multiplying: 0 * NaN is NaN, and
  # 1e30 times a count of 1e9 overflows float32, so only a select (jnp.where)
  # on the mask passes.
  garbage = jax.tree.map(
      lambda leaf: leaf.at[0].set(1e30).at[1].set(jnp.nan),
      _clients(rng, global_params, 2, scale=1e3))
  if padding not in ("anywhere", "end"):
    raise ValueError(f"padding must be 'anywhere' or 'end', got {padding!r}")
  # Padding at the front and in the middle, not only at the end: a rule that
  # slices off the last rows instead of reading the mask fails here.
  order = ([k] + list(range(k // 2)) + [k + 1] + list(range(k // 2, k))
           if padding == "anywhere" else list(range(k + 2)))
  padded = _rows(jax.tree.map(lambda a, b: jnp.concatenate([a, b]),
                              clients, garbage), order)
  padded_info = make_info(
      # Padding rows repeat valid ids, as the rounds pad (``ClientInfo``), so a
      # rule that gathers per-client state by id stays in range.
      np.concatenate([ids, ids[:2] if k > 1 else [ids[0]] * 2])[order],
      np.concatenate([counts, [1e9, 1e9]])[order],
      mask=np.concatenate([np.ones(k), np.zeros(2)])[order])
  close("padded clients (mask 0) do not matter", models_and_states(
      global_params, padded, padded_info), reference)

  if symmetric and k > 1:
    perm = rng.permutation(k)
    close("permuting the clients changes nothing", models_and_states(
        global_params, _rows(clients, perm),
        make_info(ids[perm], counts[perm])), reference)

  if aggregator.stream is not None:
    stream = aggregator.stream

    @jax.jit
    def streamed(params, stacked, round_info, state):
      # What the engine does a chunk at a time: one client's statistics per row,
      # summed over the rows.
      stats = jax.vmap(stream.client_stats, in_axes=(None, 0, INFO_AXES))(
          params, stacked, round_info)
      summed = jax.tree.map(lambda a: jnp.sum(a, axis=0), stats)
      return stream.finalize(params, summed, round_info, state)

    # Two rounds, each from the stacked rule's model and state.
    params, state = global_params, aggregator.init(global_params)
    for offset in (0, 1):
      round_info = padded_info._replace(round=padded_info.round + offset)
      expected = aggregate(params, padded, round_info, state)
      got = streamed(params, padded, round_info, state)
      close("streaming form equals the stacked form", got[:2], expected[:2])
      params, state = expected[:2]


def _hypothesis():
  try:
    from hypothesis import strategies  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # pragma: no cover
    raise ImportError("fedjax_agg.testing's strategies need hypothesis "
                      "(pip install 'fedjax_agg[test]')") from e
  return strategies


def stacked_params(num_clients: int, shapes=None, *, scale: float = 1.0
                   ) -> Any:
  """Strategy: a [num_clients, ...] stacked params tree of float32."""
  st = _hypothesis()
  shapes = DEFAULT_SHAPES if shapes is None else shapes
  # A seed is drawn and numpy makes the arrays: hypothesis then shrinks one
  # integer rather than thousands of floats.
  return st.integers(0, 2**32 - 1).map(
      lambda seed: _clients(np.random.default_rng(seed),
                            make_params(np.random.default_rng(seed), shapes),
                            num_clients, scale=scale))


def client_info(num_clients: int, population: int = 50) -> Any:
  """Strategy: a ``ClientInfo`` of ``num_clients`` rows (distinct ids below
  ``population``, counts in [1, 1000], masks with at least one 1)."""
  st = _hypothesis()

  def build(args):
    ids, counts, mask, round_num = args
    mask = list(mask)
    # A cohort with no real client is not a round any rule is held to.
    if not any(mask):
      mask[0] = 1
    return make_info(ids, counts, mask, round_num)

  return st.tuples(
      st.lists(st.integers(0, population - 1), min_size=num_clients,
               max_size=num_clients, unique=True),
      st.lists(st.integers(1, 1000), min_size=num_clients,
               max_size=num_clients),
      st.lists(st.integers(0, 1), min_size=num_clients,
               max_size=num_clients),
      st.integers(1, 100)).map(build)


def cohorts(num_clients: int, shapes=None) -> Any:
  """Strategy: (global params, stacked client params, ClientInfo)."""
  st = _hypothesis()
  shapes = DEFAULT_SHAPES if shapes is None else shapes

  def build(args):
    seed, info = args
    rng = np.random.default_rng(seed)
    params = make_params(rng, shapes)
    return params, _clients(rng, params, num_clients), info

  return st.tuples(st.integers(0, 2**32 - 1), client_info(num_clients)).map(
      build)
