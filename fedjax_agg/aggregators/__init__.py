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
(``Aggregator.stream``): FedAvg, FedNova, FedDyn, FedNNNN / Norm-Norm /
Momentum, every
server optimizer over one of them (FedOpt, FedAvgM, FedAdam, FedYogi,
FedAdagrad), norm bounding, DP-FedAvg with a fixed clip norm and DP-FTRL
(clipping is per client; both draw their noise once the sum is complete).
``rounds.make_round_fn`` then aggregates on the fly and a round holds
``clients_per_step`` client models, whatever K. The other rules need all K
trained models at once, so their round holds the stacked [K, ...] client
params (K x the model size, plus the rule's own temporaries of the same
order): FedAdp and FedLayerWise (each client's angle to the weighted mean
update, known only after every client), the coordinate-wise median and
trimmed mean (a sort over the K clients per coordinate), Krum (distances
between every pair of clients: a [K, K] matrix accumulated leaf by leaf),
Bulyan (Krum's [K, K] matrix, then a sort over the K clients per
coordinate), the geometric median (Weiszfeld iterations over all K
updates), centered clipping (iterations around the previous aggregate),
DP-FedAvg with adaptive clipping (the clients clip with the state's clip
norm, which the streaming form does not see), FedDRL (its agent weights
the clients from all their post-training losses, so the models wait for
the last client) and q-FedAvg (a sum over clients in the paper, but scaled
by the cohort's largest loss, which one client's statistics cannot see),
and the rules on LoRA adapters (FedIT, FFA-LoRA, FLoRA, HetLoRA: a
client's adapters are small; FLoRA's carry its dense merged update).
Their local training is still chunked, so only the stacked
models grow with K; bound K by memory / (model size) for them.

Names. Every public name is exported once from this package: the factories
(``aggregators.fedadp``, as ``optax.adam``), their building blocks
(``aggregators.scale_by_reddi`` beside ``aggregators.fedadam``) and their
state types (``aggregators.FedAdpState``). The implementation modules are
private (``_fedadp.py``), so no factory shadows a module.
"""

import inspect
from typing import Optional

from fedjax_agg.aggregators._bulyan import bulyan
from fedjax_agg.aggregators._bulyan import BulyanState
from fedjax_agg.aggregators._centered_clipping import centered_clipping
from fedjax_agg.aggregators._centered_clipping import CenteredClippingState
from fedjax_agg.aggregators._dp_fedavg import dp_fedavg
from fedjax_agg.aggregators._dp_fedavg import DPFedAvgState
from fedjax_agg.aggregators._dp_ftrl import dp_ftrl
from fedjax_agg.aggregators._dp_ftrl import DPFTRLState
from fedjax_agg.aggregators._dp_ftrl import TreeAggregationNoise
from fedjax_agg.aggregators._fedacs import fedacs
from fedjax_agg.aggregators._fedacs import FedACSState
from fedjax_agg.aggregators._fedacs import select_top
from fedjax_agg.aggregators._fedadp import angle_weighting
from fedjax_agg.aggregators._fedadp import fedadp
from fedjax_agg.aggregators._fedadp import FedAdpState
from fedjax_agg.aggregators._fedadp import gompertz
from fedjax_agg.aggregators._fedavg import fedavg
from fedjax_agg.aggregators._fedavg import FedAvgState
from fedjax_agg.aggregators._feddyn import feddyn
from fedjax_agg.aggregators._feddyn import FedDynState
from fedjax_agg.aggregators._feddrl import AgentConfig
from fedjax_agg.aggregators._feddrl import AgentState
from fedjax_agg.aggregators._feddrl import feddrl
from fedjax_agg.aggregators._feddrl import FedDRLState
from fedjax_agg.aggregators._fedit import fedit
from fedjax_agg.aggregators._fedit import FedITState
from fedjax_agg.aggregators._ffa_lora import ffa_lora
from fedjax_agg.aggregators._ffa_lora import FFALoRAState
from fedjax_agg.aggregators._flora import flora
from fedjax_agg.aggregators._flora import FLoRAState
from fedjax_agg.aggregators._fedlayerwise import fedlayerwise
from fedjax_agg.aggregators._fedmedian import fedmedian
from fedjax_agg.aggregators._fedmedian import FedMedianState
from fedjax_agg.aggregators._fednnnn import fednnnn
from fedjax_agg.aggregators._fednnnn import FedNNNNState
from fedjax_agg.aggregators._fednnnn import momentum
from fedjax_agg.aggregators._fednnnn import norm_norm
from fedjax_agg.aggregators._fednova import fednova
from fedjax_agg.aggregators._fednova import FedNovaState
from fedjax_agg.aggregators._fedopt import fedadagrad
from fedjax_agg.aggregators._fedopt import fedadam
from fedjax_agg.aggregators._fedopt import fedavgm
from fedjax_agg.aggregators._fedopt import fedopt
from fedjax_agg.aggregators._fedopt import fedyogi
from fedjax_agg.aggregators._fedsgd import FedSGD
from fedjax_agg.aggregators._fedsgd import fedsgd
from fedjax_agg.aggregators._fedopt import scale_by_reddi
from fedjax_agg.aggregators._fedopt import ScaleByReddiState
from fedjax_agg.aggregators._geometric_median import geometric_median
from fedjax_agg.aggregators._geometric_median import GeometricMedianState
from fedjax_agg.aggregators._hetlora import hetlora
from fedjax_agg.aggregators._hetlora import HetLoRAState
from fedjax_agg.aggregators._krum import krum
from fedjax_agg.aggregators._krum import KrumState
from fedjax_agg.aggregators._norm_bounding import norm_bounding
from fedjax_agg.aggregators._norm_bounding import NormBoundingState
from fedjax_agg.aggregators._qffl import qffl
from fedjax_agg.aggregators._qffl import QFFLState
from fedjax_agg.aggregators._server_optimizer import ServerOptState
from fedjax_agg.aggregators._server_optimizer import with_server_optimizer
from fedjax_agg.aggregators._trimmed_mean import trimmed_mean
from fedjax_agg.aggregators._trimmed_mean import TrimmedMeanState
from fedjax_agg.registry import Capabilities
from fedjax_agg.registry import Registry

__all__ = [
    "ADAPTER_RULES", "AgentConfig", "AgentState", "BulyanState",
    "CenteredClippingState", "DPFTRLState", "DPFedAvgState", "FedACSState",
    "FedAdpState", "FedAvgState", "FedDRLState", "FedDynState", "FedITState",
    "FedMedianState", "FedNNNNState", "FedNovaState", "FedSGD",
    "FFALoRAState", "FLoRAState", "GeometricMedianState", "HetLoRAState",
    "KrumState", "NormBoundingState", "QFFLState", "REGISTRY",
    "ScaleByReddiState", "ServerOptState", "TreeAggregationNoise",
    "TrimmedMeanState", "angle_weighting", "bulyan", "centered_clipping",
    "dp_fedavg", "dp_ftrl", "eval_params", "fedacs", "fedadagrad",
    "fedadam", "fedadp", "fedavg", "fedavgm", "feddrl", "feddyn", "fedit",
    "ffa_lora", "flora", "hetlora", "fedlayerwise", "fedmedian", "fednnnn",
    "fednova", "fedopt", "fedsgd",
    "fedyogi", "geometric_median", "get", "gompertz", "krum", "momentum",
    "norm_bounding", "norm_norm", "qffl", "register", "scale_by_reddi",
    "select_top",
    "takes_num_clients", "trimmed_mean", "with_server_optimizer",
]

REGISTRY = Registry("aggregator", {
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
    "fedacs": fedacs,
    "krum": krum,
    "bulyan": bulyan,
    "geometric_median": geometric_median,
    "centered_clipping": centered_clipping,
    "norm_bounding": norm_bounding,
    "dp_fedavg": dp_fedavg,
    "dp_ftrl": dp_ftrl,
    "qffl": qffl,
    "fednova": fednova,
    "feddyn": feddyn,
    # LoRA adapters' rules (params of models.lora.lora only).
    "fedit": fedit,
    "ffa_lora": ffa_lora,
    "flora": flora,
    "hetlora": hetlora,
}, context=("num_clients", "model", "x_eval", "y_eval"),
   # A lambda, because _conformance is defined below the registry it checks.
   check=lambda *args, **kwargs: _conformance(*args, **kwargs),
   capabilities={
       # What each rule needs and implies (registry.Capabilities): the
       # spec, the command line and the checks read these.
       "dp_fedavg": Capabilities(private=True, adapters="also"),
       "dp_ftrl": Capabilities(private=True),
       "fedit": Capabilities(adapters="only"),
       "ffa_lora": Capabilities(adapters="only",
                                model_options={"freeze_a": True}),
       "flora": Capabilities(adapters="only",
                             model_options={"merged": True}),
       "hetlora": Capabilities(adapters="only"),
   })
"""Every aggregator factory by the name the CLI and the conformance suite use:
name -> factory of an ``Aggregator``. Factories are called with keyword
arguments only; each has defaults for every argument except the context ones,
which ``build`` passes only to the factories that declare them: ``num_clients``
(rules with per-client state) and FedACS's ``model``, ``x_eval``, ``y_eval``.
Each rule declares what it needs and implies
(``REGISTRY.capabilities(name)``, a ``registry.Capabilities``): private
(DP) rules, rules for LoRA adapters (``models.lora``) and the adapter
options they need; a rule of yours declares them with ``register(...,
capabilities=...)``."""


ADAPTER_RULES = REGISTRY.having(adapters="only")
"""The built-in rules of ``REGISTRY`` defined on LoRA adapters only
(``models.lora.lora``'s params; ``REGISTRY.having(adapters="only")`` when
the library was imported); the conformance kit checks them on
adapters."""


def _conformance(name: str, factory, symmetric: bool = True) -> None:
  """Builds ``factory`` at its defaults and runs the conformance kit
  (``testing.check_aggregator``); ValueError naming the property broken."""
  # Imported on use: only registering a rule needs the kit (and chex).
  from fedjax_agg import testing  # pylint: disable=g-import-not-at-top
  parameters = inspect.signature(factory).parameters
  required = [arg for arg, p in parameters.items()
              if p.default is inspect.Parameter.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
              and arg not in REGISTRY.context]
  if required:
    raise ValueError(f"aggregator {name!r}: configs build rules by keyword "
                     f"from their defaults; {required} have none")
  # The kit draws client ids below its own N = 7; a rule with per-client
  # state must be built for that same federation.
  kwargs = {"num_clients": 7} if "num_clients" in parameters else {}
  try:
    rule = factory(**kwargs)
    testing.check_aggregator(rule, num_clients=7, symmetric=symmetric)
  except (AssertionError, TypeError, ValueError) as error:
    raise ValueError(f"aggregator {name!r} fails the conformance kit "
                     f"(fedjax_agg.testing.check_aggregator): {error}"
                     ) from None


def register(name: str, factory, *, replace: bool = False,
             symmetric: bool = True,
             capabilities: Optional[Capabilities] = None):
  """Adds a rule factory to ``REGISTRY``, so that configs, the command line
  and ``run_config`` run it by ``name`` as a built-in one.

  The factory is built at its defaults (plus ``num_clients`` if it
  declares it) and must pass the conformance kit
  (``testing.check_aggregator``; ``symmetric`` False skips the
  client-permutation property, for rules that read cohort positions).
  ``capabilities`` declares what the rule needs and implies (e.g.
  ``Capabilities(private=True)`` for a DP rule that privacy settings may
  account). A rule in an importable module can also be named
  ``module:factory`` in a config or on the command line, once its module
  is allowed and the factory declared (``fedjax_agg.registry``).

  Raises:
    ValueError: a taken name (``replace`` replaces your own), a built-in
      name, or a rule the conformance kit refuses (naming the property).
  """
  return REGISTRY.register(name, factory, replace=replace,
                           symmetric=symmetric, capabilities=capabilities)


def takes_num_clients(factory) -> bool:
  """Whether ``factory`` declares a ``num_clients`` argument."""
  return "num_clients" in inspect.signature(factory).parameters


def get(name: str, num_clients=None, **kwargs):
  """Builds the registered aggregator ``name`` with ``kwargs``.

  Args:
    name: a key of ``REGISTRY``.
    num_clients: N, the federation size; passed only to factories that
      declare it (required by those).
    **kwargs: the factory's other keyword arguments (and the context ones,
      ``model``, ``x_eval``, ``y_eval``, passed only where declared).
  """
  return REGISTRY.build(name, num_clients=num_clients, **kwargs)


def eval_params(state, new_global_params):
  """The model to evaluate after a round (see the module docstring).

  Args:
    state: the rule's new state.
    new_global_params: the rule's new (broadcast) global params.
  """
  params = getattr(state, "eval_params", None)
  return new_global_params if params is None else params
