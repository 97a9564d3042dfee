"""The client axis shards over devices and hosts.

Host CPU devices are fixed when jax starts, so each check runs in
subprocesses: one with 8 host devices (every registered aggregator, whole
rounds through ``simulation.run``, and the streaming round over a mesh),
and two processes of 4 devices each joined by
``jax.distributed.initialize`` on localhost (multi-host). The
subprocesses compile fast (``agg_testutil.device_env``): each check compares
runs compiled alike.
"""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

from tests import agg_testutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Shared by both scripts: runs of every rule sharded vs on one device.
COMMON = textwrap.dedent("""
    import inspect
    import jax, jax.numpy as jnp, numpy as np
    from fedjax_agg import aggregators, distributed, simulation
    from fedjax_agg import rounds as rounds_lib
    from fedjax_agg.config import Execution, LocalTraining
    from fedjax_agg.types import Aggregator
    from tests.test_engine import tiny_data, tiny_model

    SIZES = (7, 13, 4, 10, 1, 5, 9, 3, 6, 8)
    data, x, y, _ = tiny_data(sizes=SIZES)
    model = tiny_model()

    def build(name, cohort):
      kwargs = {}
      if "num_participants" in inspect.signature(
          aggregators.REGISTRY[name]).parameters:
        kwargs["num_participants"] = cohort
      if name == "feddrl":  # a small replay buffer: it is replicated
        kwargs["buffer_capacity"] = 256
      # FedACS evaluates the client models on server data.
      return aggregators.get(name, num_clients=data.num_clients, model=model,
                             x_eval=x[:20], y_eval=y[:20], **kwargs)

    # The rules on LoRA adapters need a LoRA model (tests/lora).
    ALL_RULES = ("fedavg",) + tuple(sorted(
        set(aggregators.REGISTRY) - {"fedavg"}
        - set(aggregators.ADAPTER_RULES)))

    def side_by_side(names, cohort):
      # The rules ``names`` on the same client params; the broadcast model
      # is the first rule's, each rule's own output is kept in the state.
      rules = {name: build(name, cohort) for name in names}

      def init(params):
        return {name: (params, rule.init(params))
                for name, rule in rules.items()}

      def aggregate(global_params, client_params, info, state):
        new_state, metrics = {}, {}
        for name, rule in rules.items():
          params, rule_state, rule_metrics = rule.aggregate(
              global_params, client_params, info, state[name][1])
          new_state[name] = (params, rule_state)
          metrics.update({f"{name}/{k}": v for k, v in rule_metrics.items()})
        return new_state[names[0]][0], new_state, metrics

      return Aggregator(init, aggregate)

    def run(name, devices, rounds=2, participation=0.8):
      cohort = rounds_lib.num_sampled(data.num_clients, participation)
      several = isinstance(name, tuple)
      rule = side_by_side(name, cohort) if several else build(name, cohort)
      return simulation.run(
          model, data, (x, y), rule, num_rounds=rounds,
          participation=participation,
          training=LocalTraining(batch_size=3, learning_rate=0.2,
                                 compute_losses=several),
          execution=Execution(progress=False, devices=devices), seed=3)

    def host(tree):
      tree = jax.tree.map(lambda a: jax.random.key_data(a) if jnp.issubdtype(
          a.dtype, jax.dtypes.prng_key) else a, tree)
      return distributed.to_numpy(tree)

    def assert_same_run(sharded, plain, name):
      a, b = host(sharded.state), host(plain.state)
      assert jax.tree.structure(a) == jax.tree.structure(b), name
      for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(u, v, rtol=2e-5, atol=2e-6, err_msg=name)
      strip = lambda row: {k: v for k, v in row.items() if k != "time_s"}
      for u, v in zip(sharded.history.rows, plain.history.rows, strict=True):
        u, v = strip(u), strip(v)
        assert u.keys() == v.keys(), name
        np.testing.assert_allclose(list(u.values()), list(v.values()),
                                   rtol=2e-5, atol=2e-6, err_msg=name)
      for u, v in zip(sharded.history.client_rows, plain.history.client_rows,
                      strict=True):
        assert u.keys() == v.keys(), name
        for key in u:
          np.testing.assert_allclose(u[key], v[key], rtol=2e-5, atol=2e-6,
                                     err_msg=f"{name} {key}")
""")

EIGHT_DEVICES = COMMON + textwrap.dedent("""
    from jax.sharding import Mesh
    from fedjax_agg import engine
    assert jax.device_count() == 8, jax.devices()

    # Local training alone: sharded == unsharded, outputs split by device.
    ids = jnp.array([3, 0, 4, 1, 2, 7, 6, 5])
    steps = engine.full_steps(data, ids, 3, 2)
    params = model.init(jax.random.key(1))
    args = (params, data, ids, jnp.full(8, 0.1), steps, jax.random.key(2))
    mesh = distributed.client_mesh()
    assert mesh.axis_names == ("clients",) and mesh.size == 8
    sharded = engine.make_local_trainer(
        model, LocalTraining(batch_size=3, epochs=2), clients_per_step=8,
        mesh=mesh)(
            *args)
    plain = engine.make_local_trainer(
        model, LocalTraining(batch_size=3, epochs=2), clients_per_step=8)(
            *args)
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    leaf = jax.tree.leaves(sharded.client_params)[0]
    assert len(leaf.sharding.device_set) == 8, leaf.sharding
    assert leaf.addressable_shards[0].data.shape[0] == 1

    # Every registered rule: two whole rounds (training + aggregation) over
    # 8 devices equal the same rounds on one device. The rules run side by
    # side in one round (one compilation per device count instead of one
    # per rule), each on the same sharded client params.
    sharded = run(ALL_RULES, devices=None)
    assert sharded.history.config["num_devices"] == 8
    leaf = jax.tree.leaves(sharded.state.params)[0]
    assert len(leaf.sharding.device_set) == 8, leaf.sharding
    assert leaf.sharding.is_fully_replicated, leaf.sharding
    plain = run(ALL_RULES, devices=1)
    assert plain.history.config["num_devices"] == 1
    assert_same_run(sharded, plain, "all rules")
    assert set(plain.state.aggregator_state) == set(ALL_RULES)
    # Every rule moved its model (the comparison is not vacuous).
    init = model.init(jax.random.split(jax.random.key(3))[0])
    for name, (rule_params, _) in plain.state.aggregator_state.items():
      moved = max(np.abs(np.asarray(a) - np.asarray(b)).max() for a, b in zip(
          jax.tree.leaves(rule_params), jax.tree.leaves(init)))
      assert moved > 1e-4, name

    # A rule that streams (each device sums its clients' models on the fly).
    assert build("fedadam", 8).stream is not None
    assert_same_run(run("fedadam", devices=None), run("fedadam", devices=1),
                    "fedadam, streamed")

    # The streaming round itself over a mesh: W = 8 clients a step, a
    # cohort of 11 (two chunks, five padding rows, two masked clients),
    # equals the stacked round on one device over two rounds.
    from tests import agg_testutil as tu
    from tests.test_rounds import DATA, MODEL, PARAMS, _cohort, _key_data
    rule = aggregators.fednnnn()
    state = rounds_lib.init_state(PARAMS, rule, seed=3)
    cohort, mask = _cohort(11)
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

    # A cohort that does not divide over the devices (K = 5 on 4), and a
    # device list that does not start at device 0.
    odd = run("fedavg", devices=jax.devices()[4:], rounds=1,
              participation=0.5)
    assert odd.history.config["num_devices"] == 4
    assert_same_run(odd, run("fedavg", devices=[jax.devices()[5]], rounds=1,
                             participation=0.5), "odd cohort")

    # The devices argument.
    assert distributed.client_mesh(4).devices.tolist() == jax.devices()[:4]
    assert distributed.client_mesh(mesh) is mesh
    assert distributed.round_mesh(1) == (None, jax.devices()[0])
    for bad, error in ((0, ValueError), (9, ValueError), ("gpu", TypeError),
                       ([], TypeError), (Mesh(np.array(jax.devices()), ("x",)),
                                          ValueError)):
      try:
        distributed.client_mesh(bad)
      except error as e:
        assert "devices" in str(e), e
      else:
        raise AssertionError(f"expected {error.__name__} for {bad!r}")
    try:
      simulation.run(model, data, (x, y), aggregators.fedavg(), num_rounds=1,
                     execution=Execution(clients_per_step=4, progress=False))
    except ValueError as e:
      assert "clients_per_step" in str(e)
    else:
      raise AssertionError("expected a ValueError for clients_per_step=4")
    print("OK")
""")

# Run by two processes of 4 host devices each; argv: process id, port.
TWO_PROCESSES = textwrap.dedent("""
    import sys
    import jax
    jax.distributed.initialize(coordinator_address=f"localhost:{sys.argv[2]}",
                               num_processes=2, process_id=int(sys.argv[1]))
""") + COMMON + textwrap.dedent("""
    assert jax.process_count() == 2 and jax.device_count() == 8
    assert jax.local_device_count() == 4
    assert distributed.client_mesh().size == 8  # the devices of both hosts
    assert len(distributed.client_mesh(4).local_devices) == 2
    rules = ("fedavg", "fedmedian", "fedadp", "fedadam")
    sharded = run(rules, devices=None)
    assert sharded.history.config["num_devices"] == 8
    # The reference: the same run on one local device of this process.
    plain = run(rules, devices=[jax.local_devices()[0]])
    assert_same_run(sharded, plain, "rules")
    print("OK", jax.process_index())
""")


def _env(devices):
  return agg_testutil.device_env(devices, ROOT)


def test_rounds_of_every_aggregator_shard_over_eight_devices():
  proc = subprocess.run([sys.executable, "-c", EIGHT_DEVICES], cwd=ROOT,
                        env=_env(8), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().endswith("OK")


def _free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("localhost", 0))
    return sock.getsockname()[1]


def test_two_processes_on_localhost_equal_one_device():
  port = str(_free_port())
  procs = [subprocess.Popen([sys.executable, "-c", TWO_PROCESSES, str(i),
                             port], cwd=ROOT, env=_env(4),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for i in range(2)]
  outputs = []
  try:
    for proc in procs:
      outputs.append(proc.communicate(timeout=300))
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.communicate()
  for i, (proc, (out, err)) in enumerate(zip(procs, outputs, strict=True)):
    assert proc.returncode == 0, f"process {i}:\n{err[-3000:]}"
    assert out.strip().endswith(f"OK {i}"), out


def test_use_cpu_devices_before_and_after_jax_starts(monkeypatch):
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = ROOT
  script = textwrap.dedent("""
      from fedjax_agg import distributed
      distributed.use_cpu_devices(3)
      import jax
      print(jax.device_count(), len(distributed.client_mesh().devices))
      """)
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["3", "3"]
  # In this process JAX has started: the flag cannot apply, so it refuses.
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_agg import distributed  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
  started = len(jax.devices("cpu"))
  for before in ("--xla_cpu_enable_fast_math=false", None):
    if before is None:
      monkeypatch.delenv("XLA_FLAGS")
    else:
      monkeypatch.setenv("XLA_FLAGS", before)
    with pytest.raises(RuntimeError, match="already started"):
      distributed.use_cpu_devices(started + 1)
    # Refused, it leaves the environment as it was: subprocesses started
    # later must not inherit a device count this process does not have.
    assert os.environ.get("XLA_FLAGS") == before
  for bad in (0, -2, 1.5, True):
    with pytest.raises(ValueError, match="count"):
      distributed.use_cpu_devices(bad)


TABLE_SHARDED = textwrap.dedent("""
    import jax, numpy as np
    from fedjax_agg import clients, distributed, simulation, validation
    from fedjax_agg.config import Execution, LocalTraining
    from tests.clients._util import linear_model, small_data

    data, x, y, _ = small_data(sizes=(9, 12, 8, 11, 10, 7, 9, 12))
    train, held = validation.holdout_split(data, 0.3, seed=0)
    data = train.with_validation(held)
    model = linear_model()
    training = LocalTraining(epochs=1, batch_size=4, learning_rate=0.2)
    runs = []
    for devices in (4, 1):
      mesh = distributed.client_mesh(4) if devices == 4 else None
      update = clients.scaffold(
          model, training, clients_per_step=4 if devices == 4 else 2,
          mesh=mesh)
      runs.append(simulation.run(
          model, data, (x, y), clients.scaffold_aggregator(1.0),
          num_rounds=3, participation=0.5, training=training,
          execution=Execution(devices=devices, progress=False,
                              clients_per_step=4 if devices == 4 else 2),
          local_update=update, seed=2).state)
    table = runs[0].client_state.controls.rows
    for leaf in jax.tree.leaves(table):
      assert len(leaf.sharding.device_set) == 4, leaf.sharding
      assert not leaf.sharding.is_fully_replicated, leaf.sharding
    for a, b in zip(jax.tree.leaves((runs[0].params, runs[0].client_state)),
                    jax.tree.leaves((runs[1].params, runs[1].client_state)),
                    strict=True):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5,
                                 atol=1e-6)
    print("OK")
""")


def test_client_table_is_split_by_rows_over_four_devices():
  proc = subprocess.run([sys.executable, "-c", TABLE_SHARDED], cwd=ROOT,
                        env=_env(4), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().endswith("OK")
