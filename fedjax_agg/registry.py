"""One registry idiom for every family of named components.

Aggregators, local objectives, models, partitions and datasets are each a
``Registry``: name -> factory. ``build(name, **kwargs)`` checks the name
(the message lists the accepted ones), passes the *context* arguments a
factory declares (for example ``num_clients`` for rules that keep
per-client state) and refuses unknown keyword arguments with the factory's
accepted ones. ``describe`` gives each factory's arguments and defaults, as
``python -m fedjax_agg --list`` prints them.

A user's component runs everywhere a built-in one does: ``register(name,
factory)`` adds it by name (for Python, ``run_config`` and configs built in
the same process), and a name of the form ``module:factory`` (configs, the
command line) imports ``factory`` from ``module`` and registers it under
that name the first time it is asked for. A registry may check what is
registered (the aggregators run the conformance kit, ``testing``).

A config is data: checking or running one never imports or calls code the
user did not choose. A ``module:factory`` name is resolved only

* when its module (or a package above it) was allowed by the user --
  ``allow_imports`` here, ``allowing_imports`` for one block,
  ``experiment.run_config(..., allow_imports=[...])`` or
  ``--allow-import MODULE`` on the command line; a config cannot allow
  anything itself -- and
* when the object it names is a factory of the registry's kind: declared
  with ``@declare(kind)`` (e.g. ``@registry.declare("aggregator")``) or
  already registered in that registry (its module called ``register``).

Anything else is refused by name before the module is imported (an
unallowed module) or before the object is called (an undeclared one):
``os:system`` or ``shutil:rmtree`` in a config run nothing.
"""

import contextlib
import importlib
import inspect
import re
import threading
from typing import (Any, Callable, Iterable, Iterator, Mapping, NamedTuple,
                    Optional, Sequence)

__all__ = ["ArgumentError", "ArgumentTypeError", "Capabilities", "KINDS",
           "Names", "Registry", "allow_imports", "allowed_imports",
           "allowing_imports", "argument", "declare", "names_of"]

# Only a bare name after the colon, no attribute path: what is reached is one
# of the module's own top-level names, never an attribute of one.
_IMPORT_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

KINDS = ("aggregator", "objective", "client", "attack", "model",
         "partition", "dataset", "codec", "staleness", "availability",
         "profiles")
"""The kinds a factory can be declared as (``declare``), one per
registry."""

ADAPTERS = ("no", "also", "only")


class ArgumentError(ValueError):
  """An entry's argument refused by its ``Capabilities.check_arguments``:
  ``key`` is where it is, relative to the algorithm's section of a
  description (e.g. "client_args.ranks[3]", or "objective"); the message
  starts with ``key``, so the description only puts its own path before
  both."""

  def __init__(self, key: str, message: str):
    super().__init__(message)
    self.key = key


class ArgumentTypeError(ArgumentError, TypeError):
  """An ``ArgumentError`` for a value of the wrong kind."""


def argument(key: str, check: Callable[..., None], *args, **kwargs) -> None:
  """Runs ``check(key, *args, **kwargs)`` (one of ``fedjax_agg.checks``),
  re-raising its refusal as an ``ArgumentError`` at ``key``."""
  try:
    check(key, *args, **kwargs)
  except TypeError as error:
    raise ArgumentTypeError(key, str(error)) from None
  except ValueError as error:
    raise ArgumentError(key, str(error)) from None


class Capabilities(NamedTuple):
  """What a registered entry needs and implies, declared with it (its
  registry line, or ``register(..., capabilities=...)``); the spec, the
  command line and the run's checks read these, never a table of names.

  Attributes:
    private: a differentially private rule (the run accounts its privacy;
      ``privacy`` settings need one).
    adapters: "no": it reads the full model; "also": it may aggregate
      LoRA adapters too (``models.lora``); "only": it is defined for
      adapters only.
    model_options: the ``models.lora.lora`` options its adapters need
      (e.g. FFA-LoRA's ``{"freeze_a": True}``).
    pairs_with: for a client side, ``(rule, shared argument)``: the rule it
      needs and the argument both must take alike (FedDyn's ``alpha``).
    personal: a client side that keeps personal models (personalised
      evaluation needs one).
    check_arguments: ``check(arguments, run)``: the entry's checks of its
      arguments against what the run fixes, when the description is made
      (before anything is read or written); ``run`` holds
      ``num_clients`` (the federation's N), ``rank`` (the adapters'
      rank, or None) and ``objective`` (the local objective's name). It
      raises ``ArgumentError`` naming the key (HetLoRA's ranks: one per
      client id, each at most the adapters' rank).
    own_objective: a client side that sets its own local objective (the
      loss plus its own terms: SCAFFOLD, FedDyn, APFL); the algorithm's
      ``objective`` must stay the plain one.
    tasks: for an attack, the data tasks it is defined for (a backdoor
      relabels classes: "classification"); None: every task.
    eval_sets: for an attack, ``eval_sets(test_x, test_y, **attack_args)``
      -> the extra scored test sets its success is measured on (a
      backdoor's triggered set); None: none.
  """
  private: bool = False
  adapters: str = "no"
  model_options: Mapping[str, Any] = {}
  pairs_with: Optional[tuple[str, str]] = None
  personal: bool = False
  check_arguments: Optional[Callable[[Mapping, Mapping], None]] = None
  own_objective: bool = False
  tasks: Optional[tuple[str, ...]] = None
  eval_sets: Optional[Callable[..., tuple]] = None

  def checked(self, name: str) -> "Capabilities":
    """``self``, refused (naming ``name``) where a field has the wrong
    kind."""
    for field in ("private", "personal", "own_objective"):
      if not isinstance(getattr(self, field), bool):
        raise TypeError(f"{name}: capabilities.{field} must be a bool, got "
                        f"{getattr(self, field)!r}")
    if self.adapters not in ADAPTERS:
      raise ValueError(f"{name}: capabilities.adapters must be one of "
                       f"{ADAPTERS}, got {self.adapters!r}")
    if not isinstance(self.model_options, Mapping) or not all(
        isinstance(k, str) for k in self.model_options):
      raise TypeError(f"{name}: capabilities.model_options must map option "
                      f"names to values, got {self.model_options!r}")
    if self.pairs_with is not None and not (
        isinstance(self.pairs_with, tuple) and len(self.pairs_with) == 2
        and all(isinstance(x, str) for x in self.pairs_with)):
      raise TypeError(f"{name}: capabilities.pairs_with must be (rule, "
                      f"argument), got {self.pairs_with!r}")
    for field in ("check_arguments", "eval_sets"):
      value = getattr(self, field)
      if value is not None and not callable(value):
        raise TypeError(f"{name}: capabilities.{field} must be callable, "
                        f"got {value!r}")
    if self.tasks is not None and not (
        isinstance(self.tasks, tuple) and self.tasks
        and all(isinstance(x, str) for x in self.tasks)):
      raise TypeError(f"{name}: capabilities.tasks must be a non-empty "
                      f"tuple of task names, got {self.tasks!r}")
    return self


_DECLARED = "__fedjax_agg_kinds__"
_LOCK = threading.Lock()
_ALLOWED: set[str] = set()  # modules the user allowed for the process
_BY_KIND: dict[str, "Registry"] = {}  # kind -> its first registry
# A list, not a set: nested blocks may allow the same module, and each block's
# exit removes only its own entry.
_SCOPED: list[str] = []  # modules allowed inside ``allowing_imports``


def declare(*kinds: str) -> Callable[[Callable[..., Any]],
                                     Callable[..., Any]]:
  """Marks a factory as one of ``kinds`` (``KINDS``), so that a
  ``module:factory`` name may resolve to it once its module is allowed.

  Example::

    @registry.declare("aggregator")
    def capped_fedavg(cap: float = 1.0): ...
  """
  bad = [kind for kind in kinds if kind not in KINDS]
  if not kinds or bad:
    raise ValueError(f"kinds must be one or more of {list(KINDS)}, got "
                     f"{list(kinds)!r}")

  def mark(factory):
    if not callable(factory):
      raise TypeError(f"declare: the factory must be callable, got "
                      f"{type(factory).__name__}")
    setattr(factory, _DECLARED,
            frozenset(getattr(factory, _DECLARED, ())) | frozenset(kinds))
    return factory
  return mark


def _modules(modules) -> list[str]:
  if isinstance(modules, str):
    modules = [modules]
  if modules is None:
    return []
  try:
    modules = list(modules)
  except TypeError:
    raise TypeError(f"allow_imports must be module names (strings), got "
                    f"{type(modules).__name__}") from None
  for module in modules:
    if not isinstance(module, str) or not _MODULE_NAME.match(module):
      raise ValueError(f"allow_imports: {module!r} is not a module name "
                       "(dotted Python identifiers, e.g. my_rules or "
                       "lab.rules)")
  return modules


def allow_imports(modules: Iterable[str]) -> None:
  """Allows ``module:factory`` names from ``modules`` (and their
  sub-modules) for the rest of the process."""
  modules = _modules(modules)
  with _LOCK:
    _ALLOWED.update(modules)


def allowing_imports(modules: Optional[Iterable[str]]
                     ) -> contextlib.AbstractContextManager:
  """Allows ``module:factory`` names from ``modules`` inside the block
  (what ``run_config(allow_imports=...)`` and ``--allow-import`` do); a
  bad module name is refused here, before the block."""
  return _allowing(_modules(modules))


@contextlib.contextmanager
def _allowing(modules: list[str]):
  with _LOCK:
    _SCOPED.extend(modules)
  try:
    yield
  finally:
    with _LOCK:
      for module in modules:
        _SCOPED.remove(module)


def allowed_imports() -> tuple[str, ...]:
  """The modules allowed now (process-wide and in open blocks), sorted."""
  with _LOCK:
    return tuple(sorted(_ALLOWED | set(_SCOPED)))


def _is_allowed(module_name: str) -> bool:
  parts = module_name.split(".")
  allowed = set(allowed_imports())
  # Prefixes by dotted component, not by string: allowing "lab" allows
  # "lab.rules" but never "labx".
  return any(".".join(parts[:i]) in allowed for i in range(1, len(parts) + 1))


class Names(tuple):
  """A registry's names, which also hold every ``module:factory`` name
  (resolved, and refused by name if it cannot be, by ``resolve`` or when
  it is built)."""

  @staticmethod
  def resolve(name: str) -> Any:
    """Resolves ``name`` to its factory (the registry's ``factory``, set
    on each instance), raising ValueError naming what is wrong."""
    del name

  def __contains__(self, name) -> bool:
    # A ``module:factory`` name is a member by its form alone: checking a config
    # must not import anything; whether it resolves is decided when it is built,
    # under the allow list.
    return super().__contains__(name) or (
        isinstance(name, str) and bool(_IMPORT_NAME.match(name)))


def names_of(kind: str) -> Names:
  """The names of the library's registry of ``kind`` (the first made of
  that kind, e.g. ``compression.CODECS`` for "codec"): for a setting
  whose choices a lower layer declares (``config.Systems.codec``).

  Raises:
    ValueError: no registry of that kind has been made.
  """
  if kind not in _BY_KIND:
    raise ValueError(f"no registry of kind {kind!r}; made: "
                     f"{sorted(_BY_KIND)}")
  return _BY_KIND[kind].names


class Registry(Mapping[str, Callable[..., Any]]):
  """A mapping name -> factory with checked building; built-in entries are
  fixed, a user's are added with ``register``.

  Args:
    kind: what the entries are ("aggregator", "objective", ...), used in
      messages.
    entries: name -> factory.
    context: argument names that callers may always pass to ``build`` and
      that reach only the factories declaring them.
    check: ``(name, factory, **options) -> None``, raising ValueError for
      a factory ``register`` must refuse.
  """

  def __init__(self, kind: str, entries: Mapping[str, Callable[..., Any]],
               context: Sequence[str] = (),
               check: Optional[Callable[[str, Callable[..., Any]],
                                        None]] = None,
               declared_as: Optional[str] = None,
               capabilities: Optional[Mapping[str, Capabilities]] = None):
    self.kind = kind
    unknown = sorted(set(capabilities or {}) - set(entries))
    if unknown:
      raise ValueError(f"capabilities of unknown {kind}s {unknown}")
    self._capabilities = {name: caps.checked(f"{kind} {name!r}")
                          for name, caps in (capabilities or {}).items()}
    self.declared_as = kind if declared_as is None else declared_as
    if self.declared_as not in KINDS:
      raise ValueError(f"declared_as must be one of {KINDS}, got "
                       f"{self.declared_as!r}")
    self._entries = dict(entries)
    self._builtin = frozenset(entries)
    self.context = tuple(context)
    self._check = check
    # The first registry made of a kind is the one ``names_of`` answers for;
    # a later one of that kind (a test's copy) does not replace it.
    _BY_KIND.setdefault(kind, self)

  def register(self, name: str, factory: Callable[..., Any], *,
               replace: bool = False,
               capabilities: Optional[Capabilities] = None,
               **check_options) -> Callable[..., Any]:
    """Adds ``factory`` as ``name`` (returns it) with its
    ``capabilities`` (default: none); ``check_options`` go to the
    registry's check (e.g. the aggregators' ``symmetric``)."""
    if capabilities is not None and not isinstance(capabilities,
                                                   Capabilities):
      raise TypeError(f"capabilities must be a registry.Capabilities, got "
                      f"{type(capabilities).__name__}")
    capabilities = (capabilities or Capabilities()).checked(
        f"{self.kind} {name!r}")
    if not isinstance(name, str) or not name or name != name.strip():
      raise TypeError(f"name must be a non-empty string, got {name!r}")
    if not callable(factory):
      raise TypeError(f"factory must be callable, got "
                      f"{type(factory).__name__}")
    # Built-in names are fixed: a config naming "FedAvg" always means the
    # library's rule, so saved runs and descriptions keep their meaning.
    if name in self._builtin:
      raise ValueError(f"{self.kind} {name!r} is built in; register yours "
                       "under another name")
    if name in self._entries and not replace:
      raise ValueError(f"{self.kind} {name!r} is already registered; pass "
                       "replace=True to replace a registration of your own")
    if self._check is not None:
      self._check(name, factory, **check_options)
    elif check_options:
      raise TypeError(f"the {self.kind} registry checks nothing; got "
                      f"{sorted(check_options)}")
    self._entries[name] = factory
    self._capabilities[name] = capabilities
    return factory

  def capabilities(self, name: str) -> Capabilities:
    """What ``name`` declared it needs and implies (``Capabilities``);
    ValueError naming the choices for an unknown name."""
    self.factory(name)
    return self._capabilities.get(name, Capabilities())

  def having(self, **wanted) -> tuple[str, ...]:
    """The names whose capabilities have the ``wanted`` values, e.g.
    ``having(adapters="only")``, in registration order."""
    bad = sorted(set(wanted) - set(Capabilities._fields))
    if bad:
      raise TypeError(f"having: unknown capabilities {bad}; known: "
                      f"{list(Capabilities._fields)}")
    return tuple(name for name in self._entries if all(
        getattr(self._capabilities.get(name, Capabilities()), key) == value
        for key, value in wanted.items()))

  def _imported(self, name: str) -> Callable[..., Any]:
    """Imports and registers ``module:factory`` where the user allowed the
    module and the object is declared as this kind (module docstring)."""
    module_name, attribute = name.split(":")
    # Refused before the import: importing a module runs its top-level code,
    # which is exactly what a config alone must never cause.
    if not _is_allowed(module_name):
      raise ValueError(
          f"{self.kind} {name!r}: module {module_name!r} is not allowed; a "
          "config never imports code by itself. Opt in with --allow-import "
          f"{module_name} (command line) or allow_imports=[{module_name!r}] "
          "(experiment.run_config, fedjax_agg.registry.allow_imports)")
    try:
      module = importlib.import_module(module_name)
    except ImportError as error:
      raise ValueError(f"{self.kind} {name!r}: cannot import module "
                       f"{module_name!r} ({error})") from None
    factory = getattr(module, attribute, None)
    if factory is None:
      raise ValueError(f"{self.kind} {name!r}: module {module_name!r} has "
                       f"no {attribute!r}")
    # Refused before the call: an allowed module may still hold callables that
    # are not factories (``os.system``-like helpers); only a declared one, or
    # one its module registered itself, is built.
    declared = getattr(factory, _DECLARED, None)
    if not ((isinstance(declared, frozenset) and self.declared_as in declared)
            or any(factory is entry for entry in self._entries.values())):
      raise ValueError(
          f"{self.kind} {name!r}: {module_name}.{attribute} is not declared "
          f"as a factory of kind {self.declared_as!r}; decorate it with "
          f"@fedjax_agg.registry.declare({self.declared_as!r}) or register "
          "it in its module")
    return self.register(name, factory)

  def __getitem__(self, name: str) -> Callable[..., Any]:
    return self._entries[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  @property
  def names(self) -> Names:
    names = Names(self._entries)
    names.resolve = self.factory
    return names

  def factory(self, name: str) -> Callable[..., Any]:
    """The factory registered as ``name`` (ValueError naming the choices);
    a ``module:factory`` name is imported and registered first."""
    if isinstance(name, str) and name not in self._entries and (
        _IMPORT_NAME.match(name)):
      return self._imported(name)
    if not isinstance(name, str) or name not in self._entries:
      raise ValueError(f"{self.kind} must be one of {sorted(self._entries)}, "
                       f"got {name!r}")
    return self._entries[name]

  def parameters(self, name: str) -> dict[str, inspect.Parameter]:
    """The keyword arguments of ``name``'s factory."""
    signature = inspect.signature(self.factory(name))
    return {p.name: p for p in signature.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}

  def takes(self, name: str, argument: str) -> bool:
    """Whether ``name``'s factory declares ``argument``."""
    return argument in self.parameters(name)

  def check_arguments(self, name: str, arguments: Mapping[str, Any],
                      where: Optional[str] = None) -> None:
    """Raises TypeError for keys of ``arguments`` the factory does not take.

    Context arguments are allowed whatever the factory declares.
    """
    factory = self.factory(name)
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in
                      inspect.signature(factory).parameters.values())
    # A factory taking ``**kwargs`` forwards its arguments; it checks them
    # itself.
    if accepts_any:
      return
    known = self.parameters(name)
    unknown = sorted(set(arguments) - set(known) - set(self.context))
    if unknown:
      where = where or f"{self.kind} {name!r}"
      allowed = sorted(set(known) - set(self.context))
      raise TypeError(f"{where}: unknown argument(s) {unknown}; "
                      f"{name!r} takes {allowed}")

  def build(self, name: str, **kwargs) -> Any:
    """Calls ``name``'s factory with ``kwargs``.

    Context arguments (``self.context``) the factory does not declare are
    dropped; one it declares without a default must be given (ValueError
    naming it).
    """
    factory = self.factory(name)
    self.check_arguments(name, kwargs)
    known = self.parameters(name)
    for arg in self.context:
      # Callers pass the context (e.g. ``num_clients``) to every entry without
      # knowing which ones use it; it reaches only the factories that declare
      # it.
      if arg not in known:
        kwargs.pop(arg, None)
      elif (kwargs.get(arg) is None
            and known[arg].default is inspect.Parameter.empty):
        raise ValueError(f"{self.kind} {name!r} needs {arg} (pass {arg}=...)")
    return factory(**kwargs)

  def describe(self, name: str) -> dict[str, Any]:
    """Argument name -> default (``"<required>"`` where there is none)."""
    return {arg: ("<required>" if p.default is inspect.Parameter.empty
                  else p.default)
            for arg, p in self.parameters(name).items()}
