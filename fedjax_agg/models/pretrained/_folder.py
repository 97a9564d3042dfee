"""A checkpoint folder as a run's base: recognised, checked without reading
its weights, and fingerprinted by its files' hashes.

A run that starts from a downloaded checkpoint (a description's
``model.base`` with ``model.name`` "pretrained") checks the folder when
the description is made (config.json and every safetensors header: cheap,
no tensor is read) and records the SHA-256 of each file the network is
read from, so a checkpoint of the run refuses to resume on another base
and the run's config names the exact files.
"""

import hashlib
import os
import time

from fedjax_agg.models.pretrained import _config
from fedjax_agg.models.pretrained import _files

CONFIG = "config.json"

# SHA-256 of files already read, keyed by what ``os.stat`` says of them. A
# run asks for its base's hashes when each algorithm and each seed is
# built; a downloaded base is gigabytes, so it is read once a process, and
# again only if the file was replaced or rewritten (another inode, size or
# modification time). A file modified in the last seconds is not kept:
# timestamps are coarse, and a rewrite within the same tick would keep
# its key.
_DIGESTS: dict[tuple, str] = {}
_SETTLED_NS = 2 * 10**9


def is_checkpoint(path) -> bool:
  """Whether ``path`` is a folder holding a Hugging Face checkpoint's
  ``config.json`` (the loader's own checks say what else is wrong)."""
  return isinstance(path, (str, os.PathLike)) and os.path.isfile(
      os.path.join(os.fspath(path), CONFIG))


def check_checkpoint(path):
  """The checked config of the checkpoint folder ``path``, after checking
  config.json, the index and every weight file's header (no tensor is
  read).

  Raises:
    TypeError / ValueError: naming the file and key at fault, as
      ``load_pretrained`` does.
  """
  folder = _files.check_folder(path)
  config = _config.read_config(folder)
  for name in _files.shard_map(folder):
    _files.read_header(os.path.join(folder, name))
  return config


def checkpoint_files(path) -> dict[str, str]:
  """``{file name: SHA-256 hex}`` of the files the network is read from:
  config.json, the index where there is one, and every weight file."""
  folder = _files.check_folder(path)
  names = [CONFIG]
  if os.path.isfile(os.path.join(folder, _files.INDEX)):
    names.append(_files.INDEX)
  # Sorted, so the recorded hashes do not depend on the index's order.
  names += sorted(_files.shard_map(folder))
  return {name: _digest(os.path.join(folder, name)) for name in names}


def _digest(path: str) -> str:
  with open(path, "rb") as f:
    # The stat of the open file, so the key and the bytes hashed are the
    # same file even if the name is replaced meanwhile.
    stat = os.fstat(f.fileno())
    key = (os.path.realpath(path), stat.st_dev, stat.st_ino, stat.st_size,
           stat.st_mtime_ns)
    if key in _DIGESTS:
      return _DIGESTS[key]
    digest = hashlib.file_digest(f, "sha256").hexdigest()
  if time.time_ns() - stat.st_mtime_ns > _SETTLED_NS:
    _DIGESTS[key] = digest
  return digest
