"""FedDRL: impact factors chosen by a DDPG agent, as an ``Aggregator``.

Nguyen, Nguyen, Nguyen, Nguyen, Nguyen, Nguyen, Pham, Nguyen, "FedDRL: Deep
Reinforcement Learning-based Adaptive Aggregation for Non-IID Data in
Federated Learning", ICPP 2022 (Algorithm 2, one-stage "basic" mode).

The whole agent (networks, Adam states, targets, buffer, RNG) is the
aggregator state, so a round with the agent's decision and its learning
step is one pure, jittable function. At round t, with the K participants'
``loss_before`` (l_b), ``loss_after`` (l_a) and n_k:

1. State (§3.3.2): s_t = [log l_b (K), log l_a (K), n_k / sum_j n_j (K)],
   3K numbers. Normalisation (ours): losses enter as logs (floored at
   ``LOSS_FLOOR``), since they shrink by orders of magnitude over training
   and raw values of very different scales make the networks' inputs, and
   so the actor's steps, badly scaled; n_k enters as the FedAvg weight so
   the input does not depend on the dataset size. Padded clients (mask 0)
   contribute zeros.
2. Reward of the previous action (Eq. (7)): the losses of the global model
   w^t on the clients' data are this round's ``loss_before``, so the reward
   r_{t-1} of the action a_{t-1} (which built w^t) is known only now:
       cost = mean_k l_b + (max_k l_b - min_k l_b)   over real participants,
       r_{t-1} = -cost
   Eq. (7) as printed is a cost (the paper minimises the mean loss and the
   gap); we negate it so the agent maximises reward. The transition
   (s_{t-1}, a_{t-1}, r_{t-1}, s_t) is stored now (Alg. 2 lines 17-18).
   Under partial participation these losses are on round t's cohort, as is
   the paper's next state s_t.
3. If the buffer holds ``min_buffer_size`` experiences, Algorithm 1 runs
   (lines 19-20).
4. Decision (lines 14-15): (mu, sigma) = pi(s_t) (+ noise when exploring),
   Eq. (6) sigma <= beta mu, Eq. (5) alpha = softmax(N(mu, sigma)) over real
   participants; padded clients get alpha_k = 0.
5. Eq. (4): w^{t+1} = sum_k alpha_k w_k.

The agent's own key (in the state, seeded by ``seed``) drives exploration,
the Gaussian sample of Eq. (5) and replay sampling; ``info.key`` is unused.
K (``num_participants``) is fixed per run: the networks' sizes depend on it.
A cohort of K' < K rows fills the first K' slots of the state and action
(the others count as padding); padded clients (mask 0) always get 0.
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg import tree_math
from fedjax_agg.aggregators._feddrl import agent as agent_lib
from fedjax_agg.aggregators._feddrl import networks as networks_lib
from fedjax_agg.aggregators._feddrl import replay
from fedjax_agg.types import Aggregator, ClientInfo

__all__ = ["FedDRLState", "LOSS_FLOOR", "feddrl", "observation", "reward_cost"]

# Losses are floored here before the log of the state (1e-6 -> -13.8).
LOSS_FLOOR = 1e-6


class FedDRLState(NamedTuple):
  """Everything the agent carries between rounds.

  Attributes:
    agent: ``AgentState`` (main and target networks, Adam states).
    buffer: ``ReplayBuffer`` of transitions (s [3K], a [2K], r, s' [3K]).
    last_state: [3K] the previous round's state s_{t-1}.
    last_action: [2K] the previous round's action a_{t-1} = (mu, sigma).
    has_last: [] bool, whether a previous decision exists (False at the
      first round: no transition to store yet).
    key: [2] uint32, the agent's PRNG key.
  """
  agent: agent_lib.AgentState
  buffer: replay.ReplayBuffer
  last_state: jax.Array
  last_action: jax.Array
  has_last: jax.Array
  key: jax.Array


STATE_TRANSFORMS = ("log", "raw")


def observation(info: ClientInfo, transform: str = "log") -> jax.Array:
  """s_t (§3.3.2): [f(l_b), f(l_a), n_k / sum n], padded rows 0. -> [3K].

  ``transform`` f: "log" (log of the losses floored at ``LOSS_FLOOR``, our
  default: the paper states the losses, not their scale, and the log keeps
  the agent's inputs O(1) as the losses shrink) or "raw" (the losses as
  they are).
  """
  real = info.mask > 0
  if transform == "log":
    scale = lambda x: jnp.log(jnp.maximum(x, LOSS_FLOOR))
  else:
    scale = lambda x: x
  log_loss = lambda x: jnp.where(real, scale(x), 0.0).astype(jnp.float32)
  return jnp.concatenate([
      log_loss(info.loss_before), log_loss(info.loss_after),
      tree_math.normalize_weights(info.num_examples.astype(jnp.float32),
                                  info.mask)])


def reward_cost(losses: jax.Array, mask: jax.Array) -> jax.Array:
  """Eq. (7): mean + (max - min) of ``losses`` [K] over real clients. -> []."""
  real = mask > 0
  count = jnp.sum(real)
  mean = jnp.sum(jnp.where(real, losses, 0.0)) / jnp.maximum(count, 1)
  # The +-inf fills drop padding from the max and the min; with no real
  # client the gap is inf - inf = NaN, which the final where replaces.
  gap = (jnp.max(jnp.where(real, losses, -jnp.inf))
         - jnp.min(jnp.where(real, losses, jnp.inf)))
  return jnp.where(count > 0, mean + gap, 0.0)


@run_context.derived_from_run(num_participants="cohort_size")
def feddrl(num_participants: int = 10, *,
           config: Optional[agent_lib.AgentConfig] = None,
           explore: bool = True, learn: bool = True, seed: int = 0,
           initial_agent: Optional[agent_lib.AgentState] = None,
           state_transform: str = "log",
           **config_overrides: Any) -> Aggregator:
  """FedDRL aggregator (one-stage mode; see ``two_stage`` for the other).

  Args:
    num_participants: K, the cohort size the agent is built for (a cohort
      may be smaller; the missing slots count as padding).
    config: the agent's ``AgentConfig`` (Table 1 defaults when None).
    explore: add exploration noise to the action (training); False for a
      trained agent that only decides.
    learn: store transitions and run Algorithm 1 each round.
    seed: seeds the networks' initialisation and the agent's RNG.
    initial_agent: start from this ``AgentState`` (e.g. the main agent of
      two-stage training) instead of fresh networks.
    state_transform: how the losses enter the agent's state: "log" or
      "raw" (``observation``).
    **config_overrides: ``AgentConfig`` fields replacing those of
      ``config`` (e.g. ``beta=0.3``).

  Returns:
    An ``Aggregator``. Metrics, for a cohort of K' <= K rows:
    ``client_weights`` [K'] (alpha), ``mu`` [K'], ``sigma`` [K'] (the action
    taken, noise included), ``reward`` [] (r_{t-1}, 0 at the first round),
    ``critic_loss``, ``actor_q``, ``mean_priority`` [] (0 when no learning
    step ran) and ``buffer_size`` [].
  """
  unknown = set(config_overrides) - set(agent_lib.AgentConfig._fields)
  if unknown:
    raise TypeError(f"feddrl got unknown arguments {sorted(unknown)}; "
                    f"config fields are {agent_lib.AgentConfig._fields}")
  if config is not None and not isinstance(config, agent_lib.AgentConfig):
    raise TypeError(
        f"config must be an AgentConfig, got {type(config).__name__}")
  config = (config or agent_lib.AgentConfig())._replace(**config_overrides)
  agent = agent_lib.make_agent(num_participants, config)
  checks.check_bool("explore", explore)
  checks.check_bool("learn", learn)
  checks.check_int("seed", seed)
  checks.check_choice("state_transform", state_transform, STATE_TRANSFORMS)
  min_size = config.min_buffer_size or config.batch_size
  state_dim, action_dim = 3 * num_participants, 2 * num_participants

  def init(global_params):
    del global_params
    key = jax.random.PRNGKey(seed)
    key, init_key = jax.random.split(key)
    return FedDRLState(
        agent=agent.init(init_key) if initial_agent is None else initial_agent,
        buffer=replay.init(config.buffer_capacity, state_dim, action_dim),
        last_state=jnp.zeros((state_dim,), jnp.float32),
        last_action=jnp.zeros((action_dim,), jnp.float32),
        has_last=jnp.zeros((), bool), key=key)

  def aggregate(global_params, client_params, info, state):
    num_clients = checks.check_cohort(
        global_params, client_params, info,
        fields=("loss_before", "loss_after"))
    # K fixes the networks' input and output sizes, so a larger cohort is
    # refused here, at trace time, before any state is touched.
    if num_clients > num_participants:
      raise ValueError(
          f"feddrl was built for num_participants={num_participants} "
          f"clients per round, got a cohort of {num_clients}")
    # A smaller cohort fills the first slots; the rest are padding.
    pad = lambda x: jnp.pad(x.astype(jnp.float32),
                            (0, num_participants - num_clients))
    info = info._replace(
        num_examples=pad(info.num_examples), mask=pad(info.mask),
        loss_before=pad(info.loss_before), loss_after=pad(info.loss_after))
    # A cohort of padding only is no round: model and agent stay as they
    # are. Every piece is skipped on its own (no select over the buffer).
    real = jnp.sum(info.mask) > 0
    key, train_key, act_key, sample_key = jax.random.split(state.key, 4)
    s = observation(info, state_transform)
    reward = jnp.where(state.has_last,
                       -reward_cost(info.loss_before, info.mask), 0.0)
    buffer, agent_state = state.buffer, state.agent
    metrics = {"critic_loss": jnp.zeros(()), "actor_q": jnp.zeros(()),
               "mean_priority": jnp.zeros(())}
    # ``learn`` is a Python bool: a deciding-only agent compiles no buffer
    # write and no learning step. The cond (not a select) runs Algorithm 1
    # only in rounds that learn; under vmap both branches run.
    if learn:
      buffer = replay.add(buffer, replay.Transition(
          state.last_state, state.last_action, reward, s),
                          state.has_last & real)
      agent_state, metrics = jax.lax.cond(
          real & (buffer.size >= min_size),
          lambda a: agent.train(a, buffer, train_key),
          lambda a: (a, metrics), agent_state)
    mu, sigma = agent.act(agent_state, s, act_key, explore)
    alpha = networks_lib.impact_factors(sample_key, mu, sigma, info.mask)
    new_global = tree_math.weighted_sum(client_params, alpha[:num_clients])
    # An empty round also keeps the agent's key, so that the later rounds
    # draw the same actions as in a run without that round.
    keep = lambda new, old: optax.tree.where(real, new, old)
    last = keep((s, jnp.concatenate([mu, sigma]), jnp.ones((), bool), key),
                (state.last_state, state.last_action, state.has_last,
                 state.key))
    new_state = FedDRLState(agent_state, buffer, *last)
    return keep(new_global, global_params), new_state, {
        "client_weights": alpha[:num_clients], "mu": mu[:num_clients],
        "sigma": sigma[:num_clients], "reward": reward,
        "buffer_size": buffer.size, **metrics}

  return Aggregator(init, aggregate, uses_losses=True)
