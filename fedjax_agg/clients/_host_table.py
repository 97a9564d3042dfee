"""A per-client table kept in host memory (or a file), not on the device.

``init_table`` keeps all N rows on the device: N x (row size) of device
memory (SCAFFOLD or Ditto with a 159,010-parameter model: 0.64 MB per
client, 64 GB for N = 100,000). ``host_table`` keeps them in a numpy array
in host memory, or in a file-backed ``numpy.memmap`` when given a ``path``
(a sparse file: rows never written take no disk), and the jitted round
moves only its cohort's rows: ``gather`` reads K rows and ``scatter``
writes K rows back through ``jax.experimental.io_callback``, so a round's
traffic is 2 K rows whatever N.

The device side of the table is ``HostRows``: a pytree whose only leaf is
a version counter (the number of scatters so far). Each scatter returns
the next version and each gather takes the current one, so round t + 1
reads only after round t has written.

Limits: the rows live outside the server state, so a run with a host
table cannot be checkpointed (``simulation.run`` refuses it) nor vmapped
(sweeps refuse it); one process only.
"""

import os
import threading
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_agg import locks

__all__ = ["HostRows", "HostStore", "host_gather", "host_scatter",
           "host_table", "uses_host_table"]


class HostStore:
  """The rows: one numpy array per leaf, [N, ...], and ``seen`` [N]."""

  def __init__(self, num_clients: int, row_shapes: Any,
               path: Optional[str] = None):
    leaves, self.treedef = jax.tree.flatten(row_shapes)
    self.shapes = [jax.ShapeDtypeStruct(tuple(s.shape), s.dtype)
                   for s in leaves]
    self.num_clients = int(num_clients)
    self.path = path
    self.file_lock = None
    if path is not None:
      self.file_lock = _claim(path)
    self.arrays = []
    offset = 0
    for s in self.shapes:
      shape = (self.num_clients,) + s.shape
      if path is None:
        self.arrays.append(np.zeros(shape, s.dtype))
      else:
        # One sparse file, leaves one after the other.
        # Only the first leaf opens with "w+" (which sizes the file afresh);
        # the later ones must use "r+" at their offset, or "w+" would truncate
        # the leaves already mapped.
        self.arrays.append(np.memmap(path, dtype=s.dtype, shape=shape,
                                     mode="r+" if offset else "w+",
                                     offset=offset))
        offset += int(np.prod(shape)) * np.dtype(s.dtype).itemsize
    self.seen = np.zeros((self.num_clients,), bool)
    # The callbacks may run on runtime threads other than the caller's; the
    # lock keeps a read from seeing a half-done write.
    self.lock = threading.Lock()

  @property
  def nbytes(self) -> int:
    """Bytes the rows take when every client has written."""
    return sum(a.nbytes for a in self.arrays)

  def read(self, client_ids, version):
    # ``version`` is only a data dependency: taking it orders this read
    # after the scatter that produced it (the previous round's write).
    del version
    ids = np.asarray(client_ids)
    with self.lock:
      return (tuple(a[ids] for a in self.arrays), self.seen[ids])

  def write(self, client_ids, rows, write, version):
    # Rows not to be written (padding, non-finite) are filtered here on the
    # host, so their ids, whatever they are, touch no row.
    ids = np.asarray(client_ids)[np.asarray(write)]
    with self.lock:
      for array, new in zip(self.arrays, rows, strict=True):
        array[ids] = np.asarray(new)[np.asarray(write)]
      self.seen[ids] = True
    return np.asarray(version + 1, np.int32)


def _claim(path: str) -> locks.FileLock:
  """Creates ``path`` (refusing an existing file: the table starts empty,
  and the file may be another run's live table or earlier results) and
  locks it for as long as the table is in use."""
  path = os.fspath(path)
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
  except FileExistsError:
    raise ValueError(
        f"path: {path} already exists; a host client table starts empty "
        "and would overwrite it (it may be another run's live table): give "
        "a path that does not exist") from None
  except OSError as error:
    raise ValueError(f"path: cannot create {path}: {error.strerror}"
                     ) from None
  os.close(fd)
  return locks.FileLock(path, f"host client table {path}",
                        record_owner=False).acquire()


@jax.tree_util.register_pytree_node_class
class HostRows:
  """The device side of a host table: ``version`` (an int32 leaf) and the
  store (static)."""

  def __init__(self, version, store: HostStore):
    self.version = version
    self.store = store

  def tree_flatten(self):
    """Pytree flattening: ``version`` is the child, the store the static
    auxiliary data."""
    # The store is static auxiliary data: jit traces only the version
    # scalar, so the N rows never enter a trace or a device transfer.
    return (self.version,), self.store

  @classmethod
  def tree_unflatten(cls, store, children):
    """Pytree unflattening: rebuilds the rows from ``store`` and
    ``children = (version,)``."""
    return cls(children[0], store)

  @property
  def seen(self) -> np.ndarray:
    """[N] bool, the clients that have written (read on the host)."""
    return self.store.seen


def host_table(num_clients: int, row_shapes: Any,
               path: Optional[str] = None) -> HostRows:
  """A table of ``num_clients`` zero rows shaped like ``row_shapes`` in
  host memory (``path``: a file-backed memmap there, a new file: an
  existing one is refused; it is locked while the table is in use)."""
  return HostRows(jnp.zeros((), jnp.int32),
                  HostStore(num_clients, row_shapes, path))


def host_gather(table: HostRows, client_ids: jax.Array) -> tuple[Any,
                                                                 jax.Array]:
  """-> (rows [K, ...], seen [K]) of ``client_ids``."""
  store = table.store
  count = client_ids.shape[0]
  shapes = (tuple(jax.ShapeDtypeStruct((count,) + s.shape, s.dtype)
                  for s in store.shapes),
            jax.ShapeDtypeStruct((count,), bool))
  # The read depends on mutable host state, so it is no pure function of
  # its arguments: io_callback keeps XLA from caching, merging or dropping
  # it.
  leaves, seen = jax.experimental.io_callback(
      store.read, shapes, client_ids, table.version)
  return jax.tree.unflatten(store.treedef, list(leaves)), seen


def host_scatter(table: HostRows, client_ids: jax.Array, rows: Any,
                 write: jax.Array) -> HostRows:
  """Writes the rows with ``write`` True; -> the table's next version."""
  store = table.store
  leaves = tuple(leaf.astype(s.dtype) for leaf, s in zip(
      jax.tree.leaves(rows), store.shapes, strict=True))
  # The returned version is all the round sees of this write; the next
  # gather takes it, which is what orders that read after this write.
  version = jax.experimental.io_callback(
      store.write, jax.ShapeDtypeStruct((), jnp.int32), client_ids, leaves,
      write, table.version)
  return HostRows(version, store)


def uses_host_table(tree: Any) -> bool:
  """Whether ``tree`` holds a ``HostRows``."""
  return any(isinstance(node, HostRows) for node in jax.tree.leaves(
      tree, is_leaf=lambda node: isinstance(node, HostRows)))
