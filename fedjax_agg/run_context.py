"""Rules built from what a run fixes: one mechanism for every entry point.

Some rules are functions of settings that belong to the run rather than to
the rule: q-FFL's Lipschitz estimate is 1 / the client learning rate,
FedNova normalises by the local solver's momentum and proximal term,
FedDyn's h divides by the federation's size and must share alpha with its
client side, Bulyan and DP-FTRL are sized for the cohort, DP-FedAvg under
Poisson sampling divides by q N. A rule's factory declares these arguments
with ``derived_from_run``; the run (``runner.execute``, whatever built the
rule: Python, a JSON config or the command line) builds a ``RunContext``
and calls ``bind`` before the first round:

* an argument the caller left out takes the run's value (a factory that
  cannot be built without it, such as ``fedadp()`` without
  ``num_clients``, gives a rule that only a run can use);
* an argument the caller gave must equal the run's, else a ``ValueError``
  names it (``qffl(learning_rate=0.1)`` in a run whose clients train at
  0.05 is refused, not run with the wrong L);
* a client side's shared hyperparameters (``LocalUpdate.shared``) must be
  read by the rule, so FedDyn's client runs only with FedDyn's rule.

Traced values (a sweep's grid points) are taken as they are: the sweep
builds the rule and the training from the same point.
"""

import functools
import inspect
from typing import Any, Callable, Optional

import numpy as np

from fedjax_agg import checks
from fedjax_agg.types import Aggregator, RunContext

__all__ = ["RUN_SETTINGS", "bind", "derived_from_run"]

RUN_SETTINGS = {
    "learning_rate": "the client learning rate",
    "num_clients": "the federation's number of clients",
    "cohort_size": "the number of clients drawn per round",
    "expected_clients": "the expected cohort size q N of Poisson sampling",
    "momentum": "the local SGD momentum",
    "proximal_mu": "the local objective's FedProx mu",
}
"""``RunContext`` fields a factory argument may be derived from, with what
each is in the run (for the refusals)."""


def _same(given, run_value) -> bool:
  # A traced value has no number to compare; in a sweep the rule and the
  # training are built from the same grid point, so they agree by design.
  if checks.is_traced(given) or checks.is_traced(run_value):
    return True
  if isinstance(given, (int, float, np.number)) and isinstance(
      run_value, (int, float, np.number)):
    # Relative tolerance: a value that went through float32 (a grid point, a
    # JSON config) must still equal the run's float64 one.
    return bool(np.isclose(float(given), float(run_value), rtol=1e-6,
                           atol=0.0))
  return given == run_value


def derived_from_run(check: Optional[Callable[[Aggregator, RunContext, dict],
                                              None]] = None,
                     **arguments: str) -> Callable:
  """Declares which arguments of a rule's factory the run fixes.

  Args:
    check: optional ``check(rule, context, given)`` for what the run must
      satisfy beyond equal values (e.g. a client side it needs); raises a
      ``ValueError`` naming the argument.
    **arguments: factory argument -> ``RunContext`` field it equals
      (a key of ``RUN_SETTINGS``; "client_side:<name>" for an entry of
      the client side's ``shared``).

  Returns:
    A decorator: the factory's rules carry ``from_run``.
  """
  for field in arguments.values():
    if field not in RUN_SETTINGS and not field.startswith("client_side:"):
      raise ValueError(f"unknown run setting {field!r}")

  reads = frozenset(field.split(":", 1)[1] for field in arguments.values()
                    if field.startswith("client_side:"))

  def decorate(factory):
    signature = inspect.signature(factory)

    @functools.wraps(factory)
    def build(*args, **kwargs):
      given = signature.bind_partial(*args, **kwargs).arguments
      missing = [name for name in arguments if name not in given
                 and signature.parameters[name].default is
                 inspect.Parameter.empty]
      if missing:
        # Built by the run (``from_run``); called before, it says what
        # it lacks rather than failing on a missing argument.
        def unbound(*_, **__):
          raise ValueError(
              f"{factory.__name__}: {', '.join(missing)} not given; a run "
              "(simulation.run, a config, the command line) fills "
              f"{'them' if len(missing) > 1 else 'it'} in, or pass "
              f"{', '.join(missing)}=...")
        rule = Aggregator(unbound, unbound)
      else:
        signature.bind(*args, **kwargs)  # TypeError for a bad call
        rule = factory(*args, **kwargs)

      def from_run(context: RunContext) -> Aggregator:
        updates = {}
        for name, field in arguments.items():
          run_value = _run_value(context, field)
          if run_value is None:
            continue
          if name in given:
            if not _same(given[name], run_value):
              raise ValueError(
                  f"{factory.__name__}: {name}={given[name]!r} differs from "
                  f"{_describe(field)} of the run ({run_value!r}); leave "
                  f"{name} out to take the run's, or make them equal")
          else:
            updates[name] = run_value
        if check is not None:
          check(decorated, context, {**given, **updates})
        if not updates:
          return decorated
        # Rebuilt through ``build``: the factory's own checks run on the run's
        # values, and the new rule's ``from_run`` finds them given and equal.
        return build(*args, **{**kwargs, **updates})
      # Read by ``bind``: which of the client side's shared settings this rule
      # consumes.
      from_run.reads = reads
      decorated = rule._replace(from_run=from_run)
      return decorated
    build.run_arguments = dict(arguments)
    return build
  return decorate


def _run_value(context: RunContext, field: str) -> Any:
  if field.startswith("client_side:"):
    return context.client_side.get(field.split(":", 1)[1])
  return getattr(context, field)


def _describe(field: str) -> str:
  if field.startswith("client_side:"):
    return f"the client side's {field.split(':', 1)[1]}"
  return RUN_SETTINGS[field]


def bind(rule: Aggregator, context: RunContext) -> Aggregator:
  """``rule`` with what the run fixes (see the module docstring).

  Raises:
    ValueError: naming an argument the run contradicts, or a client side
      whose shared settings the rule does not read.
  """
  bound = rule if rule.from_run is None else rule.from_run(context)
  read = set(getattr(bound.from_run, "reads", ()))
  unread = sorted(set(context.client_side) - read)
  if unread:
    raise ValueError(
        f"local_update: the client side shares {unread} with its server "
        f"rule, which this aggregator does not read; pair the client side "
        f"with its own rule (e.g. clients.feddyn with aggregators.feddyn)")
  return bound
