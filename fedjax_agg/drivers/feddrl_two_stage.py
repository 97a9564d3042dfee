"""FedDRL's two-stage training (§3.4.2, Fig. 3(b)).

Nguyen et al., FedDRL, ICPP 2022.

1. Online stage: m workers, identical agents at the start (same networks),
   each run their own FL simulation with the one-stage FedDRL aggregator
   (exploring and learning from their own experiences), so they drift apart
   and collect different experiences. The m runs are one simulation: the
   jitted round of ``fedjax_agg.simulation`` is ``jax.vmap``-ed over the
   workers and ``lax.scan``-ed over the rounds. Each worker draws its own
   cohorts, model initialisation, shuffles and agent RNG.
2. The workers' buffers are merged into one experience buffer (worker 0's
   experiences, then worker 1's, ...).
3. Offline stage: a fresh main agent is trained from that buffer alone,
   ``offline_calls`` times Algorithm 1 (TD priorities recomputed each call,
   ``updates_per_round`` DDPG steps each), with no interaction.
4. The main agent then decides: ``decider(result, ...)`` is the FedDRL
   aggregator that starts from it, without exploration.

Each worker's buffer holds at most ``online_rounds`` experiences and the
merged one ``num_workers * online_rounds``, so both are sized
``min(buffer_capacity, that)`` rather than the full capacity.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import rounds
from fedjax_agg.aggregators._feddrl import agent as agent_lib
from fedjax_agg.aggregators._feddrl import replay
from fedjax_agg.aggregators._feddrl.aggregator import feddrl
from fedjax_agg.config import Execution, LocalTraining
from fedjax_agg.federated import FederatedData
from fedjax_agg.types import Aggregator, Model

__all__ = ["TwoStageResult", "decider", "two_stage"]


class TwoStageResult(NamedTuple):
  """What two-stage training returns.

  Attributes:
    agent: the main agent's ``AgentState`` after the offline stage.
    buffer: the merged ``ReplayBuffer`` it was trained on.
    workers: the workers' final ``rounds.ServerState``, stacked [m].
    online_rewards: [R, m] each worker's reward per round (0 at round 1).
    online_train_loss: [R, m] each worker's mean local training loss.
    offline_critic_loss: [offline_calls] the main agent's mean TD loss per
      call of Algorithm 1.
  """
  agent: agent_lib.AgentState
  buffer: replay.ReplayBuffer
  workers: rounds.ServerState
  online_rewards: jax.Array
  online_train_loss: jax.Array
  offline_critic_loss: jax.Array


def _positive_int(name, value, minimum=1):
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def two_stage(model: Model, data: FederatedData, *, num_participants: int,
              online_rounds: int, offline_calls: int, num_workers: int = 2,
              config: Optional[agent_lib.AgentConfig] = None, seed: int = 0,
              training: LocalTraining = LocalTraining(),
              execution: Execution = Execution()) -> TwoStageResult:
  """Runs the online stage with ``num_workers`` workers, then the offline one.

  Args:
    model: the network the FL runs train.
    data: the federated training data (shared by the workers).
    num_participants: K, clients per round (sampled uniformly without
      replacement, every worker its own cohorts).
    online_rounds: R, FL rounds each worker runs.
    offline_calls: calls of Algorithm 1 in the offline stage.
    num_workers: m (2 in the paper).
    config: the ``AgentConfig`` of workers and main agent.
    seed: seeds everything (workers' runs, agents, offline sampling).
    training, execution: the workers' rounds (``rounds.make_round_fn``).

  Returns:
    A ``TwoStageResult``.
  """
  _positive_int("num_participants", num_participants)
  _positive_int("online_rounds", online_rounds)
  _positive_int("offline_calls", offline_calls, 0)
  _positive_int("num_workers", num_workers)
  if num_participants > data.num_clients:
    raise ValueError(
        f"num_participants must be <= the number of clients "
        f"{data.num_clients}, got {num_participants}")
  config = agent_lib.check_config(config or agent_lib.AgentConfig())
  worker_config = config._replace(
      buffer_capacity=min(config.buffer_capacity, online_rounds))
  # Same seed: the workers' agents start identical (§3.4.2).
  worker_rule = feddrl(num_participants, config=worker_config, seed=seed)
  round_fn = rounds.make_round_fn(model, worker_rule, training,
                                  execution=execution)
  key = jax.random.key(seed)
  # Distinct streams for the workers' runs (0) and their rounds' cohorts (1);
  # the agents' RNGs come from their own seed.
  worker_keys = jax.random.split(jax.random.fold_in(key, 0), num_workers)
  agent_rngs = jax.random.split(jax.random.PRNGKey(seed + 1), num_workers)

  def init_worker(worker_key, agent_rng):
    model_key, run_key = jax.random.split(worker_key)
    state = rounds.init_state(model.init(model_key), worker_rule)
    # Identical networks (the rule's seed), each agent with its own RNG, as
    # each run has its own init and cohorts: the workers drift apart.
    return state._replace(
        key=run_key,
        aggregator_state=state.aggregator_state._replace(key=agent_rng))

  mask = jnp.ones((num_participants,), jnp.float32)

  @jax.jit
  # The whole online stage is one compiled call: rounds scanned, workers
  # vmapped, the data shared (in_axes None) rather than copied per worker.
  def online(data, worker_keys, agent_rngs, round_keys):
    def one_round(states, keys):  # keys [m]: one cohort draw per worker
      cohorts = jax.vmap(lambda k: rounds.sample_cohort(
          k, data.num_clients, num_participants))(keys)
      states, out = jax.vmap(round_fn, in_axes=(0, None, 0, None))(
          states, data, cohorts, mask)
      return states, (out.metrics["reward"], out.train_loss)

    states = jax.vmap(init_worker)(worker_keys, agent_rngs)
    return jax.lax.scan(one_round, states, round_keys)

  # [R, m]: the scan hands round r its row, one cohort key per worker.
  round_keys = jax.random.split(jax.random.fold_in(key, 1),
                                (online_rounds, num_workers))
  workers, (rewards, train_loss) = online(data, worker_keys, agent_rngs,
                                          round_keys)

  agent = agent_lib.make_agent(num_participants, config)
  capacity = min(config.buffer_capacity, num_workers * online_rounds)

  @jax.jit
  def offline(worker_buffers, agent_key, call_keys):
    buffer = replay.merge(worker_buffers, capacity)
    main, metrics = jax.lax.scan(lambda a, k: agent.train(a, buffer, k),
                                 agent.init(agent_key), call_keys)
    return main, buffer, metrics["critic_loss"]

  offline_key = jax.random.PRNGKey(seed + 2)
  init_key, calls_key = jax.random.split(offline_key)
  # The workers' buffers, stacked [m], are merged in worker order.
  main, buffer, critic_loss = offline(
      workers.aggregator_state.buffer, init_key,
      jax.random.split(calls_key, offline_calls))
  return TwoStageResult(main, buffer, workers, rewards, train_loss,
                        critic_loss)


def decider(result: TwoStageResult, num_participants: int, *,
            config: Optional[agent_lib.AgentConfig] = None,
            learn: bool = False, seed: int = 0) -> Aggregator:
  """The FedDRL aggregator driven by the trained main agent.

  Args:
    result: the ``TwoStageResult``.
    num_participants: K, as in training.
    config: the ``AgentConfig`` used in training.
    learn: keep learning online (one-stage mode from the trained agent);
      False (the paper's "the main agent decides") leaves it fixed.
    seed: seeds the agent's RNG (sampling of Eq. (5)).
  """
  return feddrl(num_participants, config=config, explore=False, learn=learn,
                seed=seed, initial_agent=result.agent)
