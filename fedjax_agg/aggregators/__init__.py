"""Server-side aggregation rules and their registry (name -> factory).

Building a rule. ``get(name, num_clients=N, **kwargs)`` is the one way the
CLI, the simulation and the tests build a registered rule. Rules that keep
per-client state (stacked [N, ...], indexed by client id: FedAdp,
FedLayerWise) declare a keyword-only ``num_clients`` (the federation size
N) with no default, since a wrong N would silently mis-index the state;
``get`` passes ``num_clients`` only to factories that declare it, so
callers may always pass it.

The evaluated model. After a round, the model to evaluate is
``eval_params(new_state, new_global_params)``: the state's ``eval_params``
attribute when the rule keeps one (FedNNNN keeps its average-aggregated
model there while broadcasting the normalized one), else the broadcast
model. Metrics never hold params.

Server optimizers. ``with_server_optimizer(aggregator, transformation)``
feeds any rule's output through an optax transformation on the
pseudo-gradient w_t - output (``fedopt``).

Memory. Rules that are a sum over clients carry a ``StreamingForm``
(``Aggregator.stream``): FedAvg, FedNNNN / Norm-Norm / Momentum and every
server optimizer over one of them (FedOpt, FedAvgM, FedAdam, FedYogi,
FedAdagrad). ``simulation.make_round_fn`` then aggregates on the fly and a
round holds ``clients_per_step`` client models, whatever K. The other rules
need all K trained models at once, so their round holds the stacked
[K, ...] client params (K x the model size, plus the rule's own
temporaries of the same order): FedAdp and FedLayerWise (each client's
angle to the weighted mean update, known only after every client), the
coordinate-wise median and trimmed mean (a sort over the K clients per
coordinate) and FedDRL (its agent weights the clients from all their
post-training losses, so the models wait for the last client).
Their local training is still chunked, so only the stacked models grow
with K; bound K by memory / (model size) for them.

Names. ``aggregators.fedadp`` etc. are the factories (as ``optax.adam``);
they shadow their modules, so import a module's other members by full path:
``from fedjax_agg.aggregators.fedadp import FedAdpState``.
"""

import inspect

from fedjax_agg.aggregators.fedadp import fedadp
from fedjax_agg.aggregators.fedavg import fedavg
from fedjax_agg.aggregators.feddrl import feddrl
from fedjax_agg.aggregators.fedlayerwise import fedlayerwise
from fedjax_agg.aggregators.fedmedian import fedmedian
from fedjax_agg.aggregators.fednnnn import fednnnn
from fedjax_agg.aggregators.fednnnn import momentum
from fedjax_agg.aggregators.fednnnn import norm_norm
from fedjax_agg.aggregators.fedopt import fedadagrad
from fedjax_agg.aggregators.fedopt import fedadam
from fedjax_agg.aggregators.fedopt import fedavgm
from fedjax_agg.aggregators.fedopt import fedopt
from fedjax_agg.aggregators.fedopt import fedyogi
from fedjax_agg.aggregators.fedopt import with_server_optimizer
from fedjax_agg.aggregators.trimmed_mean import trimmed_mean

__all__ = [
    "REGISTRY", "eval_params", "fedadagrad", "fedadam", "fedadp", "fedavg",
    "fedavgm", "feddrl", "fedlayerwise", "fedmedian", "fednnnn", "fedopt",
    "fedyogi", "get", "momentum", "norm_norm", "takes_num_clients",
    "trimmed_mean", "with_server_optimizer",
]

# Every aggregator factory, by the name the CLI and the conformance suite use.
# Factories are called with keyword arguments only; each must have defaults
# for every argument except ``num_clients`` (see the module docstring), so
# ``get(name, num_clients=N)`` builds a working rule.
REGISTRY = {
    "fedavg": fedavg,
    "fedadp": fedadp,
    "fedlayerwise": fedlayerwise,
    "fednnnn": fednnnn,
    "norm_norm": norm_norm,
    "momentum": momentum,
    "fedopt": fedopt,
    "fedavgm": fedavgm,
    "fedadam": fedadam,
    "fedyogi": fedyogi,
    "fedadagrad": fedadagrad,
    "fedmedian": fedmedian,
    "trimmed_mean": trimmed_mean,
    "feddrl": feddrl,
}


def takes_num_clients(factory) -> bool:
  """Whether ``factory`` declares a ``num_clients`` argument."""
  return "num_clients" in inspect.signature(factory).parameters


def get(name: str, num_clients=None, **kwargs):
  """Builds the registered aggregator ``name`` with ``kwargs``.

  Args:
    name: a key of ``REGISTRY``.
    num_clients: N, the federation size; passed only to factories that
      declare it (required by those).
    **kwargs: the factory's other keyword arguments.
  """
  if name not in REGISTRY:
    raise ValueError(
        f"aggregator must be one of {sorted(REGISTRY)}, got {name!r}")
  factory = REGISTRY[name]
  if takes_num_clients(factory):
    if num_clients is None:
      raise ValueError(
          f"aggregator {name!r} keeps per-client state: pass num_clients "
          "(the federation size N)")
    kwargs["num_clients"] = num_clients
  return factory(**kwargs)


def eval_params(state, new_global_params):
  """The model to evaluate after a round (see the module docstring).

  Args:
    state: the rule's new state.
    new_global_params: the rule's new (broadcast) global params.
  """
  params = getattr(state, "eval_params", None)
  return new_global_params if params is None else params
