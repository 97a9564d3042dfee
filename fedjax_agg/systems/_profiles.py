"""Client system profiles: compute speed and link bandwidths per client.

A ``ClientProfiles`` holds, per client id, the examples it processes per
second in local training and its uplink / downlink bandwidth in bytes per
second. A client's task in a round (or an asynchronous job) takes

  ``task_time = examples / speed + down_bytes / downlink + up_bytes / uplink``

seconds: it downloads the model, trains on ``examples`` examples (local
steps x batch size) and uploads its update, one after the other.

Defaults of ``lognormal_profiles``. They are illustrative, not measured:
a phone-sized order of magnitude (100 examples/s of a small model, 1 MB/s
up, 5 MB/s down, i.e. 8 and 40 Mbit/s, of the order of the median mobile
links that public speed-test reports give) with sigma 1.0, which spreads the
middle 90% of the clients over a factor e^(2 x 1.645) ~ 27 on each axis.
Calibrate them to a deployment, or read measured profiles with
``read_profiles``.
"""

from typing import NamedTuple

import numpy as np

from fedjax_agg import checks
from fedjax_agg.registry import Registry
from fedjax_agg.systems import _common

__all__ = ["ClientProfiles", "PROFILES", "PROFILE_COLUMNS",
    "check_profiles", "constant_profiles", "lognormal_profiles",
    "read_profiles", "task_time"]

PROFILE_COLUMNS = ("client_id", "speed", "uplink", "downlink")
"""The header of a client profiles CSV file (``read_profiles``): client id,
speed (examples per second), uplink and downlink (bytes per second)."""


class ClientProfiles(NamedTuple):
  """Per-client system characteristics, indexed by client id.

  Attributes:
    speed: [N] float64, examples per second of local training.
    uplink: [N] float64, bytes per second client -> server.
    downlink: [N] float64, bytes per second server -> client.
  """
  speed: np.ndarray
  uplink: np.ndarray
  downlink: np.ndarray

  @property
  def num_clients(self) -> int:
    return int(np.shape(self.speed)[0])


def check_profiles(profiles: ClientProfiles) -> None:
  """Raises unless every field is a [N] vector of finite numbers > 0."""
  if not isinstance(profiles, ClientProfiles):
    raise TypeError(f"profiles must be a ClientProfiles, got "
                    f"{type(profiles).__name__}")
  shapes = [np.shape(field) for field in profiles]
  if len(set(shapes)) != 1 or len(shapes[0]) != 1 or shapes[0][0] < 1:
    raise ValueError(f"profiles' speed, uplink and downlink must be [N] "
                     f"vectors of one length N >= 1, got shapes "
                     f"{shapes}")
  for name, field in zip(profiles._fields, profiles, strict=True):
    _common.per_client(f"profiles.{name}", field, np.shape(field)[0],
                       positive=True)


def _lognormal(seed_sequence, num_clients, median, sigma):
  rng = np.random.default_rng(seed_sequence)
  return median * np.exp(sigma * rng.standard_normal(num_clients))


def lognormal_profiles(num_clients: int, seed: int, *,
                       speed_median: float = 100.0,
                       speed_sigma: float = 1.0,
                       uplink_median: float = 1e6,
                       uplink_sigma: float = 1.0,
                       downlink_median: float = 5e6,
                       downlink_sigma: float = 1.0) -> ClientProfiles:
  """Independent log-normal speed, uplink and downlink per client.

  Each quantity is ``median * exp(sigma * z)``, z ~ N(0, 1), drawn from its
  own stream of ``np.random.SeedSequence(seed)`` (changing one sigma leaves
  the other two quantities as they were). sigma = 0 gives every client the
  median. See the module docstring for where the defaults come from.

  Args:
    num_clients: N >= 1.
    seed: int >= 0.
    speed_median, speed_sigma: examples per second (median > 0, sigma >= 0).
    uplink_median, uplink_sigma: bytes per second client -> server.
    downlink_median, downlink_sigma: bytes per second server -> client.

  Returns:
    The [N] profiles.
  """
  _common.check_num_clients(num_clients)
  _common.check_seed(seed)
  medians = (speed_median, uplink_median, downlink_median)
  sigmas = (speed_sigma, uplink_sigma, downlink_sigma)
  for name, median, sigma in zip(("speed", "uplink", "downlink"), medians,
                                 sigmas, strict=True):
    checks.check_range(f"{name}_median", median, 0, low_open=True)
    checks.check_range(f"{name}_sigma", sigma, 0)
  streams = np.random.SeedSequence(seed).spawn(3)
  return ClientProfiles(*(
      _lognormal(stream, num_clients, median, sigma)
      for stream, median, sigma in zip(streams, medians, sigmas,
                                       strict=True)))


def constant_profiles(num_clients: int, speed: float = 100.0,
                      uplink: float = 1e6,
                      downlink: float = 5e6) -> ClientProfiles:
  """Every client with the same speed, uplink and downlink (all > 0)."""
  _common.check_num_clients(num_clients)
  for name, value in (("speed", speed), ("uplink", uplink),
                      ("downlink", downlink)):
    checks.check_range(name, value, 0, low_open=True)
  return ClientProfiles(*(np.full((num_clients,), float(value))
                          for value in (speed, uplink, downlink)))


def read_profiles(path, num_clients: int) -> ClientProfiles:
  """Profiles from a CSV file with header ``client_id,speed,uplink,downlink``.

  Every client id 0..N-1 appears on exactly one row (any order); speed is
  in examples per second, uplink and downlink in bytes per second, all
  finite and > 0.

  Raises:
    ValueError: naming the file, the line and the column: wrong header,
      non-integer id, non-numeric, non-finite or <= 0 value, unknown id
      (outside 0..N-1), duplicated id (both lines), missing ids (the first
      few listed).
  """
  _common.check_num_clients(num_clients)
  where = str(path)
  table = _common.read_table(path, PROFILE_COLUMNS)
  bad = table.values <= 0
  if bad.any():
    row, column = np.argwhere(bad)[0]
    raise ValueError(f"{where}, line {table.lines[row]}, column "
                     f"{PROFILE_COLUMNS[column + 1]}: expected a number > 0, "
                     f"got {table.values[row, column]}")
  _common.check_table_ids(where, table, "client_id", num_clients)
  # Sorted by id, a repeated id is adjacent to its first row; the stable sort
  # keeps that first row first, so the error names both lines in file order.
  order = np.argsort(table.ids, kind="stable")
  ids = table.ids[order]
  repeated = np.flatnonzero(ids[1:] == ids[:-1])
  if repeated.size:
    first, second = order[repeated[0]], order[repeated[0] + 1]
    raise ValueError(f"{where}, line {table.lines[second]}, column client_id:"
                     f" duplicate client id {table.ids[second]} (first on "
                     f"line {table.lines[first]})")
  # Every id is in range and none repeats: fewer rows than N means missing ids.
  if ids.size != num_clients:
    missing = np.setdiff1d(np.arange(num_clients), ids)
    shown = ", ".join(str(i) for i in missing[:10])
    raise ValueError(f"{where}: {missing.size} client id(s) of 0.."
                     f"{num_clients - 1} have no row, e.g. {shown}")
  values = table.values[order]
  return ClientProfiles(*(np.ascontiguousarray(values[:, column])
                          for column in range(3)))


def task_time(profiles: ClientProfiles, client_ids, examples, down_bytes,
              up_bytes) -> np.ndarray:
  """Seconds each client needs to download, train and upload.

  ``examples / speed + down_bytes / downlink + up_bytes / uplink``.

  Args:
    profiles: the population's profiles.
    client_ids: [K] client ids.
    examples: examples each client processes (local steps x batch size),
      a scalar or [K], finite and >= 0.
    down_bytes: bytes each client downloads (the model), scalar or [K].
    up_bytes: bytes each client uploads (its update), scalar or [K].

  Returns:
    [K] float64 seconds.
  """
  num_clients = np.shape(profiles.speed)[0]
  ids = _common.as_client_ids("client_ids", client_ids, num_clients)
  size = ids.shape[0]
  examples = _common.per_client("examples", examples, size, positive=False)
  down_bytes = _common.per_client("down_bytes", down_bytes, size,
                                  positive=False)
  up_bytes = _common.per_client("up_bytes", up_bytes, size, positive=False)
  return (examples / profiles.speed[ids] + down_bytes / profiles.downlink[ids]
          + up_bytes / profiles.uplink[ids])


PROFILES = Registry("client profiles", {
    "lognormal": lognormal_profiles,
    "constant": constant_profiles,
}, context=("num_clients", "seed"), declared_as="profiles")
"""Client profile models by name: name -> factory of ``ClientProfiles``
(``num_clients`` and ``seed`` passed to the factories that take them)."""
