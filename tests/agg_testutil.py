"""Shared inputs for the aggregator tests: tiny trees, cohorts, jitted rules;
faster compilation for large test programs and for test subprocesses with
several host devices."""

import functools
import inspect
import os

import jax
import jax.numpy as jnp
import numpy as np

from tests._fast_compile import as_flags
from tests._fast_compile import FAST_COMPILE

from fedjax_agg import aggregators
from fedjax_agg import testing
from fedjax_agg.types import INFO_AXES
from fedjax_agg.types import Model

NUM_CLIENTS = 7  # N, the federation size used by the tests.
COHORT = 4  # K of the conformance cohorts
EXAMPLES = 12  # hypothesis examples for tests that run jitted rounds

# Two modules (kernel + bias each): 2 layers, 4 leaves.
SHAPES = {"conv": {"kernel": (3, 3, 1, 2), "bias": (2,)},
          "dense": {"kernel": (5, 3), "bias": (3,)}}


def make_params(rng: np.random.Generator, shapes=None):
  """A params tree of float32 leaves with the given shapes."""
  return testing.make_params(rng, SHAPES if shapes is None else shapes)


def make_clients(rng: np.random.Generator, global_params, num: int,
                 scale=0.1, zero_rows=()):
  """[K, ...] client models: global + noise; rows in ``zero_rows`` equal
  the global model (zero update)."""
  def leaf(g):
    noise = rng.normal(size=(num,) + g.shape) * scale
    noise[list(zero_rows)] = 0.0
    return jnp.asarray(np.asarray(g)[None] + noise, jnp.float32)
  return jax.tree.map(leaf, global_params)


def make_info(client_ids, num_examples, mask=None, round_=1, seed=0,
              num_steps=None):
  return testing.make_info(client_ids, num_examples, mask, round_, seed,
                           num_steps)


def spoil_rows(stacked, rows):
  """``stacked`` with the given rows (padding) holding garbage: NaN in
  every other one, 1e30 in the rest (a rule must ignore them)."""
  def spoil(leaf):
    leaf = np.array(leaf)
    for i, row in enumerate(rows):
      leaf[row] = np.nan if i % 2 == 0 else 1e30
    return jnp.asarray(leaf)
  return jax.tree.map(spoil, stacked)


def stack_rows(trees):
  """Stacks plain trees along a new client axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def take_rows(stacked, rows):
  return jax.tree.map(lambda x: x[np.asarray(rows)], stacked)


def np_tree(tree):
  return jax.tree.map(lambda x: np.asarray(x, np.float64), tree)


def assert_trees_close(actual, expected, rtol=1e-5, atol=1e-6):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected),
                  strict=True):
    np.testing.assert_allclose(np.asarray(a, np.float64),
                               np.asarray(e, np.float64), rtol=rtol,
                               atol=atol)


def _apply(params, x, train):
  """A model over the ``SHAPES`` tree: x [B, 5] -> logits [B, 3]."""
  del train
  conv = jnp.sum(params["conv"]["kernel"]) + jnp.sum(params["conv"]["bias"])
  logits = x @ params["dense"]["kernel"] + params["dense"]["bias"]
  return logits + 1e-3 * conv, params


# For rules that evaluate client models on server data (FedACS).
MODEL = Model(init=lambda key: make_params(np.random.default_rng(0)),
              apply=_apply)
_EVAL_RNG = np.random.default_rng(123)
X_EVAL = jnp.asarray(_EVAL_RNG.normal(size=(20, 5)), jnp.float32)
Y_EVAL = jnp.asarray(_EVAL_RNG.integers(0, 3, size=20), jnp.int32)


def build(name: str, **kwargs):
  """``aggregators.get(name, ...)`` with the run context the factory takes:
  N = NUM_CLIENTS, a cohort size of COHORT for rules built for one, and the
  test ``MODEL`` with server data for rules that evaluate models."""
  params = inspect.signature(aggregators.REGISTRY[name]).parameters
  if "num_participants" in params:
    kwargs.setdefault("num_participants", COHORT)
  return aggregators.get(name, num_clients=NUM_CLIENTS, model=MODEL,
                         x_eval=X_EVAL, y_eval=Y_EVAL, **kwargs)


class JittedRule:
  """A registered rule with its ``aggregate`` jitted once; counts traces."""

  def __init__(self, name: str, **kwargs):
    self.aggregator = build(name, **kwargs)
    self.traces = 0

    def traced(global_params, client_params, info, state):
      self.traces += 1
      return self.aggregator.aggregate(global_params, client_params, info,
                                       state)
    self.aggregate = jax.jit(traced)
    self.init = self.aggregator.init


@functools.lru_cache(maxsize=None)
def jitted_rule(name: str, items: tuple = ()) -> JittedRule:
  """Cached ``JittedRule`` (kwargs as a sorted tuple of items)."""
  return JittedRule(name, **dict(items))




def streamed_aggregate(aggregator, global_params, client_params, info,
                       state):
  """A rule's ``StreamingForm`` run on stacked clients: finalize the sum over
  the K rows of ``client_stats`` (what the engine accumulates by chunks)."""
  stream = aggregator.stream
  stats = jax.vmap(stream.client_stats, in_axes=(None, 0, INFO_AXES))(
      global_params, client_params, info)
  summed = jax.tree.map(lambda a: jnp.sum(a, axis=0), stats)
  return stream.finalize(global_params, summed, info, state)


@functools.lru_cache(maxsize=None)
def jitted_aggregate(name: str, items: tuple = ()):
  rule = aggregators.get(name, **dict(items))
  return rule, jax.jit(rule.aggregate)


def run_rule(name: str, global_params, clients, info, state=None,
             **kwargs):
  """One jitted ``aggregate`` of rule ``name`` (built with ``kwargs``,
  cached), from its initial state unless ``state`` is given."""
  rule, aggregate = jitted_aggregate(name, tuple(sorted(kwargs.items())))
  state = rule.init(global_params) if state is None else state
  return aggregate(global_params, clients, info, state)


def flat(tree):
  """One model as a float64 vector (leaves in tree order)."""
  return np.concatenate([np.asarray(x, np.float64).ravel()
                         for x in jax.tree.leaves(tree)])


def flat_rows(stacked):
  """[K, ...] models as [K, P] float64."""
  return np.concatenate([np.asarray(x, np.float64).reshape(x.shape[0], -1)
                         for x in jax.tree.leaves(stacked)], axis=1)


def colluding_cohort(seed: int, num: int, num_bad: int, distance: float):
  """``num`` clients near each other, ``num_bad`` of them (drawn) sending
  the same far point (each other's nearest). -> (global params, clients,
  info with equal counts, the attackers' rows)."""
  rng = np.random.default_rng(seed)
  global_params = make_params(rng)
  clients = make_clients(rng, global_params, num, scale=0.1)
  bad = rng.choice(num, size=num_bad, replace=False)
  clients = jax.tree.map(
      lambda c: c.at[bad].set(jnp.asarray(c[0]) + distance), clients)
  info = make_info(np.arange(num) % NUM_CLIENTS, np.ones(num))
  return global_params, clients, info, bad


# Faster compilation (``_fast_compile.FAST_COMPILE``) for tests whose
# checks do not depend on how well the machine code is optimised: the
# whole session (conftest.py), the subprocesses with several host devices
# (the count is fixed when JAX starts, so tests of sharding start a process
# of their own; they compare two runs compiled alike, sharded and on one
# device), the notebook's kernel, and ``compiled_fast``.


@functools.cache
def fast_compile_options() -> tuple[tuple[str, object], ...]:
  """The ``FAST_COMPILE`` options this XLA knows (a compile option it does
  not know is an error, and XLA aborts on an unknown flag in XLA_FLAGS)."""
  known = []
  for name, value in FAST_COMPILE.items():
    try:
      jax.jit(lambda x: x + 1).lower(1.0).compile(
          compiler_options={name: value})
    except jax.errors.JaxRuntimeError:
      continue
    known.append((name, value))
  return tuple(known)


def compiled_fast(fn, *args):
  """``jax.jit(fn)`` compiled for ``args`` with ``fast_compile_options``."""
  return jax.jit(fn).lower(*args).compile(
      compiler_options=dict(fast_compile_options()))


def fast_compile_flags() -> list[str]:
  """``fast_compile_options`` as XLA_FLAGS (for processes started here)."""
  return as_flags(fast_compile_options())


def device_env(num_devices: int, root: str) -> dict[str, str]:
  """The environment of a test subprocess on ``num_devices`` host CPU
  devices, compiling fast, that imports the package and the tests from
  ``root``."""
  flags = [f"--xla_force_host_platform_device_count={num_devices}",
           *fast_compile_flags()]
  # ``root`` first, the caller's path kept (packages installed beside the
  # interpreter's, e.g. with pip --target, stay importable).
  path = os.pathsep.join(filter(None, [root,
                                       os.environ.get("PYTHONPATH", "")]))
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=path,
              XLA_FLAGS=" ".join(flags))


def dot_generals(jaxpr):
  """Every dot_general equation in ``jaxpr`` and its sub-jaxprs (cond
  branches, loop bodies, custom rules)."""
  found = []

  def walk(value):
    if hasattr(value, "eqns"):  # a Jaxpr
      for eqn in value.eqns:
        if eqn.primitive.name == "dot_general":
          found.append(eqn)
        for param in eqn.params.values():
          walk(param)
    elif hasattr(value, "jaxpr"):  # a ClosedJaxpr
      walk(value.jaxpr)
    elif isinstance(value, (tuple, list)):
      for item in value:
        walk(item)

  walk(jaxpr)
  return found


def dot_precisions(jaxpr):
  """The ``precision`` of every dot_general in ``jaxpr`` (``dot_generals``)."""
  return [eqn.params["precision"] for eqn in dot_generals(jaxpr)]
