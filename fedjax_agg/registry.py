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
"""

import importlib
import inspect
import re
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

__all__ = ["Names", "Registry"]

_IMPORT_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class Names(tuple):
  """A registry's names, which also hold every ``module:factory`` name
  (resolved, and refused by name if it cannot be, when it is built)."""

  def __contains__(self, name) -> bool:
    return super().__contains__(name) or (
        isinstance(name, str) and bool(_IMPORT_NAME.match(name)))


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
                                        None]] = None):
    self.kind = kind
    self._entries = dict(entries)
    self._builtin = frozenset(entries)
    self.context = tuple(context)
    self._check = check

  def register(self, name: str, factory: Callable[..., Any], *,
               replace: bool = False, **check_options) -> Callable[..., Any]:
    """Adds ``factory`` as ``name`` (returns it); ``check_options`` go to
    the registry's check (e.g. the aggregators' ``symmetric``)."""
    if not isinstance(name, str) or not name or name != name.strip():
      raise TypeError(f"name must be a non-empty string, got {name!r}")
    if not callable(factory):
      raise TypeError(f"factory must be callable, got "
                      f"{type(factory).__name__}")
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
    return factory

  def _imported(self, name: str) -> Callable[..., Any]:
    module_name, attribute = name.split(":")
    try:
      module = importlib.import_module(module_name)
    except ImportError as error:
      raise ValueError(f"{self.kind} {name!r}: cannot import module "
                       f"{module_name!r} ({error})") from None
    factory = getattr(module, attribute, None)
    if factory is None:
      raise ValueError(f"{self.kind} {name!r}: module {module_name!r} has "
                       f"no {attribute!r}")
    return self.register(name, factory)

  def __getitem__(self, name: str) -> Callable[..., Any]:
    return self._entries[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  @property
  def names(self) -> Names:
    return Names(self._entries)

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
