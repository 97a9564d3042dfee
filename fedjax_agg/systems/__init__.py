"""A simulated clock for federated learning: who is fast, who is online.

Host-side (numpy) models of the clients' systems, deterministic from their
seeds, that decide which clients take part in a round or an asynchronous
server step, when they finish and how much simulated wall-clock time
passes. Their outputs (client ids, masks, versions, times) are numpy arrays
that a run loop feeds to the jitted training engine.

* Profiles: ``ClientProfiles`` (speed, uplink, downlink per client),
  ``lognormal_profiles``, ``constant_profiles``, ``read_profiles`` (CSV),
  registry ``PROFILES``; ``task_time`` = examples / speed + down_bytes /
  downlink + up_bytes / uplink.
* Availability: ``Availability`` (``online``, ``online_until``,
  ``next_online``), ``always``, ``markov``, ``diurnal``, ``from_intervals``,
  ``read_intervals`` (CSV), registry ``AVAILABILITY``; their arguments
  checked before N is known: ``check_model_arguments``.
* Staleness weights (jit-able): ``constant_staleness``,
  ``polynomial_staleness``, ``hinge_staleness``, registry ``STALENESS``.
* Schedules over a ``System`` (profiles, availability, ``Workload``):
  synchronous rounds ``sync_round`` / ``sync_round_from_order`` (over-
  selection up to ``MAX_OVER_SELECTION``, deadline, dropouts) returning a
  ``SyncRound``; FedBuff's asynchronous buffered aggregation
  ``AsyncSchedule`` returning an ``AsyncStep`` per server step; a run's
  rounds planned up front (``plan_rounds`` -> ``RoundPlan``,
  ``plan_async`` -> ``AsyncPlan``).

Every name is exported once from this package; the implementation modules
are private.
"""

from fedjax_agg.systems._async import AsyncSchedule
from fedjax_agg.systems._async import AsyncStep
from fedjax_agg.systems._availability import always
from fedjax_agg.systems._availability import Availability
from fedjax_agg.systems._availability import diurnal
from fedjax_agg.systems._availability import from_intervals
from fedjax_agg.systems._availability import INTERVAL_COLUMNS
from fedjax_agg.systems._availability import read_intervals
from fedjax_agg.systems._markov import markov
from fedjax_agg.systems._population import AVAILABILITY
from fedjax_agg.systems._population import check_model_arguments
from fedjax_agg.systems._profiles import check_profiles
from fedjax_agg.systems._profiles import ClientProfiles
from fedjax_agg.systems._profiles import constant_profiles
from fedjax_agg.systems._profiles import lognormal_profiles
from fedjax_agg.systems._profiles import PROFILE_COLUMNS
from fedjax_agg.systems._profiles import PROFILES
from fedjax_agg.systems._profiles import read_profiles
from fedjax_agg.systems._profiles import task_time
from fedjax_agg.systems._rounds import AsyncPlan
from fedjax_agg.systems._rounds import plan_async
from fedjax_agg.systems._rounds import plan_rounds
from fedjax_agg.systems._rounds import RoundPlan
from fedjax_agg.systems._staleness import constant_staleness
from fedjax_agg.systems._staleness import hinge_staleness
from fedjax_agg.systems._staleness import polynomial_staleness
from fedjax_agg.systems._staleness import STALENESS
from fedjax_agg.systems._staleness import StalenessFn
from fedjax_agg.systems._sync import ACCEPTED
from fedjax_agg.systems._sync import check_over_selection
from fedjax_agg.systems._sync import check_system
from fedjax_agg.systems._sync import LATE
from fedjax_agg.systems._sync import MAX_OVER_SELECTION
from fedjax_agg.systems._sync import num_selected
from fedjax_agg.systems._sync import OFFLINE
from fedjax_agg.systems._sync import STATUS_NAMES
from fedjax_agg.systems._sync import SURPLUS
from fedjax_agg.systems._sync import sync_round
from fedjax_agg.systems._sync import sync_round_from_order
from fedjax_agg.systems._sync import SyncRound
from fedjax_agg.systems._sync import System
from fedjax_agg.systems._sync import Workload

__all__ = [
    "ACCEPTED", "AVAILABILITY", "AsyncPlan", "AsyncSchedule", "AsyncStep",
    "Availability", "ClientProfiles", "INTERVAL_COLUMNS", "LATE",
    "MAX_OVER_SELECTION", "OFFLINE", "PROFILE_COLUMNS", "PROFILES",
    "RoundPlan", "STALENESS", "STATUS_NAMES", "SURPLUS", "StalenessFn",
    "SyncRound", "System", "Workload", "always", "check_model_arguments",
    "check_over_selection", "check_profiles", "check_system",
    "constant_profiles", "constant_staleness", "diurnal", "from_intervals",
    "hinge_staleness", "lognormal_profiles", "markov", "num_selected",
    "plan_async", "plan_rounds", "polynomial_staleness", "read_intervals",
    "read_profiles", "sync_round", "sync_round_from_order", "task_time",
]
