"""A run setting declared once: its default, its command-line flags
(``Flag``), its value check and its config key.

The run objects (``config.LocalTraining``, ``Execution``, ``Evaluation``,
``Systems``, ``Privacy``, ``options.RunOptions``, ...) declare the fields
a description sets with ``spec_field``; the description's sections
(``fedjax_agg.spec``) are those objects, or for "train" a flat section
made of their declared fields, so the config keys, the command line,
``--help`` and ``config.json`` are read from the one declaration
(``spec.flags``), and the object checks each value where it is made
(``check_fields``)."""

import dataclasses
from typing import Any, Callable, NamedTuple, Optional
import warnings


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
               key: Optional[str] = None,
               config_default: Any = dataclasses.MISSING,
               sets: Optional[str] = None):
  """A field with its default, its command-line flags and its check.

  Args:
    default: the field's default (a dict or list: copied per object).
    *flag_list: the command-line flags that set it.
    check: ``check(name, value)``: the value's check, raising
      ``TypeError``/``ValueError`` naming ``name`` (as
      ``fedjax_agg.checks`` does). The object runs it when it is made
      (``check_fields``) and a description's section with its key path.
    key: the field's config key where it differs from the field's name
      (the flat "train" keys: ``LocalTraining.epochs`` is
      ``train.local_epochs``).
    config_default: the key's default in a config where the object's
      field has none (``RunOptions.num_rounds``: required in Python, 10
      in a config).
    sets: deprecated and ignored: a "train" key is a field declared on
      the object it configures.
  """
  if sets is not None:
    warnings.warn("spec_field(sets=...) is deprecated and ignored: declare "
                  "a train key on the object it configures", DeprecationWarning,
                  2)
  metadata = {"flags": tuple(flag_list), "check": check, "key": key,
              "config_default": config_default}
  # A mutable default becomes a factory of copies: objects never share one dict
  # or list (dataclasses refuse such a default anyway).
  if isinstance(default, (dict, list)):
    value = default
    return dataclasses.field(default_factory=lambda: type(value)(value),
                             metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def is_declared(field: dataclasses.Field) -> bool:
  """Whether ``field`` was declared with ``spec_field``."""
  return "flags" in field.metadata


def config_key(field: dataclasses.Field) -> str:
  """The config key of a declared field: its ``key``, else its name."""
  return field.metadata.get("key") or field.name


def config_default(field: dataclasses.Field) -> Any:
  """The default of a declared field's config key (MISSING: none)."""
  given = field.metadata.get("config_default", dataclasses.MISSING)
  if given is not dataclasses.MISSING:
    return given
  # A factory field's default is what its factory makes (a fresh copy).
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return field.default


def check_fields(obj) -> None:
  """Runs the declared check of every field of the dataclass ``obj`` on
  its value, naming the field (its object's own checks of two fields
  together come after)."""
  for field in dataclasses.fields(obj):
    check = field.metadata.get("check")
    if check is not None:
      check(field.name, getattr(obj, field.name))
