"""The weights of a Hugging Face checkpoint folder, read and checked.

One ``model.safetensors``, or shards listed by ``model.safetensors.index.json``
(``{"weight_map": {tensor: shard file}}``). Each file's header is checked
before ``safetensors`` (its numpy API) reads it: the header's length, its
JSON, every tensor's dtype, shape and byte range against the file's size.
Shard names must be plain file names in the folder (no path characters),
so an index cannot point outside it.
"""

import json
import math
import os
import re
import struct
from typing import Callable, Mapping, Sequence

import numpy as np
import safetensors

from fedjax_agg import jsonio

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"

# safetensors dtype -> bytes per element, for the floating types a
# checkpoint's weights may be stored in.
_ITEM_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
_OTHER_DTYPES = ("I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64",
                 "BOOL", "F8_E4M3", "F8_E5M2")
_MAX_HEADER = 100 << 20
_MAX_INDEX = 64 << 20
_SHARD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-.]*\.safetensors$")


def _refuse_constant(name: str):
  raise ValueError(f"{name} is not a JSON number")


def read_json(path: str, what: str, max_bytes: int = 1 << 20) -> dict:
  """A JSON object from ``path`` (no NaN/Infinity, no key given twice, at
  most ``max_bytes``), errors naming the file."""
  # A link is refused: it could point the loader at a file outside the
  # checkpoint folder.
  if os.path.islink(path) or not os.path.isfile(path):
    raise ValueError(f"{path}: {what} is missing (or not a regular file)")
  # The size is checked before reading, so a huge file is refused without
  # being loaded into memory.
  if os.path.getsize(path) > max_bytes:
    raise ValueError(f"{path}: {what} is larger than {max_bytes} bytes")
  try:
    with open(path, "rb") as f:
      text = f.read().decode("utf-8")
    # The duplicate check of the library's reader, NaN refused as well.
    json.loads(text, parse_constant=_refuse_constant)
    document = jsonio.load_json(path)
  except (ValueError, UnicodeDecodeError, RecursionError) as error:
    raise ValueError(f"{path}: {what} is not valid JSON ({error})") from None
  if not isinstance(document, dict):
    raise ValueError(f"{path}: {what} must hold a JSON object, got "
                     f"{type(document).__name__}")
  return document


def check_folder(path) -> str:
  """``path`` as a string, refused unless it is an existing folder."""
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"path must be a folder's path (str or os.PathLike), "
                    f"got {type(path).__name__}")
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise ValueError(f"{path}: not a folder (a checkpoint is a folder "
                     "holding config.json and model.safetensors)")
  return path


def _check_shard_name(index_path: str, tensor: str, name) -> None:
  if not isinstance(name, str) or not _SHARD_NAME.match(name) or (
      ".." in name):
    raise ValueError(f"{index_path}: weight_map[{tensor!r}] = {name!r} is not "
                     "a plain .safetensors file name in the folder (no path "
                     "characters)")


def shard_map(folder: str) -> dict[str, list[str]]:
  """shard file name -> the tensors the index places there (one entry,
  ``model.safetensors`` with no list, without an index)."""
  index_path = os.path.join(folder, INDEX)
  # lexists, not isfile: a dangling link or a folder under the index's
  # name is read and refused below, not passed over for model.safetensors.
  if not os.path.lexists(index_path):
    if not os.path.isfile(os.path.join(folder, SINGLE)):
      extra = (" (pytorch_model.bin is not read: PyTorch pickles are not "
               "loaded)" if os.path.exists(
                   os.path.join(folder, "pytorch_model.bin")) else "")
      raise ValueError(f"{folder}: holds neither {SINGLE} nor {INDEX}"
                       f"{extra}")
    return {SINGLE: []}
  index = read_json(index_path, INDEX, _MAX_INDEX)
  weight_map = index.get("weight_map")
  if not isinstance(weight_map, dict) or not weight_map:
    raise ValueError(f"{index_path}: weight_map must be a non-empty object "
                     f"of tensor name -> shard file, got "
                     f"{type(weight_map).__name__}")
  shards: dict[str, list[str]] = {}
  for tensor, name in weight_map.items():
    _check_shard_name(index_path, tensor, name)
    shards.setdefault(name, []).append(tensor)
  for name in shards:
    if not os.path.isfile(os.path.join(folder, name)):
      raise ValueError(f"{index_path}: shard {name} (holding "
                       f"{shards[name][0]!r}) is missing from the folder")
  return shards


def read_header(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
  """tensor -> (safetensors dtype, shape) of a .safetensors file, after
  checking the header against the file's size."""
  def bad(message):
    raise ValueError(f"{path}: not a valid safetensors file ({message})")

  size = os.path.getsize(path)
  if size < 8:
    bad(f"{size} bytes, shorter than the 8-byte header length")
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    # The claimed length is checked against the file before it is read: a
    # hostile length cannot make the reader allocate more than the file holds
    # (nor more than _MAX_HEADER).
    if length > min(_MAX_HEADER, size - 8):
      bad(f"its header claims {length} bytes, the file has {size - 8} after "
          "the length")
    raw = f.read(length)
  try:
    header = json.loads(raw.decode("utf-8"),
                        parse_constant=lambda name: bad(f"{name} in header"))
  except (UnicodeDecodeError, ValueError, RecursionError) as error:
    # ``bad`` raised from parse_constant: already a ValueError naming the
    # file, passed on as it is.
    if isinstance(error, ValueError) and "safetensors" in str(error):
      raise
    bad(f"its header is not JSON: {error}")
  if not isinstance(header, dict):
    bad("its header is not a JSON object")
  data_bytes = size - 8 - length
  tensors = {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    if not isinstance(entry, dict):
      bad(f"tensor {name!r}: entry is not an object")
    dtype, shape, offsets = (entry.get("dtype"), entry.get("shape"),
                             entry.get("data_offsets"))
    if dtype in _OTHER_DTYPES:
      bad(f"tensor {name!r} is stored as {dtype}, not a floating type "
          f"{tuple(_ITEM_BYTES)}")
    if dtype not in _ITEM_BYTES:
      bad(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40
        for d in shape):
      bad(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(
        isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
      bad(f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end]")
    begin, end = offsets
    # Every tensor's bytes must lie in the data section and match its dtype
    # and shape exactly: safetensors is never handed offsets it would trust
    # from a hostile header.
    want = math.prod(shape) * _ITEM_BYTES[dtype]
    if not 0 <= begin <= end <= data_bytes or end - begin != want:
      bad(f"tensor {name!r}: bytes [{begin}, {end}) do not hold its "
          f"{want} bytes within the file's {data_bytes} data bytes")
    tensors[name] = (dtype, tuple(shape))
  return tensors


def load_tensors(folder: str,
                 expect: Callable[[set], Mapping[str, tuple[int, ...]]],
                 ignored: Sequence[str]) -> dict[str, np.ndarray]:
  """The tensors the network expects as float32 numpy arrays.

  Args:
    folder: the checkpoint folder.
    expect: ``expect(names in the files) -> {name: shape}``, every tensor
      the network needs.
    ignored: regular expressions of tensors a checkpoint may hold that the
      network does not use (buffers, a tied output layer's copy).

  Raises:
    ValueError: naming the file and tensor: a missing shard or tensor, a
      tensor the index places in a shard that lacks it, an unexpected
      tensor, a shape that disagrees with config.json, a non-floating or
      non-finite tensor, a file that is not safetensors.
  """
  found: dict[str, tuple[str, tuple[int, ...]]] = {}
  where: dict[str, str] = {}
  for name, listed in shard_map(folder).items():
    path = os.path.join(folder, name)
    header = read_header(path)
    for tensor in listed:
      if tensor not in header:
        raise ValueError(f"{os.path.join(folder, INDEX)}: places "
                         f"{tensor!r} in {name}, which does not hold it")
    for tensor, entry in header.items():
      # A tensor in two files is refused: which copy was used would depend on
      # the order the shards are read in.
      if tensor in where:
        raise ValueError(f"{path}: tensor {tensor!r} is also in "
                         f"{where[tensor]}")
      found[tensor], where[tensor] = entry, name
  # Asked only now: what the network expects may depend on the names in
  # the files (GPT-2's prefix), so every header is read first.
  expected = expect(set(found))
  skip = [re.compile(pattern) for pattern in ignored]
  unexpected = sorted(t for t in found if t not in expected and not any(
      pattern.fullmatch(t) for pattern in skip))
  if unexpected:
    raise ValueError(f"{os.path.join(folder, where[unexpected[0]])}: "
                     f"unexpected tensor(s) {unexpected[:4]} for this "
                     "architecture and config.json")
  missing = sorted(t for t in expected if t not in found)
  if missing:
    raise ValueError(f"{folder}: tensor {missing[0]!r} is missing from the "
                     f"checkpoint ({len(missing)} missing)")
  for tensor, shape in expected.items():
    if found[tensor][1] != tuple(shape):
      raise ValueError(f"{os.path.join(folder, where[tensor])}: tensor "
                       f"{tensor!r} has shape {list(found[tensor][1])}, "
                       f"config.json implies {list(shape)}")
  by_file: dict[str, list[str]] = {}
  for tensor in expected:
    by_file.setdefault(where[tensor], []).append(tensor)
  arrays = {}
  for name, tensors in by_file.items():
    path = os.path.join(folder, name)
    try:
      with safetensors.safe_open(path, framework="np") as handle:
        for tensor in tensors:
          # float32 on read, whatever the file's storage; the variables'
          # dtype is applied afterwards (``_common.to_params``).
          arrays[tensor] = np.asarray(handle.get_tensor(tensor), np.float32)
    except (OSError, safetensors.SafetensorError) as error:
      raise ValueError(f"{path}: not a valid safetensors file ({error})"
                       ) from None
    for tensor in tensors:
      # A non-finite base weight is refused at load: it would otherwise turn up
      # as NaN losses in every client, far from its cause.
      if not np.all(np.isfinite(arrays[tensor])):
        raise ValueError(f"{path}: tensor {tensor!r} holds non-finite "
                         "values (NaN or inf)")
  return arrays
