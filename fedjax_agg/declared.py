"""A run setting declared once: its default, its command-line flags
(``Flag``), its value check and the run object's field it sets.

The description's sections (``fedjax_agg.spec``) and the run objects that
are themselves a section (``config.Systems``) declare their fields with
``spec_field``; the command line, the config keys and ``--help`` are read
from those declarations (``spec.flags``)."""

import dataclasses
from typing import Any, Callable, NamedTuple, Optional


class Flag(NamedTuple):
  """How the command line sets a field.

  Attributes:
    name: the flag, e.g. "--lr".
    help: its help text.
    kind: "value" (the flag's value is the field's), "pairs" (repeatable
      NAME=VALUE, merged into the field's mapping), "switch" (given: True),
      "negate" (given: False, else "auto"), "seed" (one int: the list
      [seed]), "seeds" (comma-separated ints), "subkey" (sets the entry
      ``subkey`` of the field's mapping).
    type: the argparse type of the value (None: a string).
    choices: the names the value must be one of (None: any).
    preset: the command line's value when the flag is not given (None:
      the key is left out, so the spec's default holds).
    subkey: for kind "subkey".
  """
  name: str
  help: str
  kind: str = "value"
  type: Any = None
  choices: Any = None
  preset: Any = None
  subkey: Optional[str] = None


def spec_field(default: Any = dataclasses.MISSING, *flag_list: Flag,
               check: Optional[Callable[[str, Any], None]] = None,
               sets: Optional[str] = None):
  """A spec field with its default and its command-line flags.

  ``check(path, value)``: the field's value check (raises naming
  ``path``). ``sets``: the run object's field it sets, as
  "object.field" (e.g. "training.epochs"; ``TrainSpec.run_objects``).
  """
  metadata = {"flags": tuple(flag_list), "check": check, "sets": sets}
  if isinstance(default, (dict, list)):
    value = default
    return dataclasses.field(default_factory=lambda: type(value)(value),
                             metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)
