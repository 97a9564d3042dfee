"""Devices, meshes and data placement for sharded and multi-host rounds.

The client axis of a round is sharded over a 1-D ``jax.sharding.Mesh`` whose
axis is named ``"clients"`` (``CLIENT_AXIS``): each device trains its slice
of every chunk of clients (``engine.make_local_trainer`` with ``mesh``), the
global params and the pooled data are replicated on every device, and the
aggregator, jitted in the same round, reduces the stacked client params,
which arrive sharded over the axis, with the collectives XLA inserts.

Selecting devices is one argument, ``devices`` (see ``client_mesh``):

* ``None``: every device of the job, ``jax.devices()``. In a single process
  these are the local devices; after ``jax.distributed.initialize()`` (one
  process per host) they are the devices of all hosts.
* an int ``D``: the first ``D`` devices (with several processes, the first
  ``D / P`` devices of each of the ``P`` processes).
* a sequence of devices, or a ready ``Mesh`` with a ``"clients"`` axis.

Multi-host. Every process runs the same program on the same inputs: it
loads the same pooled arrays and draws the same cohorts from the same seed.
``replicate`` turns such process-local values into global arrays (each
process supplies its own copy, ``jax.make_array_from_process_local_data``);
``local_copy`` and ``to_numpy`` bring global results back to one process
for evaluation and logging.

CPU. XLA presents a multi-core CPU as ONE device whose ops use the cores
through intra-op threads, which small per-client ops (batch 16) use
poorly. ``use_cpu_devices(n)`` (CLI ``--cpu-devices n``) splits it into
``n`` host devices before JAX starts, so that ``devices=None`` shards the
clients over them: one FedAvg round of 100 clients of the 1.66 M-parameter
CNN took 30.1 s on 2 host devices against 59.6 s on one on a 2-core CPU
(``experiments/bench/README.md``).
"""

import os
import warnings
from typing import Any, Optional, Sequence, Union

import jax
import numpy as np

__all__ = ["CLIENT_AXIS", "Devices", "available_cores", "by_client",
    "ACCELERATOR_MAX_WIDTH", "check_execution", "choose_clients_per_step",
    "client_mesh", "compile_together", "default_clients_per_step",
    "free_device_memory",
    "local_copy", "prefer_cpu_devices", "replicate", "round_mesh",
    "shard_map_unchecked",
    "shard_rows", "to_numpy", "use_all_cores", "use_cpu_devices"]

CLIENT_AXIS = "clients"
"""The default name of the mesh axis that carries a round's clients."""

Devices = Union[None, int, Sequence[jax.Device], jax.sharding.Mesh]
"""The devices a round runs on: None (all devices of the job), an int count (the
first ones), a sequence of ``jax.Device`` or a ``jax.sharding.Mesh`` with a
client axis (see ``client_mesh``)."""


_HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def use_cpu_devices(count: int) -> None:
  """Splits the host CPU into ``count`` XLA devices (one per core is best).

  Must run before JAX starts its CPU backend (the first device query or
  computation of the process): it sets the host device count in the
  ``XLA_FLAGS`` environment variable. Raises ValueError for a bad ``count``
  and RuntimeError when the backend had already started with another
  number of CPU devices (the flag cannot apply then).
  """
  if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or (
      count < 1):
    raise ValueError(f"count must be a positive int, got {count!r}")
  before = os.environ.get("XLA_FLAGS")
  flags = [f for f in (before or "").split()
           if not f.startswith(_HOST_DEVICES_FLAG + "=")]
  flags.append(f"{_HOST_DEVICES_FLAG}={int(count)}")
  os.environ["XLA_FLAGS"] = " ".join(flags)
  # This query starts the CPU backend if nothing had: with the flag just set, it
  # then has ``count`` devices; a different number means it ran already.
  started = len(jax.devices("cpu"))
  if started != count:
    # The flag did not apply: leave the environment as it was, so that
    # subprocesses started later get the devices this process has.
    if before is None:
      del os.environ["XLA_FLAGS"]
    else:
      os.environ["XLA_FLAGS"] = before
    raise RuntimeError(
        f"use_cpu_devices({count}): JAX's CPU backend had already started "
        f"with {started} device(s); call it (or set XLA_FLAGS="
        f"{_HOST_DEVICES_FLAG}={count}) before any JAX computation")


def available_cores() -> int:
  """CPU cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def use_all_cores() -> int:
  """One XLA CPU device per available core (the fast layout on CPU).

  Call it first thing in a script or notebook (before any JAX
  computation); called later, it warns and keeps the devices JAX started
  with. An explicit ``XLA_FLAGS=--xla_force_host_platform_device_
  count=...`` in the environment wins. Harmless where an accelerator is
  the default backend (rounds then run on it). Returns the CPU device
  count.
  """
  return prefer_cpu_devices(available_cores(), "use_all_cores")


def prefer_cpu_devices(count: int, caller: str = "prefer_cpu_devices") -> int:
  """``use_cpu_devices(count)`` where it can still apply: an explicit
  ``XLA_FLAGS=--xla_force_host_platform_device_count=...`` wins, and when
  JAX already runs it warns (naming ``caller``) and keeps its devices.
  Returns the CPU device count."""
  if _HOST_DEVICES_FLAG in os.environ.get("XLA_FLAGS", ""):
    return len(jax.devices("cpu"))
  try:
    use_cpu_devices(count)
  except RuntimeError as error:
    # Too late in this process (JAX already runs): keep its devices, say so.
    warnings.warn(f"{caller}: {error}", stacklevel=3)
    return len(jax.devices("cpu"))
  return count


def _global_devices(count: Optional[int]) -> list:
  """The first ``count`` devices (all when None), the same number from
  each process when there are several."""
  devices = jax.devices()
  if count is None:
    return devices
  processes = jax.process_count()
  if count < 1 or count > len(devices) or count % processes:
    raise ValueError(
        f"devices must be an int in [1, {len(devices)}]"
        + (f" and a multiple of the {processes} processes" if processes > 1
           else "") + f", got {count}")
  # Every process gives the same number of devices, so each holds an equal slice
  # of the client axis; processes and devices are taken in index order, so every
  # process builds the same mesh.
  per_process = count // processes
  by_process = {}
  for device in devices:
    by_process.setdefault(device.process_index, []).append(device)
  return [device for index in sorted(by_process)
          for device in by_process[index][:per_process]]


def client_mesh(devices: Devices = None,
                axis_name: str = CLIENT_AXIS) -> jax.sharding.Mesh:
  """The 1-D mesh whose ``axis_name`` axis carries the clients of a round.

  Args:
    devices: None (all devices of the job, ``jax.devices()``: the local
      ones in a single process, every host's after
      ``jax.distributed.initialize()``), an int count (the first ones; with
      several processes the same number from each), a non-empty sequence
      of ``jax.Device``, or a ``Mesh`` (returned as is; it must have an
      ``axis_name`` axis).
    axis_name: name of the client axis.

  Returns:
    The mesh (possibly of a single device).
  """
  if isinstance(devices, jax.sharding.Mesh):
    if axis_name not in devices.shape:
      raise ValueError(f"devices: the mesh has axes {dict(devices.shape)}, "
                       f"expected one named {axis_name!r}")
    return devices
  if devices is None or isinstance(devices, (int, np.integer)):
    if isinstance(devices, bool):
      raise TypeError("devices must be None, an int, a sequence of devices "
                      f"or a Mesh, got {devices!r}")
    chosen = _global_devices(None if devices is None else int(devices))
  else:
    try:
      chosen = list(devices)
    except TypeError:
      raise TypeError("devices must be None, an int, a sequence of devices "
                      f"or a Mesh, got {devices!r}") from None
    if not chosen or not all(isinstance(d, jax.Device) for d in chosen):
      raise TypeError("devices must be a non-empty sequence of jax.Device, "
                      f"got {devices!r}")
    if len(set(chosen)) != len(chosen):
      raise ValueError(f"devices lists a device twice: {chosen}")
  return jax.sharding.Mesh(np.array(chosen), (axis_name,))


def round_mesh(devices: Devices = None, axis_name: str = CLIENT_AXIS
               ) -> tuple[Optional[jax.sharding.Mesh], jax.Device]:
  """``(mesh, device)`` for a round: the mesh of ``devices``, or None when
  it holds a single device (the plain, unsharded path), and that device
  (otherwise the mesh's first device that belongs to this process, where
  evaluation runs)."""
  mesh = client_mesh(devices, axis_name)
  local = [d for d in mesh.devices.flat
           if d.process_index == jax.process_index()]
  if not local:
    raise ValueError(f"devices: none of {mesh.devices.tolist()} belongs to "
                     f"process {jax.process_index()}")
  # A one-device mesh is no mesh: the engine then skips shard_map and runs the
  # plain, unsharded program.
  return (mesh if mesh.size > 1 else None), local[0]


def _is_key(leaf) -> bool:
  return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(
      leaf.dtype, jax.dtypes.prng_key)


def replicate(tree: Any, mesh: jax.sharding.Mesh) -> Any:
  """Every leaf of ``tree`` replicated on every device of ``mesh``.

  The leaves (numpy or jax arrays, PRNG key arrays included) must hold the
  same value in every process; with several processes each supplies its
  own copy (``jax.make_array_from_process_local_data``), nothing is sent
  between hosts.
  """
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def put(leaf):
    # Typed key arrays are placed through their raw key data, then wrapped again
    # with the same implementation.
    if _is_key(leaf):
      return jax.random.wrap_key_data(put(jax.random.key_data(leaf)),
                                      impl=jax.random.key_impl(leaf))
    if isinstance(leaf, jax.Array) and leaf.sharding.is_equivalent_to(
        sharding, leaf.ndim):
      return leaf
    # An array that already spans several processes is not process-local data:
    # it can only be resharded.
    if jax.process_count() == 1 or (isinstance(leaf, jax.Array)
                                    and not leaf.is_fully_addressable):
      return jax.device_put(leaf, sharding)  # a reshard of a global array
    return jax.make_array_from_process_local_data(sharding, np.asarray(leaf))

  return jax.tree.map(put, tree)


def shard_rows(tree: Any, mesh: jax.sharding.Mesh, num_rows: int) -> Any:
  """``tree`` with every leaf of leading dimension ``num_rows`` split by
  rows over the devices of ``mesh`` (a per-client table: each device holds
  N / D clients' rows), the other leaves replicated.

  Rows are split only where ``num_rows`` is a multiple of the device count
  and in a single process; otherwise the leaves are replicated.
  """
  if num_rows % mesh.size or jax.process_count() > 1:
    return replicate(tree, mesh)
  by_row = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec(mesh.axis_names))

  def put(leaf):
    if (isinstance(leaf, (jax.Array, np.ndarray)) and not _is_key(leaf)
        and leaf.ndim >= 1 and leaf.shape[0] == num_rows):
      if isinstance(leaf, jax.Array) and leaf.sharding.is_equivalent_to(
          by_row, leaf.ndim):
        return leaf
      return jax.device_put(leaf, by_row)
    return replicate(leaf, mesh)
  return jax.tree.map(put, tree)


def to_numpy(tree: Any) -> Any:
  """Every array leaf of ``tree`` as a numpy array holding its global value
  (gathered from the other processes where this one lacks shards)."""
  def fetch(leaf):
    if not isinstance(leaf, jax.Array):
      return leaf
    if _is_key(leaf):
      raise TypeError("to_numpy: PRNG key arrays have no numpy value; use "
                      "jax.random.key_data first")
    if leaf.is_fully_addressable or leaf.is_fully_replicated:
      return np.asarray(leaf)
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
  return jax.tree.map(fetch, tree)


def local_copy(tree: Any, device: Optional[jax.Device] = None) -> Any:
  """``tree`` with every leaf spread over several devices brought to one
  device of this process (``device``, else the first local one).

  Used to evaluate a replicated global model on one device instead of
  redundantly on all of them. Replicated leaves cost a device-local copy at
  most; sharded ones are gathered. Single-device leaves are kept.
  """
  device = device or jax.local_devices()[0]

  def bring(leaf):
    if not isinstance(leaf, jax.Array) or len(leaf.sharding.device_set) == 1:
      return leaf
    if _is_key(leaf):
      return jax.random.wrap_key_data(bring(jax.random.key_data(leaf)),
                                      impl=jax.random.key_impl(leaf))
    # A replicated leaf already holds the whole value on each device: take the
    # copy on ``device`` where there is one, rather than a transfer.
    if leaf.is_fully_replicated:
      for shard in leaf.addressable_shards:
        if shard.device == device:
          return shard.data
      return jax.device_put(leaf.addressable_shards[0].data, device)
    return jax.device_put(to_numpy(leaf), device)

  return jax.tree.map(bring, tree)


def compile_together(jitted, *args) -> None:
  """With several processes: compiles ``jitted`` for ``args`` now, then
  waits for every process to get there.

  Hosts compile at different speeds, and the CPU collectives (gloo) give up
  on a peer that is 30 s late; started together, the first call of
  ``jitted`` (which reuses this compilation) meets no such wait. A no-op in
  a single process.
  """
  if jax.process_count() == 1:
    return
  jitted.lower(*args).compile()
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  multihost_utils.sync_global_devices("fedjax_agg.compile_together")


ACCELERATOR_MAX_WIDTH = 128
"""The most clients a GPU/TPU device trains side by side by default (the
widths measured fastest on an H200 lie between 100 and 128; 250 was
slower)."""
# The share of a device's free memory one chunk's training may take,
# counting each client's copies of the weights (params, gradients, new
# params, optimizer state and the aggregation's copy) as float32.
_MEMORY_SHARE = 0.25
_COPIES_PER_CLIENT = 6


def choose_clients_per_step(backend: str, devices: int,
                            num_params: Optional[int] = None,
                            free_bytes: Optional[int] = None) -> int:
  """The vmap width for ``backend`` (a pure function of what it is given).

  CPU: one client per device per chunk (at least 2). Measured on a 2-core
  CPU (5x5 conv CNN, batch 16): wider chunks were no faster per client,
  and with K=10 a width of 8 padded 10 clients to 16.

  GPU/TPU: as many clients side by side as fit, up to
  ``ACCELERATOR_MAX_WIDTH`` per device. Measured on one H200 with the
  1.66 M-parameter CNN (``experiments/bench/README.md``): width 8
  trained 166 k samples/s, 32 209 k, 100 223 k and 250 183 k (N = 1,000).
  Memory: ``_COPIES_PER_CLIENT`` float32 copies of the weights per client
  must fit in ``_MEMORY_SHARE`` of ``free_bytes`` (the device's free
  memory; None: not known, no memory bound); activations are small next
  to them at the batch sizes of FL.

  Args:
    backend: ``jax.default_backend()``.
    devices: devices the client axis is split over; the width is a
      multiple of it.
    num_params: the model's parameter count (None: not known: 8 a device).
    free_bytes: free memory of one device (None: not known).
  """
  if backend == "cpu":
    return max(2, devices)
  if num_params is None:
    return 8 * devices
  per_device = ACCELERATOR_MAX_WIDTH
  if free_bytes is not None:
    # 4 bytes per float32 entry.
    per_client = 4 * _COPIES_PER_CLIENT * max(int(num_params), 1)
    per_device = min(per_device, int(_MEMORY_SHARE * free_bytes)
                     // per_client)
  return max(1, per_device) * devices


def free_device_memory(device: Optional[jax.Device] = None) -> Optional[int]:
  """Bytes free on ``device`` (default: the first), None where the backend
  does not say (the CPU)."""
  device = jax.devices()[0] if device is None else device
  try:
    stats = device.memory_stats()
  except Exception:  # pylint: disable=broad-except
    return None
  if not stats or "bytes_limit" not in stats:
    return None
  return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def default_clients_per_step(mesh: Optional[jax.sharding.Mesh] = None,
                             client_axis: str = "clients",
                             num_params=None) -> int:
  """The vmap width the engine uses when ``clients_per_step`` is None (see
  ``engine.make_local_trainer``; also ``default_clients_per_step``):
  ``choose_clients_per_step`` for this backend, its devices and memory
  (``num_params``: the model's size, or a callable giving it, asked only
  on an accelerator).
  """
  devices = 1 if mesh is None else mesh.shape[client_axis]
  backend = jax.default_backend()
  if backend == "cpu":
    # On CPU the width does not depend on the model, so ``num_params`` (possibly
    # a costly callable) is not evaluated.
    return choose_clients_per_step(backend, devices)
  if callable(num_params):
    num_params = num_params()
  free = free_device_memory(None if mesh is None else mesh.devices.flat[0])
  return choose_clients_per_step(backend, devices, num_params, free)


def check_execution(clients_per_step, chunk_loop, mesh, client_axis,
                    num_params=None) -> int:
  """Validates the engine's execution options; returns the resolved vmap
  width (``num_params``: a callable giving the model's size, for the
  default)."""
  if clients_per_step is None:
    clients_per_step = default_clients_per_step(mesh, client_axis,
                                                num_params)
  if (isinstance(clients_per_step, bool)
      or not isinstance(clients_per_step, (int, np.integer))
      or clients_per_step < 1):
    raise ValueError(f"clients_per_step must be a positive int, got "
                     f"{clients_per_step!r}")
  if chunk_loop not in ("map", "unroll"):
    raise ValueError(
        f"chunk_loop must be 'map' or 'unroll', got {chunk_loop!r}")
  if mesh is not None:
    if client_axis not in mesh.shape:
      raise ValueError(f"client_axis {client_axis!r} is not an axis of mesh "
                       f"{dict(mesh.shape)}")
    if clients_per_step % mesh.shape[client_axis]:
      raise ValueError(
          f"clients_per_step={clients_per_step} must be a multiple of the "
          f"{mesh.shape[client_axis]} devices of mesh axis {client_axis!r}")
  return int(clients_per_step)


def by_client(client_axis: str) -> jax.sharding.PartitionSpec:
  """[chunks, W, ...] arrays split over the devices along W."""
  return jax.sharding.PartitionSpec(None, client_axis)


def shard_map_unchecked(fn, *, mesh, in_specs, out_specs):
  """``jax.shard_map`` without replication checks, on old and new jax."""
  if hasattr(jax, "shard_map"):
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs,
                         out_specs=out_specs, check_vma=False)
  from jax.experimental.shard_map import shard_map  # jax < 0.7
  return shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                   check_rep=False)
