"""The checkpoints of one run: written, listed, restored and checked.

``RunCheckpointer`` saves a run's state, history and meta for a round and
restores them (the layout and its checks are in ``fedjax_agg.checkpoint``'s
docstring); ``open_run`` opens a run's folder, fresh or resumed.
"""

import dataclasses
import json
import logging
import os
import zlib
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from fedjax_agg import locks
from fedjax_agg import manifest
from fedjax_agg.checkpoint._errors import CheckpointError
from fedjax_agg.checkpoint._errors import CheckpointMismatchError
from fedjax_agg.checkpoint._errors import CorruptCheckpointError
from fedjax_agg.fingerprint import _crc
from fedjax_agg.fingerprint import config_differences

FORMAT_VERSION = 1
"""The version of the checkpoint layout written to ``meta``; a checkpoint
of another version is refused on restore."""
MAX_TO_KEEP = 2
"""How many saved rounds a run's checkpoint directory keeps by default (the
oldest are deleted)."""
ITEMS = ("state", "history", "meta")
"""The names of the orbax items written together for each saved round."""

# The package's logger: its messages keep the name they had.
_log = logging.getLogger("fedjax_agg.checkpoint")


class Snapshot(NamedTuple):
  """A restored run.

  Attributes:
    round: rounds completed.
    state: the ``ServerState`` (on the template's devices).
    run_key: the key the per-round cohort keys are split from.
    rows: History rows (row 0 is the initial model).
    client_rows: History client rows.
  """
  round: int
  state: Any
  run_key: jax.Array
  rows: list
  client_rows: list


def check_arguments(checkpoint_dir: Optional[str], checkpoint_every: int,
                    resume: bool) -> None:
  """Raises ValueError naming the bad argument of ``simulation.run``."""
  # bool is an int in Python: True must not mean "every round".
  if (isinstance(checkpoint_every, bool)
      or not isinstance(checkpoint_every, (int, np.integer))
      or checkpoint_every < 0):
    raise ValueError("checkpoint_every must be an int >= 0 (rounds; 0 = "
                     f"never), got {checkpoint_every!r}")
  if not isinstance(resume, bool):
    raise ValueError(f"resume must be a bool, got {resume!r}")
  if checkpoint_dir is None:
    if resume:
      raise ValueError("resume=True needs checkpoint_dir (the folder of the "
                       "run to continue)")
    if checkpoint_every:
      raise ValueError(f"checkpoint_every={checkpoint_every} needs "
                       "checkpoint_dir (where to write the checkpoints)")
  elif not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(
      checkpoint_dir):
    raise ValueError("checkpoint_dir must be a non-empty path, got "
                     f"{checkpoint_dir!r}")


# ---------------------------------------------------------------------------
# Stable descriptions of the run's ingredients (for the mismatch check).


def _history_crc(history: dict) -> int:
  """CRC-32 of a checkpoint's history item (rows and client-row layout)."""
  # sort_keys: the restored dict's key order need not be the saved one's.
  # allow_nan: rows may hold NaN (a diverged round), and this text is only
  # hashed, never written.
  text = json.dumps(history, sort_keys=True, allow_nan=True)
  return zlib.crc32(text.encode())


# ---------------------------------------------------------------------------
# State <-> flat host arrays.


def _is_key(leaf) -> bool:
  return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(
      leaf.dtype, jax.dtypes.prng_key)


def _leaf_spec(path, leaf) -> dict:
  is_key = _is_key(leaf)
  # Typed keys have an extended dtype orbax cannot store: their raw uint32 data
  # is saved, and the implementation recorded to wrap it back.
  data = jax.random.key_data(leaf) if is_key else leaf
  return {"path": jax.tree_util.keystr(path, simple=True, separator="/"),
          "shape": list(np.shape(data)), "dtype": str(jnp.result_type(data)),
          "key_impl": str(jax.random.key_impl(leaf)) if is_key else None}


def _tree_spec(tree) -> list[dict]:
  return [_leaf_spec(path, leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _leaf_name(index: int) -> str:
  # Leaves are stored by position, not by tree path: the spec's order is the
  # contract, and ``spec_differences`` refuses a reordered tree.
  return f"leaf_{index:05d}"


def _to_host(tree) -> tuple[dict, list[dict]]:
  """-> ({leaf name: host copy}, spec with CRC-32s); zero-size leaves are
  described in the spec only (orbax does not store them)."""
  arrays, spec = {}, _tree_spec(tree)
  for i, (leaf, entry) in enumerate(zip(jax.tree.leaves(tree), spec,
                                        strict=True)):
    data = jax.random.key_data(leaf) if entry["key_impl"] else leaf
    # A copy, never a view: the round donates the state's buffers, and
    # orbax writes this array after ``save`` returns.
    host = np.array(data, copy=True)
    entry["crc32"] = _crc(host)
    if host.size:
      arrays[_leaf_name(i)] = host
  return arrays, spec


def _from_host(arrays: dict, spec: list[dict], template, where: str):
  """Rebuilds ``template``'s tree from restored host arrays (checks CRCs)."""
  leaves = []
  for i, (entry, like) in enumerate(zip(spec, jax.tree.leaves(template),
                                        strict=True)):
    dtype = jnp.dtype(entry["dtype"])
    # A zero-size leaf was never stored (orbax skips it); its spec alone
    # rebuilds it.
    if int(np.prod(entry["shape"])) == 0:
      host = np.zeros(entry["shape"], dtype)
    elif _leaf_name(i) not in arrays:
      raise CorruptCheckpointError(
          f"{where}: leaf {entry['path']!r} is missing")
    else:
      host = np.asarray(arrays[_leaf_name(i)])
    # Checked before the leaf is placed on a device: a damaged array must be
    # refused, never resumed from.
    if (list(host.shape) != entry["shape"] or host.dtype != dtype
        or _crc(host) != entry["crc32"]):
      raise CorruptCheckpointError(
          f"{where}: leaf {entry['path']!r} fails its check (shape "
          f"{host.shape} {host.dtype}, CRC-32 {_crc(host)}; written "
          f"{tuple(entry['shape'])} {entry['dtype']}, CRC-32 "
          f"{entry['crc32']}): the file is damaged")
    # Placed as the template's leaf is (its devices, its mesh sharding), so a
    # resumed run's state lives where a fresh run's would.
    sharding = getattr(like, "sharding", None)
    if entry["key_impl"]:
      leaf = jax.random.wrap_key_data(jnp.asarray(host),
                                      impl=entry["key_impl"])
      leaves.append(leaf if sharding is None
                    else jax.device_put(leaf, sharding))
    else:
      leaves.append(jax.device_put(host, sharding))
  return jax.tree.unflatten(jax.tree.structure(template), leaves)


def spec_differences(saved: list[dict], current: list[dict],
                     limit: int = 12) -> list[str]:
  """Tree paths, shapes, dtypes and key types that differ."""
  old = {e["path"]: e for e in saved}
  new = {e["path"]: e for e in current}
  lines = [f"{p}: only in the checkpoint" for p in old if p not in new]
  lines += [f"{p}: not in the checkpoint" for p in new if p not in old]
  for path in (p for p in new if p in old):
    a, b = old[path], new[path]
    for field in ("shape", "dtype", "key_impl"):
      if a[field] != b[field]:
        lines.append(f"{path}: {field} {a[field]} in the checkpoint, "
                     f"{b[field]} now")
  # Same leaves in another order still fail: arrays are matched by position.
  if not lines and [e["path"] for e in saved] != [e["path"] for e in current]:
    lines.append("the leaves are in a different order")
  if len(lines) > limit:
    lines = lines[:limit] + [f"... and {len(lines) - limit} more"]
  return lines


# ---------------------------------------------------------------------------
# History: scalar rows as JSON; each per-client field, stacked over rounds,
# as one binary array (JSON would cost seconds per save with large cohorts).


def _encode(value):
  if isinstance(value, (np.ndarray, jax.Array, np.generic)):
    host = np.asarray(value)
    return {"__ndarray__": host.tolist(), "dtype": str(host.dtype),
            "shape": list(host.shape)}
  if isinstance(value, dict):
    return {k: _encode(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_encode(v) for v in value]
  return value


def _decode(value):
  if isinstance(value, dict) and "__ndarray__" in value:
    array = np.array(value["__ndarray__"], dtype=jnp.dtype(value["dtype"]))
    array = array.reshape(value["shape"])
    # A 0-d array decodes to a numpy scalar, as it was saved, so a restored row
    # equals the original one.
    return array[()] if not value["shape"] else array
  if isinstance(value, dict):
    return {k: _decode(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_decode(v) for v in value]
  return value


def _pack_client_rows(client_rows: list) -> tuple[dict, dict]:
  """-> ({array name: field stacked over rounds [R, ...]}, JSON layout)."""
  fields = list(client_rows[0]) if client_rows else []
  # Rows with different fields (``client_row`` adds "mask" only in rounds with
  # padding) cannot be stacked into columns: they are kept whole as JSON.
  if any(list(row) != fields for row in client_rows):
    return {}, {"count": len(client_rows), "json": _encode(client_rows)}
  arrays, entries = {}, []
  for i, name in enumerate(fields):
    values = [row[name] for row in client_rows]
    if all(isinstance(v, np.ndarray) for v in values) and len(
        {(v.shape, v.dtype) for v in values}) == 1:
      stacked = np.stack(values)
      entry = {"name": name, "array": f"client_{i:03d}",
               "shape": list(stacked.shape), "dtype": str(stacked.dtype),
               "crc32": _crc(stacked)}
      # Zero-size columns are not stored (orbax skips them); the layout's shape
      # rebuilds them.
      if stacked.size:
        arrays[entry["array"]] = stacked
    else:
      entry = {"name": name, "values": _encode(values)}
    entries.append(entry)
  return arrays, {"count": len(client_rows), "fields": entries}


def _unpack_client_rows(layout: dict, arrays: dict, where: str) -> list:
  if "json" in layout:
    return _decode(layout["json"])
  columns = {}
  for entry in layout["fields"]:
    if "values" in entry:
      columns[entry["name"]] = _decode(entry["values"])
      continue
    dtype = jnp.dtype(entry["dtype"])
    host = (np.asarray(arrays[entry["array"]]) if entry["array"] in arrays
            else np.zeros(entry["shape"], dtype))
    if (list(host.shape) != entry["shape"] or host.dtype != dtype
        or _crc(host) != entry["crc32"]):
      raise CorruptCheckpointError(
          f"{where}: client rows {entry['name']!r} fail their check: the "
          "file is damaged")
    columns[entry["name"]] = list(host)
  return [{name: values[i] for name, values in columns.items()}
          for i in range(layout["count"])]


# ---------------------------------------------------------------------------
# The checkpoints of one run.


@dataclasses.dataclass
class RunCheckpointer:
  """Saves and restores the checkpoints of one run in ``directory``.

  Attributes:
    directory: the run's checkpoint folder (created if absent).
    every: save after every this many rounds and after the last (0: only
      ``restore``).
    config: the run's JSON-able config; a checkpoint of another config is
      refused on restore.
    max_to_keep: checkpoints kept (the latest ones).
    async_save: write in a background thread while the next rounds run.
    lazy: leave an absent ``directory`` absent until the first save (a
      run that only checkpoints when it is interrupted creates nothing
      otherwise).
  """
  directory: str
  every: int
  config: dict
  max_to_keep: int = MAX_TO_KEEP
  async_save: bool = True
  lazy: bool = False

  def __post_init__(self):
    self.directory = os.path.abspath(os.fspath(self.directory))
    self._manager = None
    if not self.lazy or os.path.isdir(self.directory):
      self._open()

  def _open(self) -> None:
    # One writer per folder for the run's life: a second run in the same
    # folder would overwrite this one's steps.
    os.makedirs(self.directory, exist_ok=True)
    # Kept, not recorded: orbax writes these files, so no manifest lists them.
    # As a kept folder they neither block an overwrite of the run folder as a
    # user's files nor are removed by it (a run never deletes checkpoints).
    manifest.kept_folder(self.directory)
    self._lock = locks.FileLock.for_folder(
        self.directory, f"checkpoint folder {self.directory}").acquire()
    options = ocp.CheckpointManagerOptions(
        preservation_policy=ocp.checkpoint_managers.LatestN(
            self.max_to_keep),
        enable_async_checkpointing=self.async_save,
        # cleanup_tmp_directories: a killed run's half-written step folders are
        # removed when the folder is opened again.
        cleanup_tmp_directories=True, create=True)
    self._manager = ocp.CheckpointManager(self.directory, item_names=ITEMS,
                                          options=options)

  def latest_round(self) -> Optional[int]:
    """The latest complete checkpoint's round (None if there is none)."""
    return None if self._manager is None else self._manager.latest_step()

  def all_rounds(self) -> list[int]:
    """The rounds of the checkpoints in the directory, in ascending order."""
    return [] if self._manager is None else sorted(self._manager.all_steps())

  def should_save(self, round_num: int, num_rounds: int) -> bool:
    """Whether to save after round ``round_num`` of ``num_rounds``: every
    ``every`` rounds and after the last one (never when ``every`` is 0)."""
    return self.every > 0 and (round_num % self.every == 0
                               or round_num == num_rounds)

  def save(self, round_num: int, state, run_key, rows: list,
           client_rows: list) -> None:
    """Saves the run after ``round_num`` rounds (returns once the arrays
    are on the host; the files are written in the background)."""
    if self._manager is None:
      self._open()
    arrays, spec = _to_host({"server": state, "run_key": run_key})
    meta = {"format_version": FORMAT_VERSION, "round": int(round_num),
            "config": self.config, "spec": spec}
    client_arrays, client_layout = _pack_client_rows(client_rows)
    arrays.update(client_arrays)
    history = {"rows": _encode(rows), "client_rows": client_layout}
    meta["history_crc32"] = _history_crc(history)
    # One orbax step holds all three items, so they are committed (renamed into
    # place) together: a step never has a state without its history.
    self._manager.save(int(round_num), args=ocp.args.Composite(
        state=ocp.args.StandardSave(arrays),
        history=ocp.args.JsonSave(history),
        meta=ocp.args.JsonSave(meta)))

  def restore(self, template_state, template_run_key,
              round_num: Optional[int] = None) -> Snapshot:
    """Restores the checkpoint of ``round_num`` (default the latest).

    Args:
      template_state: a ``ServerState`` of the run asked for (fresh init):
        gives the tree, shapes, dtypes and devices.
      template_run_key: the run key of the run asked for.
      round_num: which checkpoint.

    Raises:
      CheckpointMismatchError: the checkpoint is of another run.
      CorruptCheckpointError: it cannot be read or fails its checksums.
    """
    rounds = self.all_rounds()
    if round_num is None:
      if not rounds:
        raise CheckpointError(f"no checkpoint in {self.directory}")
      round_num = rounds[-1]
    where = f"checkpoint of round {round_num} in {self.directory}"
    hint = self._earlier_hint(round_num, rounds)
    # The small meta is read and compared first: a checkpoint of another run is
    # named as such (not as damaged), and no array is read for it.
    meta = self.read_meta(round_num)
    template = {"server": template_state, "run_key": template_run_key}
    differences = (config_differences(meta["config"], self.config)
                   + spec_differences(meta["spec"], _tree_spec(template)))
    if differences:
      raise CheckpointMismatchError(
          f"{where} was written by a different run:\n  "
          + "\n  ".join(differences)
          + "\nResume with the same settings, or start this run in an "
          "empty checkpoint_dir.")
    try:
      items = self._manager.restore(round_num, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(),
          history=ocp.args.JsonRestore()))
      arrays, history = items.state, items.history
    except Exception as e:  # pylint: disable=broad-except
      raise CorruptCheckpointError(
          f"{where} cannot be read ({type(e).__name__}: {e}).{hint}") from e
    try:
      restored = _from_host(arrays or {}, meta["spec"], template, where)
      client_rows = _unpack_client_rows(history["client_rows"],
                                        arrays or {}, where)
    except CorruptCheckpointError as e:
      raise CorruptCheckpointError(f"{e}.{hint}") from e
    # The history item is plain JSON anyone can edit; its CRC lives in meta, so
    # an edit is refused like a damaged array.
    if meta.get("history_crc32") != _history_crc(history):
      raise CorruptCheckpointError(
          f"{where}: its history fails its check (edited or damaged)."
          f"{hint}")
    rows = _decode(history["rows"])
    # Row 0 is the initial model's evaluation: round r holds r + 1 rows and r
    # client rows, else the history is not this step's.
    if len(rows) != round_num + 1 or len(client_rows) != round_num:
      raise CorruptCheckpointError(
          f"{where}: holds {len(rows)} history rows and {len(client_rows)} "
          f"client rows, expected {round_num + 1} and {round_num}.{hint}")
    return Snapshot(round_num, restored["server"], restored["run_key"], rows,
                    client_rows)

  def read_meta(self, round_num: int) -> dict:
    """The ``meta`` item of a checkpoint: format version, round, the run's
    config and the spec of every state leaf."""
    where = f"checkpoint of round {round_num} in {self.directory}"
    try:
      meta = self._manager.restore(round_num, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore())).meta
    except Exception as e:  # pylint: disable=broad-except
      hint = self._earlier_hint(round_num, self.all_rounds())
      raise CorruptCheckpointError(
          f"{where}: its metadata cannot be read ({type(e).__name__}: "
          f"{e}).{hint}") from e
    version = meta.get("format_version") if isinstance(meta, dict) else None
    # Another layout version is never read as this one; a checkpoint of newer
    # code is refused, not guessed at.
    if version != FORMAT_VERSION:
      raise CheckpointMismatchError(
          f"{where}: format version {version!r}, this library reads "
          f"{FORMAT_VERSION}")
    return meta

  def _earlier_hint(self, round_num: int, rounds: list[int]) -> str:
    earlier = [r for r in rounds if r < round_num]
    if not earlier:
      return (" No earlier checkpoint is left: delete the folder to start "
              "afresh.")
    return (f" Earlier checkpoints: rounds {earlier}; delete "
            f"{os.path.join(self.directory, str(round_num))} to resume from "
            f"round {earlier[-1]}.")

  def close(self) -> None:
    """Waits for pending writes and releases the manager."""
    if self._manager is None:
      return  # a lazy checkpointer that never saved
    try:
      self._manager.wait_until_finished()
      self._manager.close()
    # The lock is released even when a pending write fails, so the folder is not
    # held for the rest of the process.
    finally:
      self._lock.release()


def open_run(checkpoint_dir: str, every: int, resume: bool, config: dict,
             template_state, template_run_key
             ) -> tuple[RunCheckpointer, Optional[Snapshot]]:
  """Opens a run's checkpoint folder: -> (checkpointer, snapshot or None).

  With ``resume``, the snapshot is the latest checkpoint (None, and a log
  message, when the folder holds none: the run starts at round 0).
  Without it, a folder that already holds checkpoints is refused, so two
  runs never mix their checkpoints.
  """
  # every=0 saves only where the run is interrupted: nothing is created
  # before that.
  checkpointer = RunCheckpointer(checkpoint_dir, every, config,
                                 lazy=every == 0)
  latest = checkpointer.latest_round()
  if latest is None:
    if resume:
      _log.warning("resume: no checkpoint in %s; starting at round 0",
                   checkpointer.directory)
    return checkpointer, None
  if not resume:
    # On each refusal the caller never receives the checkpointer, so it is
    # closed here and the folder's lock released.
    checkpointer.close()
    raise CheckpointError(
        f"checkpoint_dir {checkpointer.directory} already holds checkpoints "
        f"(rounds {checkpointer.all_rounds()}): pass resume=True to continue "
        "that run, or use an empty folder")
  try:
    snapshot = checkpointer.restore(template_state, template_run_key)
  except CheckpointError:
    checkpointer.close()
    raise
  _log.info("resume: round %d from %s", snapshot.round,
            checkpointer.directory)
  return checkpointer, snapshot


def held_rounds(root: str) -> dict[str, list[int]]:
  """The run checkpoint folders under ``root`` (``root`` itself, or a
  member's below it) that hold checkpoints: folder -> its rounds (the
  numbered step folders). {} where ``root`` is absent or holds none; read
  from the names only, nothing is opened."""
  found = {}
  for folder, names, _ in os.walk(root):
    rounds = sorted(int(name) for name in names if name.isdigit())
    if rounds:
      found[folder] = rounds
    # Numbered folders are orbax's steps: counted by name, never entered (a
    # member's checkpoint folder is never inside a step).
    names[:] = [name for name in names if not name.isdigit()]
  return found
