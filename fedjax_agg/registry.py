"""One registry idiom for every family of named components.

Aggregators, local objectives, models, partitions and datasets are each a
``Registry``: name -> factory. ``build(name, **kwargs)`` checks the name
(the message lists the accepted ones), passes the *context* arguments a
factory declares (for example ``num_clients`` for rules that keep
per-client state) and refuses unknown keyword arguments with the factory's
accepted ones. ``describe`` gives each factory's arguments and defaults, as
``python -m fedjax_agg --list`` prints them.
"""

import inspect
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

__all__ = ["Registry"]


class Registry(Mapping[str, Callable[..., Any]]):
  """An immutable mapping name -> factory with checked building.

  Args:
    kind: what the entries are ("aggregator", "objective", ...), used in
      messages.
    entries: name -> factory.
    context: argument names that callers may always pass to ``build`` and
      that reach only the factories declaring them.
  """

  def __init__(self, kind: str, entries: Mapping[str, Callable[..., Any]],
               context: Sequence[str] = ()):
    self.kind = kind
    self._entries = dict(entries)
    self.context = tuple(context)

  def __getitem__(self, name: str) -> Callable[..., Any]:
    return self._entries[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(self._entries)

  def factory(self, name: str) -> Callable[..., Any]:
    """The factory registered as ``name`` (ValueError naming the choices)."""
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
