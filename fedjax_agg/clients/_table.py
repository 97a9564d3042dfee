"""The per-client state table: one row per client of the federation.

A table is a pytree whose every leaf has a leading [N] axis (N = all
clients, indexed by client id) plus ``seen`` [N] bool, the clients that have
written a row. A round gathers its cohort's rows, the local update computes
new ones, and the rows are scattered back, all inside the jitted round.

* Rows are initialised lazily: a client that has never written reads
  ``default`` (e.g. the current global model's leaves) instead of its row,
  so a table needs no per-client initial values and starts as zeros.
* Padding rows of a cohort (mask 0), and rows the caller marks as not to be
  written (a non-finite result), never write: their scatter index points
  past the table and is dropped, so a padding row that repeats a real
  client's id cannot overwrite that client's new row.

Memory. The table holds N x (row size): SCAFFOLD's control variates and
Ditto's personal models are one model per client (N x the model), FedBN's
local leaves a few hundred floats per client. With several devices
``simulation.run`` splits the table by rows over them (each device holds
N / D clients' rows, ``distributed.shard_rows``; N must be a multiple of
D, else it is replicated); the rest of the server state is replicated.
For a population whose table does not fit in device memory,
``placement="host"`` keeps it in host memory (optionally a file-backed
``numpy.memmap``, whose untouched rows cost no disk) and moves only the
cohort's rows per round.
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg.clients import _host_table

__all__ = ["PLACEMENTS", "Table", "check_placement", "gather", "init_table",
           "scatter"]

PLACEMENTS = ("device", "host")


class Table(NamedTuple):
  """Per-client rows.

  Attributes:
    rows: pytree, every leaf [N, ...].
    seen: [N] bool, True once a client has written its row.
  """
  rows: Any
  seen: jax.Array


def check_placement(placement: str, path: Optional[str]) -> None:
  """``placement`` is one of ``PLACEMENTS``; ``path`` only for "host"."""
  checks.check_choice("placement", placement, PLACEMENTS)
  if path is not None and placement != "host":
    raise ValueError("path is for placement='host' (a file-backed table), "
                     f"got placement={placement!r}")
  if path is not None and not isinstance(path, str):
    raise TypeError(f"path must be a file path string, got {path!r}")


def init_table(num_clients: int, row_shapes: Any, placement: str = "device",
               path: Optional[str] = None):
  """A table of ``num_clients`` zero rows shaped like ``row_shapes`` (a
  pytree of arrays or ``jax.ShapeDtypeStruct``), none seen.

  ``placement`` "device": a ``Table`` in the server state; "host": a
  ``HostRows`` whose rows stay in host memory (``path``: in a file-backed
  memmap), see ``_host_table``.
  """
  check_placement(placement, path)
  if placement == "host":
    return _host_table.host_table(num_clients, row_shapes, path)
  rows = jax.tree.map(
      lambda s: jnp.zeros((num_clients,) + tuple(s.shape), s.dtype),
      row_shapes)
  # Zeros, not initial values: rows are read through ``seen``, so a client
  # that has not written yet reads the caller's default in ``gather``.
  return Table(rows, jnp.zeros((num_clients,), bool))


def gather(table: Table, client_ids: jax.Array, default: Any = None) -> Any:
  """Rows of ``client_ids`` ([K]); clients never seen read ``default`` (a
  pytree shaped like one row, broadcast) when it is given. -> [K, ...]."""
  if isinstance(table, _host_table.HostRows):
    rows, seen = _host_table.host_gather(table, client_ids)
  else:
    rows = jax.tree.map(lambda leaf: leaf[client_ids], table.rows)
    seen = table.seen[client_ids]
  if default is None:
    return rows

  # ``seen`` is traced, so the choice is a jnp.where, not a Python branch;
  # the default row gains a leading axis of 1 to broadcast over the K rows.
  def leaf(stacked, single):
    shape = (-1,) + (1,) * (stacked.ndim - 1)
    return jnp.where(seen.reshape(shape), stacked,
                     jnp.asarray(single, stacked.dtype)[None])
  return jax.tree.map(leaf, rows, default)


def scatter(table: Table, client_ids: jax.Array, rows: Any,
            write: jax.Array) -> Table:
  """Writes ``rows`` [K, ...] for the clients with ``write`` [K] True.

  Rows not written (padding, non-finite) are dropped, never written back
  with an old value, so duplicate ids among them are harmless.
  """
  if isinstance(table, _host_table.HostRows):
    return _host_table.host_scatter(table, client_ids, rows, write)
  num_clients = table.seen.shape[0]
  # Rows not written point one past the last row and mode="drop" discards
  # them, so a padding row that repeats a real client's id cannot overwrite
  # that client's new row, whatever order the scatter applies duplicates in.
  index = jnp.where(write, client_ids, num_clients)
  new_rows = jax.tree.map(
      lambda leaf, new: leaf.at[index].set(new.astype(leaf.dtype),
                                           mode="drop"), table.rows, rows)
  seen = table.seen.at[index].set(True, mode="drop")
  return Table(new_rows, seen)
