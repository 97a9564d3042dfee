"""The command line shared by the ``experiments/<paper>/run.py`` scripts.

Part of ``fedjax_agg.experiment`` (its docstring describes the config).
"""

import argparse
import ast
import os
from typing import Any, Optional

from fedjax_agg import distributed
from fedjax_agg.experiment._data import load_config
from fedjax_agg.experiment._data import override


def script_parser(description: str) -> argparse.ArgumentParser:
  """The flags every ``experiments/<paper>/run.py`` shares.

  ``--config`` (a config file, cwd- or script-relative), ``--out`` (default
  ``results/<config name>`` beside the script), repeated ``--set key=value``
  overrides (values are Python literals, keys dotted as in ``override``),
  ``--full`` (run ``<name>_full.json``, the paper's scale) and
  ``--algorithms`` (a comma-separated subset), ``--vmap-seeds`` (each
  algorithm's seeds as one vmapped sweep), ``--cpu-devices`` (XLA CPU
  devices to split the host into; default one per core, the fast layout on
  CPU; ``script_config`` applies it before JAX starts). A script may add its own
  flags before parsing; ``script_config`` turns the parsed flags into
  what to run.
  """
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--config", required=True,
                      help="configs/<name>.json (relative to the script)")
  parser.add_argument("--out", default=None,
                      help="output folder (default results/<config name>)")
  parser.add_argument("--set", action="append", default=[],
                      help="key=value override, e.g. train.rounds=3")
  parser.add_argument("--full", action="store_true",
                      help="run the paper-scale <name>_full.json")
  parser.add_argument("--algorithms", default=None,
                      help="comma-separated subset of the algorithms")
  parser.add_argument("--vmap-seeds", action="store_true",
                      help="run each algorithm's seeds as one vmapped sweep")
  parser.add_argument("--cpu-devices", type=int, default=None,
                      help="split the CPU into this many XLA devices before "
                      "JAX starts (default: one per available core; 1 opts "
                      "out; an XLA_FLAGS host device count wins)")
  return parser


def config_path(path: str, full: bool, script_dir: str) -> str:
  """Resolves ``path`` (as given, else under ``script_dir``); with ``full``
  the ``<name>_full.json`` beside it. Raises ValueError naming --config."""
  if full and not path.endswith("_full.json"):
    path = path[:-len(".json")] + "_full.json"
  for candidate in (path, os.path.join(script_dir, path)):
    if os.path.exists(candidate):
      return candidate
  raise ValueError(f"--config: no file {path!r} (also looked in "
                   f"{script_dir})")


def parse_sets(pairs) -> dict[str, Any]:
  """["train.rounds=3", "seeds=[0]"] -> {"train.rounds": 3, "seeds": [0]}.

  Values are Python literals; anything else is kept as a string.
  """
  out = {}
  for pair in pairs or ():
    if "=" not in pair:
      raise ValueError(f"--set expects key=value, got {pair!r}")
    key, value = (part.strip() for part in pair.split("=", 1))
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def script_config(args: argparse.Namespace, script_dir: str
                  ) -> tuple[dict, str, Optional[list[str]]]:
  """-> (config with the overrides applied, output folder, algorithms or
  None for all) of flags parsed by ``script_parser``.

  Splits the CPU into ``--cpu-devices`` XLA devices first (default one
  per core), so call it before anything starts JAX.
  """
  cpu_devices = getattr(args, "cpu_devices", None)
  try:
    if cpu_devices is None:
      distributed.use_all_cores()
    else:
      distributed.use_cpu_devices(cpu_devices)
  except (ValueError, RuntimeError) as error:
    raise ValueError(f"--cpu-devices: {error}") from None
  path = config_path(args.config, args.full, script_dir)
  config = override(load_config(path), parse_sets(args.set))
  if getattr(args, "vmap_seeds", False):
    config["vmap_seeds"] = True
  out_dir = args.out or os.path.join(
      script_dir, "results", os.path.splitext(os.path.basename(path))[0])
  names = args.algorithms.split(",") if args.algorithms else None
  if names:
    unknown = sorted(set(names) - set(config["algorithms"]))
    if unknown:
      raise ValueError(f"--algorithms: {unknown} not in the config's "
                       f"algorithms {sorted(config['algorithms'])}")
  return config, out_dir, names
