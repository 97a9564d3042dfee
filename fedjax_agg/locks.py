"""Exclusive locks on the files and folders a run writes.

Two runs that write one checkpoint folder (or one host client table) would
overwrite each other's steps without an error. ``FileLock`` makes the
second writer fail at once instead: it holds an advisory ``flock`` on a
lock file for the run's life and writes its owner (host, process id and
the time it was taken) into it, so the error names who holds it. The
operating system releases the lock when the owning process ends, killed
or not, so a crashed run never leaves a stale lock behind (the lock file
itself stays, naming its last owner; it is harmless).

Limits: ``flock`` is advisory and local to one machine's kernel; on some
network file systems it does not exclude writers on other machines.
"""

import datetime
import fcntl
import os
import socket
from typing import Optional

__all__ = ["FileLock", "LockedError", "LOCK_NAME"]

LOCK_NAME = ".fedjax_agg.lock"
"""The name of the lock file inside a locked folder."""


class LockedError(RuntimeError):
  """Another live process holds the lock."""


def _owner() -> str:
  now = datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds")
  return f"host {socket.gethostname()}, pid {os.getpid()}, since {now}"


class FileLock:
  """An exclusive lock on ``path`` (a lock file, created if absent).

  Args:
    path: the lock file.
    what: what the lock guards, for the error (e.g. "checkpoint folder
      runs/a/checkpoint").
    record_owner: write the owner into the file (False where the locked
      file holds data of its own).

  Raises (on ``acquire``):
    LockedError: another process holds it; the message names the owner.
  """

  def __init__(self, path: str, what: str, record_owner: bool = True):
    self.path = os.fspath(path)
    self.what = what
    self.record_owner = record_owner
    self._fd: Optional[int] = None

  @classmethod
  def for_folder(cls, folder: str, what: str) -> "FileLock":
    """The lock of a folder: ``<folder>/.fedjax_agg.lock``."""
    return cls(os.path.join(folder, LOCK_NAME), what)

  @property
  def held(self) -> bool:
    return self._fd is not None

  def acquire(self) -> "FileLock":
    """Takes the lock without waiting and returns self (a no-op when held).

    Raises:
      LockedError: another process holds it (the message names its owner
        when ``record_owner``).
    """
    if self._fd is not None:
      return self
    # Opened without truncation: the holder's owner line must still be there to
    # be read by a process that fails to take the lock.
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      # LOCK_NB: fail at once; a second run waiting silently on the first would
      # look hung for as long as the first one runs.
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      try:
        owner = (os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
                 if self.record_owner else "")
      finally:
        os.close(fd)
      raise LockedError(
          f"{self.what} is in use by another run ({owner or 'owner unknown'}"
          f"; lock file {self.path}); wait for it to end, or use another "
          "folder") from None
    if self.record_owner:
      # Truncate first: a shorter owner line must not keep the tail of the
      # previous one. Skipped when the file is the data itself (a client table).
      os.ftruncate(fd, 0)
      os.pwrite(fd, _owner().encode() + b"\n", 0)
    self._fd = fd
    return self

  def release(self) -> None:
    """Releases the lock and closes the lock file (a no-op when not
    held)."""
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    try:
      # The fd is closed even if unlocking fails; closing it releases the lock
      # anyway.
      fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
      os.close(fd)

  def __enter__(self) -> "FileLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()
