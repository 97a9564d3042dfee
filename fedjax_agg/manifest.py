"""What a run wrote, so that the library deletes only its own files.

Every run folder holds a manifest, ``.fedjax_agg-manifest.json``: the
relative path, size and SHA-256 of each file the library wrote there, the
sub-folders it created and the folders it keeps across runs (checkpoints).
It is rewritten (atomically) after each file the run writes, so a run that
dies keeps an exact list.

The rule: **the library deletes only files it wrote and recorded.**

* A fresh run (no ``overwrite``) into a folder that holds a recorded run
  is refused, and so is one into a folder holding files the run would
  write that no manifest lists (a user's own ``config.json``); a folder of
  unrelated files is written beside, never cleared.
* ``overwrite`` removes exactly the manifest's files that are unchanged
  (same size and hash), then the sub-folders it created if they are left
  empty. It refuses, naming them and removing nothing, when a listed file
  was changed or replaced (by a folder or a link), when the manifest names
  a path outside the folder or cannot be read, or when the folder holds
  files the manifest does not list -- unless the user names those in
  ``keep`` (they then stay where they are). A folder without a manifest is
  never cleared.
* ``resume`` keeps everything and goes on recording.

Usage: ``check`` (read-only, before the run's first file) says what an
``overwrite`` would remove or refuses; ``recording(folder, ...)`` claims
the folder for the block: it removes what ``check`` planned (verifying
each file again just before) and records every file the library writes
under it in the meantime (``note``, called by ``jsonio.write_text`` and
the library's figure writers).
"""

import contextlib
import hashlib
import json
import os
import re
import threading
from typing import Iterator, Optional, Sequence
import uuid

__all__ = ["FILE", "Plan", "TEMPORARY_OVERHEAD", "check", "check_replace",
           "kept_folder", "note", "read", "recording", "write_atomically"]

FILE = ".fedjax_agg-manifest.json"
"""The manifest's name, in the run folder."""
_FORMAT = "fedjax_agg run files"
_VERSION = 1
# An interrupted atomic write of ``name`` leaves ``.<name>.<pid>.<hex>.tmp``
# (``write_atomically``).
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.\d+\.[0-9a-f]{32}\.tmp$")
TEMPORARY_OVERHEAD = len(".") + len(".") + 10 + len(".") + 32 + len(".tmp")
"""The most bytes the temporary of an atomic write adds to a file's name
(a pid of up to 10 digits): what a name must leave room for."""
# The claims are process-wide: the lock keeps the table and each claim's
# manifest consistent where runs write from several threads.
_LOCK = threading.RLock()
_ACTIVE: dict[str, "_Claim"] = {}  # abs folder -> its claim


class Plan(tuple):
  """The files (relative paths) an ``overwrite`` removes, in order; empty
  for a fresh or resumed run."""


def _digest(path: str) -> str:
  sha = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      sha.update(block)
  return sha.hexdigest()


def _entry(path: str) -> dict:
  return {"size": os.path.getsize(path), "sha256": _digest(path)}


def _unchanged(path: str, entry: dict) -> bool:
  """Whether ``path`` is still the regular file a manifest ``entry``
  recorded (a link or a folder in its place is a change)."""
  # ``isfile`` follows links, so the link test must come first: a link to an
  # identical copy is not the file the run wrote, and hashing through it would
  # read outside the folder.
  return (not os.path.islink(path) and os.path.isfile(path)
          and _entry(path) == {k: entry[k] for k in ("size", "sha256")})


def _inside(relative: str) -> bool:
  """Whether ``relative`` names a path strictly inside its folder."""
  if not isinstance(relative, str) or not relative or "\0" in relative:
    return False
  # The library only ever records normalized relative paths; any other spelling
  # ("a/../b", "./a", "a//b") comes from an edited manifest and could hide a
  # ".." that leads out of the folder.
  if os.path.isabs(relative) or relative != os.path.normpath(relative):
    return False
  return not (relative == os.curdir or relative.split(os.sep)[0] == os.pardir)


def read(folder: str) -> Optional[dict]:
  """``folder``'s manifest (``{"files": {path: {"size", "sha256"}},
  "folders": [...], "kept": [...]}``), or None where it has none.

  Raises:
    ValueError: naming the manifest, where it is not one the library
      wrote (not JSON, another format, or a path outside the folder).
  """
  path = os.path.join(folder, FILE)
  if not os.path.lexists(path):
    return None
  try:
    # The manifest decides what is deleted, so it is read only when it is a
    # plain file of sane size: a link could point at any JSON on the machine, a
    # FIFO would block ``open`` and a huge file would exhaust memory.
    if os.path.islink(path) or not os.path.isfile(path):
      raise ValueError("not a regular file")
    if os.path.getsize(path) > 64 << 20:
      raise ValueError("larger than 64 MiB")
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
  # RecursionError: ``json.load`` recurses per nesting level, so a deeply nested
  # file fails that way rather than with a ValueError.
  except (OSError, ValueError, RecursionError) as error:
    raise ValueError(f"{path}: cannot read the run's manifest ({error}); "
                     "nothing was removed") from None
  files = saved.get("files") if isinstance(saved, dict) else None
  if (not isinstance(saved, dict) or saved.get("format") != _FORMAT
      or not isinstance(files, dict)):
    raise ValueError(f"{path}: not a fedjax_agg manifest; nothing was "
                     "removed")
  folders = saved.get("folders", [])
  kept = saved.get("kept", [])
  # Every entry is checked before the manifest is returned: one bad path refuses
  # the whole file, so an overwrite never removes part of a folder and then
  # stops half-way.
  for name, entry in files.items():
    if not _inside(name) or not (
        isinstance(entry, dict) and isinstance(entry.get("size"), int)
        and isinstance(entry.get("sha256"), str)):
      raise ValueError(f"{path}: bad entry {name!r}; nothing was removed")
  # Where "folders" or "kept" is not a list, the single None fails ``_inside``
  # and the manifest is refused like any other bad entry.
  for name in [*folders, *kept] if isinstance(folders, list) and isinstance(
      kept, list) else [None]:
    if not _inside(name):
      raise ValueError(f"{path}: bad folder entry {name!r}; nothing was "
                       "removed")
  return {"files": dict(files), "folders": list(folders), "kept": list(kept)}


def _walk(folder: str, kept: Sequence[str]) -> Iterator[str]:
  """Every entry below ``folder`` that is not a folder (files, links,
  sockets ...), as relative paths, skipping the kept folders and the
  manifest; links to folders are entries, never followed."""
  for root, folders, files in os.walk(folder):
    relative = os.path.relpath(root, folder)
    keep = []
    for name in sorted(folders):
      path = os.path.normpath(os.path.join(relative, name))
      # A link to a folder is reported, never walked: its files live elsewhere,
      # and counting (or later removing) them would reach outside the run
      # folder.
      if os.path.islink(os.path.join(root, name)):
        yield path
      elif path not in kept:
        keep.append(name)
    # In-place assignment prunes ``os.walk``'s descent (it walks top-down).
    folders[:] = keep
    for name in sorted(files):
      path = os.path.normpath(os.path.join(relative, name))
      if path != FILE:
        yield path


def _temporary_of(path: str, listed) -> bool:
  """Whether ``path`` is an interrupted write of a listed file."""
  match = _TEMPORARY.match(os.path.basename(path))
  return bool(match) and os.path.join(
      os.path.dirname(path), match["name"]) in listed


def check(folder: str, names: Sequence[str] = (), overwrite: bool = False,
          resume: bool = False, keep: Sequence[str] = ()) -> Plan:
  """Whether a run may write into ``folder``, and what an ``overwrite``
  removes. Reads only.

  Args:
    folder: the run's folder (need not exist).
    names: the files the run will write, relative to ``folder``.
    overwrite: replace the recorded run in ``folder``.
    resume: continue the run in ``folder`` (nothing is removed).
    keep: with ``overwrite``, files (relative paths) the manifest does not
      list that may stay in the folder.

  Returns:
    The ``Plan`` of files to remove (empty unless ``overwrite``).

  Raises:
    ValueError: naming the folder and the files at fault.
  """
  # Strict bools: a string such as "false" is truthy and would turn on the one
  # option that deletes files.
  for name, value in (("overwrite", overwrite), ("resume", resume)):
    if not isinstance(value, bool):
      raise TypeError(f"{name} must be a bool, got {value!r}")
  # A bare string is a sequence of one-letter paths; refuse it rather than keep
  # "c", "o", "n", ...
  if isinstance(keep, str) or not all(isinstance(k, str) for k in keep):
    raise TypeError(f"keep must be a list of relative paths, got {keep!r}")
  bad = [k for k in keep if not _inside(os.path.normpath(k))]
  if bad:
    raise ValueError(f"keep: {bad[0]!r} is not a path inside {folder}")
  keep = {os.path.normpath(k) for k in keep}
  if not os.path.isdir(folder):
    return Plan()
  # Read even for a resume: the resumed run extends this manifest, so a damaged
  # one must stop the run here, before its first file.
  manifest = read(folder)
  listed = {} if manifest is None else manifest["files"]
  if resume:
    return Plan()
  # Only the names this run writes matter here: other unrecorded files are
  # written beside, never touched, whether or not there is a manifest.
  foreign = sorted(name for name in {os.path.normpath(n) for n in names}
                   if os.path.lexists(os.path.join(folder, name))
                   and name not in listed and name not in keep)
  if foreign:
    raise ValueError(
        f"{folder} holds {_shown(foreign)}, which this run would replace "
        "and which no recorded run wrote; move them or choose another "
        "folder (the library deletes only files it wrote)")
  if manifest is None:
    return Plan()
  # Recorded files already gone need nothing; a folder whose recorded files are
  # all gone takes a fresh run without ``overwrite``.
  present = [name for name in listed
             if os.path.lexists(os.path.join(folder, name))]
  if not overwrite:
    if present:
      raise ValueError(
          f"{folder} already holds a run ({_shown(sorted(present))}); "
          "choose another folder, or overwrite it explicitly (--overwrite, "
          "overwrite=True)")
    return Plan()
  # All refusals come before the plan is returned, and nothing is removed here:
  # an overwrite is all or nothing.
  changed = [name for name in present
             if not _unchanged(os.path.join(folder, name), listed[name])]
  if changed:
    raise ValueError(
        f"{folder}: {_shown(sorted(changed))} changed since the run wrote "
        "them; the overwrite removed nothing (move them away first)")
  found = [name for name in _walk(folder, manifest["kept"])
           if name not in listed and name not in keep]
  # Leftovers of an interrupted atomic write of a recorded file are the
  # library's own and go with it; a temporary of an unrecorded name is treated
  # as a user's file.
  temporaries = [name for name in found if _temporary_of(name, listed)]
  unlisted = [name for name in found if name not in temporaries]
  if unlisted:
    raise ValueError(
        f"{folder} holds files no recorded run wrote: {_shown(unlisted)}; "
        "the overwrite removed nothing. Move them, or name them to stay "
        "(--keep PATH, keep=[...])")
  return Plan(sorted(present) + temporaries)


def check_replace(folder: str, names: Sequence[str]) -> None:
  """Whether the files ``names`` (relative to ``folder``) may be written
  over: each one present must be listed in the manifest and unchanged
  (what a command that regenerates its files, such as ``report``, may
  replace; nothing else in the folder is touched). Reads only.

  Raises:
    ValueError: naming the folder and the files that are a user's or
      were changed.
  """
  if not os.path.isdir(folder):
    return
  manifest = read(folder)
  listed = {} if manifest is None else manifest["files"]
  mine = []
  for name in sorted({os.path.normpath(n) for n in names}):
    path = os.path.join(folder, name)
    if not os.path.lexists(path):
      continue
    if name not in listed or not _unchanged(path, listed[name]):
      mine.append(name)
  if mine:
    raise ValueError(
        f"{folder} holds {_shown(mine)}, which this would replace and which "
        "the library did not write (or which changed since); move them or "
        "choose another folder")


def _shown(names: Sequence[str], most: int = 4) -> str:
  return ", ".join(names[:most]) + (
      f" and {len(names) - most} more" if len(names) > most else "")


class _Claim:
  """A folder a run writes into: its manifest, kept up to date."""

  def __init__(self, folder: str, manifest: Optional[dict]):
    self.folder = folder
    self.files = {} if manifest is None else dict(manifest["files"])
    self.folders = [] if manifest is None else list(manifest["folders"])
    self.kept = [] if manifest is None else list(manifest["kept"])
    self.existing = set()  # folders that were there before the run

  def note(self, *paths: str) -> None:
    recorded = False
    for path in paths:
      relative = os.path.relpath(path, self.folder)
      # The manifest never lists itself (its hash changes with every save), nor
      # a path outside the claimed folder.
      if relative == FILE or not _inside(relative):
        continue
      recorded = True
      parent = os.path.dirname(relative)
      while parent:
        # Only folders this run created are recorded, so the removal of empty
        # folders after an overwrite never takes a folder the user made.
        if parent not in self.existing and parent not in self.folders:
          self.folders.append(parent)
        parent = os.path.dirname(parent)
      self.files[relative] = _entry(path)
    if recorded:
      self.save()

  def save(self) -> None:
    text = json.dumps(
        {"format": _FORMAT, "version": _VERSION, "files": self.files,
         "folders": sorted(self.folders), "kept": sorted(self.kept)},
        indent=1, sort_keys=True) + "\n"

    def write(temporary):
      # "x": the temporary's name is unique; a collision must fail, never write
      # into another process's file.
      with open(temporary, "x", encoding="utf-8") as f:
        f.write(text)
    write_atomically(os.path.join(self.folder, FILE), write)


def write_atomically(path: str, write) -> str:
  """Calls ``write(temporary)`` to write a temporary file in ``path``'s
  folder (created if missing), then renames it over ``path``: a reader
  never sees half a file, and an interrupted write leaves at most the
  temporary (which an overwrite of the run removes). Returns ``path``.
  ``jsonio.write_file`` is this plus the manifest's record."""
  # A name of our own rather than ``tempfile.mkstemp``, whose 0600 mode the
  # rename would carry over: the file gets the umask's permissions.
  directory, name = os.path.split(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  temporary = os.path.join(directory,
                           f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
  try:
    write(temporary)
    os.replace(temporary, path)
  # BaseException: a Ctrl-C during the write also removes the temporary.
  except BaseException:
    if os.path.exists(temporary):
      os.remove(temporary)
    raise
  return str(path)


def _remove(folder: str, plan: Plan, manifest: dict) -> None:
  """Removes the planned files, each verified once more just before."""
  listed = manifest["files"]
  for name in plan:
    path = os.path.join(folder, name)
    # Verified again: time passes between ``check`` and the claim (data is
    # loaded, models built), and a file edited meanwhile must survive.
    if name in listed:
      if not os.path.lexists(path):
        continue
      if not _unchanged(path, listed[name]):
        raise ValueError(f"{path} changed since the overwrite was checked; "
                         "it was left in place")
    elif not _temporary_of(name, listed):
      raise ValueError(f"{path} is not in the run's manifest")
    os.remove(path)
  # Deepest first, so a parent is empty once its children are gone; only empty
  # folders this run created, and never through a link.
  for name in sorted(manifest["folders"], key=len, reverse=True):
    path = os.path.join(folder, name)
    if os.path.isdir(path) and not os.path.islink(path) and (
        not os.listdir(path)):
      os.rmdir(path)


@contextlib.contextmanager
def recording(folder: str, plan: Sequence[str] = (), resume: bool = False):
  """Claims ``folder`` for the block: removes ``plan`` (``check``'s), then
  records every file the library writes below it.

  Nothing is written until the first file is (an empty manifest is not
  left behind by a run that writes nothing)."""
  folder = os.path.abspath(folder)
  manifest = read(folder) if os.path.isdir(folder) else None
  if plan:
    _remove(folder, plan, manifest)
  # A new run starts a new list (keeping the kept folders), saved at once, so
  # the manifest never lists files of the run that was just removed.
  if manifest is not None and not resume:
    manifest = {"files": {}, "folders": [], "kept": manifest["kept"]}
    claim = _Claim(folder, manifest)
    claim.save()
  else:
    claim = _Claim(folder, manifest)
  if os.path.isdir(folder):
    # Computed after the removal: a folder the old run left (it still holds a
    # kept folder or a user's file) is not this run's to remove.
    claim.existing = {
        os.path.relpath(root, folder) for root, _, _ in os.walk(folder)}
  with _LOCK:
    # Claims may nest (a library writer called inside its caller's claim of the
    # same folder); the outer claim is restored when the inner one ends.
    outer = _ACTIVE.get(folder)
    _ACTIVE[folder] = claim
  try:
    yield claim
  finally:
    with _LOCK:
      if outer is None:
        _ACTIVE.pop(folder, None)
      else:
        _ACTIVE[folder] = outer


def _claim_of(path: str) -> Optional[_Claim]:
  path = os.path.abspath(path)
  with _LOCK:
    # The deepest claimed folder holding the path records it, so a member's
    # sub-folder claimed on its own keeps its own manifest.
    roots = [root for root in _ACTIVE
             if os.path.commonpath([root, path]) == root and root != path]
    return _ACTIVE[max(roots, key=len)] if roots else None


def note(*paths: str) -> None:
  """Records ``paths`` (just written by the library) in the manifests of
  the claimed folders holding them, if any (one rewrite per folder)."""
  by_claim = {}
  for path in paths:
    claim = _claim_of(path)
    # Only regular files are recorded: a link's hash would be its target's.
    if claim is not None and os.path.isfile(path) and not os.path.islink(
        path):
      by_claim.setdefault(id(claim), (claim, []))[1].append(
          os.path.abspath(path))
  with _LOCK:
    for claim, claimed in by_claim.values():
      claim.note(*claimed)


def kept_folder(path: str) -> None:
  """Records ``path`` as a folder the run keeps across overwrites
  (checkpoints): never cleared, its files never counted as a user's."""
  claim = _claim_of(path)
  if claim is None:
    return
  relative = os.path.relpath(os.path.abspath(path), claim.folder)
  with _LOCK:
    if _inside(relative) and relative not in claim.kept:
      claim.kept.append(relative)
      claim.save()
