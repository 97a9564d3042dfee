"""FedDRL (Nguyen et al., ICPP 2022): a DDPG agent picks the impact factors.

* ``networks``: policy/value networks, Eq. (5)-(6) action -> impact factors.
* ``replay``: fixed-capacity experience buffer with TD-rank sampling.
* ``agent``: the DDPG learning step and Algorithm 1 as pure functions.
* ``aggregator``: ``feddrl(...)``, the one-stage Aggregator (Algorithm 2).
* ``two_stage``: online workers (one vmapped simulation) + offline training
  of the main agent (§3.4.2); imported on use, it needs the simulation.
"""

__all__ = [
    "AgentConfig", "AgentState", "FedDRLState", "feddrl", "make_agent",
    "observation", "reward_cost",
]

from fedjax_agg.aggregators._feddrl.agent import AgentConfig
from fedjax_agg.aggregators._feddrl.agent import AgentState
from fedjax_agg.aggregators._feddrl.agent import make_agent
from fedjax_agg.aggregators._feddrl.aggregator import feddrl
from fedjax_agg.aggregators._feddrl.aggregator import FedDRLState
from fedjax_agg.aggregators._feddrl.aggregator import observation
from fedjax_agg.aggregators._feddrl.aggregator import reward_cost
