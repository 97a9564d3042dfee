"""Streaming aggregation: rounds whose memory does not grow with the cohort.

A rule with a ``StreamingForm`` is aggregated from running sums of per-client
statistics (``engine.make_local_reducer``); the round must equal the stacked
one (``engine.make_local_trainer`` + ``aggregate``) and its compiled temp
memory must not grow with K.
"""

import functools
import os
import subprocess
import sys
import textwrap

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import engine
from fedjax_agg import models
from fedjax_agg import tree_math
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg import rounds as rounds_lib

from tests import agg_testutil as tu
from tests.test_engine import tiny_data

# The rules that are a single-pass sum over clients, and only those.
STREAMING = {"fedavg", "fednnnn", "norm_norm", "momentum", "fedopt",
             "fedavgm", "fedadam", "fedyogi", "fedadagrad", "norm_bounding",
             "dp_fedavg", "dp_ftrl", "fednova", "feddyn"}
SIZES = (7, 13, 4, 10, 1, 5, 9, 3, 6, 2, 11, 8, 4, 12, 3, 5)  # 16 clients
BATCH, EPOCHS, WIDTH = 3, 1, 3


# Wide enough that a model outweighs a client's scalars (memory test).
MODEL = models.get("mlp2", num_classes=3, input_shape=(5,), hidden=64)
DATA = tiny_data(sizes=SIZES)[0]
PARAMS = MODEL.init(jax.random.key(1))


def _rule(name: str):
  if name == "fedadam_over_fednnnn":
    return aggregators.fedadam(
        base=aggregators.fednnnn(weighting="uniform", granularity="leaf"))
  return tu.build(name)


def _cohort(size: int):
  """[K] ids (repeating the 16 clients) and a mask with padding rows."""
  cohort = jnp.arange(size, dtype=jnp.int32) % DATA.num_clients
  mask = jnp.ones((size,), jnp.float32).at[jnp.array([1, size - 3])].set(0.0)
  return cohort, mask


@functools.lru_cache(maxsize=None)
def _compiled_round(name: str, size: int, stream: bool):
  """The round of rule ``name`` for a cohort of ``size``, compiled."""
  rule = _rule(name)
  round_fn = rounds_lib.make_round_fn(MODEL, rule,
      training=LocalTraining(batch_size=BATCH, epochs=EPOCHS,
                             learning_rate=0.3),
      execution=Execution(clients_per_step=WIDTH, stream=stream))
  state = rounds_lib.init_state(PARAMS, rule, seed=3)
  return round_fn.lower(state, DATA, *_cohort(size)).compile(), state


def _key_data(tree):
  """PRNG keys as their integer data (comparable arrays)."""
  return jax.tree.map(
      lambda a: jax.random.key_data(a)
      if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else a, tree)


def _two_rounds(name: str, size: int, stream: bool):
  compiled, state = _compiled_round(name, size, stream)
  outputs = []
  for _ in range(2):
    state, out = compiled(state, DATA, *_cohort(size))
    outputs.append(out)
  return _key_data((state, outputs))


def test_rules_with_a_streaming_form():
  assert STREAMING <= set(aggregators.REGISTRY)
  for name in aggregators.REGISTRY:
    assert (tu.build(name).stream is not None) == (name in STREAMING), name


# K = 16 with W = 3: six chunks of 3, the last with two padding rows, plus
# two mask-0 rows of the caller's cohort.
# FedNova reads each client's steps taken (unequal here: the sizes differ).
@pytest.mark.parametrize("name", ["fedavg", "fedadam_over_fednnnn",
                                  "fednova"])
def test_streaming_round_equals_stacked_round(name):
  stacked = _two_rounds(name, 16, stream=False)
  streamed = _two_rounds(name, 16, stream=True)
  tu.assert_trees_close(streamed, stacked, rtol=2e-5, atol=2e-6)
  # Training happened: the model moved.
  moved = jax.tree.map(lambda a, b: np.abs(a - b).max(),
                       stacked[0].params, PARAMS)
  assert max(jax.tree.leaves(moved)) > 1e-3


def test_streaming_temp_memory_does_not_grow_with_the_cohort():
  model_bytes = sum(a.nbytes for a in jax.tree.leaves(PARAMS))
  temp = {(size, stream): _compiled_round("fedavg", size, stream)[0]
          .memory_analysis().temp_size_in_bytes
          for size in (16, 256) for stream in (False, True)}
  added = 256 - 16
  # Stacked: K client models (and more) live at once.
  assert temp[256, False] - temp[16, False] >= added * model_bytes
  # Streaming: only per-client scalars grow with K (ids, steps, losses),
  # far less than one model per client.
  assert temp[256, True] - temp[16, True] <= 0.05 * added * model_bytes
  assert temp[256, True] < temp[16, False]


def test_auto_stream_and_forced_modes():
  with pytest.raises(ValueError, match="stream"):
    rounds_lib.make_round_fn(MODEL, tu.build("fedmedian"),
        training=LocalTraining(batch_size=BATCH, epochs=EPOCHS),
        execution=Execution(stream=True))
  # Rules without a streaming form run stacked by default (no error).
  rounds_lib.make_round_fn(MODEL, tu.build("fedmedian"),
      training=LocalTraining(batch_size=BATCH, epochs=EPOCHS))


def test_reducer_sums_the_trainer_clients_with_unrolled_chunks():
  # An independent numpy sum over the stacked client models of the trainer.
  ids = jnp.array([4, 0, 9, 2, 15], jnp.int32)
  mask = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0])
  steps = engine.full_steps(DATA, ids, BATCH, 2)
  lrs = jnp.linspace(0.1, 0.3, 5)
  key = jax.random.key(5)
  info = tu.make_info(ids, DATA.num_examples[ids], mask)

  def client_stats(global_params, client_params, info_k):
    delta = tree_math.tree_sub(client_params, global_params)
    return (jax.tree.map(lambda d: info_k.mask * d, delta),
            info_k.mask * info_k.loss_after, info_k.mask)

  training = LocalTraining(batch_size=BATCH, epochs=2)
  options = dict(clients_per_step=2, chunk_loop="unroll")
  sums = engine.make_local_reducer(MODEL, client_stats, training,
                                   **options)(
      PARAMS, DATA, ids, lrs, steps, key, info)
  local = engine.make_local_trainer(MODEL, training, **options)(
      PARAMS, DATA, ids, lrs, steps, key)
  real = np.asarray(mask) > 0
  expected = (
      jax.tree.map(lambda c, g: (np.asarray(c)[real] - np.asarray(g)).sum(0),
                   local.client_params, PARAMS),
      np.asarray(local.loss_after)[real].sum(), real.sum())
  tu.assert_trees_close(sums.stats, expected, rtol=1e-5, atol=1e-6)
  # LocalSums' last field (finite) has no LocalResult counterpart.
  tu.assert_trees_close(sums[1:5], local[1:])


@hypothesis.given(
    raw=st.lists(st.sampled_from([0.0, 0.5, 3.0, 7.0]), min_size=1,
                 max_size=6),
    mask_bits=st.integers(0, 63), uniform=st.booleans())
@hypothesis.settings(max_examples=tu.EXAMPLES)
def test_masked_sums_give_the_normalized_weighted_mean(raw, mask_bits,
                                                       uniform):
  num = len(raw)
  mask = np.array([(mask_bits >> k) & 1 for k in range(num)], np.float32)
  values = np.random.default_rng(num).normal(size=(num, 3)).astype(
      np.float32)
  values[mask == 0] = np.nan  # padding rows never leak in
  raw_weights = np.ones(num, np.float32) if uniform else np.asarray(
      raw, np.float32)

  @jax.jit
  def streamed(values, raw_weights, mask):
    terms = jax.vmap(tree_math.client_sums)(
        values, mask, None if uniform else raw_weights)
    return tree_math.mean_from_sums(tree_math.sum_over_clients(terms))

  got = np.asarray(streamed(values, raw_weights, mask))
  # numpy reference of normalize_weights' rule, fallbacks included.
  real = mask > 0
  total = raw_weights[real].sum()
  if total > 0:
    weights = np.where(real, raw_weights, 0.0) / total
  else:
    weights = mask / max(mask.sum(), 1.0)
  expected = (weights[:, None] * np.where(real[:, None], values, 0.0)).sum(0)
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


MESH_SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh
    from fedjax_agg import aggregators
    from fedjax_agg import rounds as rounds_lib
    from fedjax_agg.config import Execution, LocalTraining
    from tests import agg_testutil as tu
    from tests.test_streaming import DATA, MODEL, PARAMS, _cohort, _key_data
    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("clients",))
    rule = aggregators.fednnnn()
    state = rounds_lib.init_state(PARAMS, rule, seed=3)
    cohort, mask = _cohort(11)  # W = 8: two chunks, five padding rows
    results = []
    for stream, m in ((True, mesh), (False, None)):
      round_fn = rounds_lib.make_round_fn(
          MODEL, rule, LocalTraining(batch_size=3, learning_rate=0.3),
          execution=Execution(clients_per_step=8, stream=stream), mesh=m)
      s, outputs = state, []
      for _ in range(2):
        s, out = round_fn(s, DATA, cohort, mask)
        outputs.append(out)
      results.append((s, outputs))
    tu.assert_trees_close(*_key_data(results), rtol=2e-5, atol=2e-6)
    print("OK")
""")


def test_streaming_round_on_eight_devices_equals_one_device_stacked():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  proc = subprocess.run([sys.executable, "-c", MESH_SCRIPT], cwd=root,
                        env=tu.device_env(8, root), capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().endswith("OK")
