"""How the engine cuts a cohort of K clients into chunks: W clients a
step, vmapped, chunks one after the other, the client axis split over
the devices of a mesh (``engine.make_local_trainer``'s layout).
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp


class _Layout(NamedTuple):
  """How a cohort of K rows is cut into chunks of ``width`` rows."""
  num_clients: int  # K
  width: int  # W, rows per chunk (a multiple of ``devices``)
  num_chunks: int
  devices: int  # D, devices of the client axis (1 without a mesh)

  @property
  def pad(self) -> int:
    return self.num_chunks * self.width - self.num_clients

  def to_chunks(self, tree):
    """[K, ...] -> [chunks, W, ...], padded with zeros (client id 0, 0
    steps, mask 0).

    Device-major: device d trains the contiguous block of rows
    [d*K'/D, (d+1)*K'/D) (K' = padded K), a slice of width W/D of every
    chunk, so that the [K', ...] outputs come back split by blocks, with no
    resharding copy of the client params.
    """
    def leaf(a):
      a = jnp.pad(a, [(0, self.pad)] + [(0, 0)] * (a.ndim - 1))
      shape = a.shape[1:]
      return a.reshape((self.devices, self.num_chunks,
                        self.width // self.devices) + shape).swapaxes(
                            0, 1).reshape((self.num_chunks, self.width)
                                          + shape)
    return jax.tree.map(leaf, tree)

  def from_chunks(self, tree):
    """[chunks, W, ...] -> [K, ...] (the inverse of ``to_chunks``)."""
    def leaf(a):
      shape = a.shape[2:]
      a = a.reshape((self.num_chunks, self.devices,
                     self.width // self.devices) + shape).swapaxes(0, 1)
      return a.reshape((self.num_chunks * self.width,) + shape)[
          :self.num_clients]
    return jax.tree.map(leaf, tree)


def _layout(num_clients: int, clients_per_step: int, mesh,
            client_axis: str) -> _Layout:
  # Balanced chunks (K=10, W=8: two chunks of 5, not 8 + 8 with 6 padding
  # rows that would cost as much as real clients); with a mesh the width is
  # rounded up to a multiple of the devices so that it splits evenly.
  width = -(-num_clients // -(-num_clients // clients_per_step))
  devices = 1 if mesh is None else mesh.shape[client_axis]
  width = -(-width // devices) * devices
  return _Layout(num_clients, width, -(-num_clients // width), devices)
