"""FedDRL's DDPG agent as pure functions (Algorithm 1, Table 1).

Nguyen et al., FedDRL, ICPP 2022, §3.4.1; DDPG: Lillicrap et al., ICLR 2016.

One learning step on a batch B of (s, a, r, s'), in the paper's order:
  y = r + gamma * Q'(s', pi'(s'))                      (Alg. 1 line 5)
  critic: Adam descent on mean_B (Q(s, a) - y)^2         (line 6)
  actor:  Adam ascent on mean_B Q(s, pi(s)) (new critic) (line 7)
  targets: theta' <- rho * theta + (1 - rho) * theta'    (lines 8-9)
There is no terminal flag: an FL run is a continuing task.

Interpretations (the paper is ambiguous or inconsistent here):
* Soft update. Algorithm 1 writes phi' <- rho phi' + (1 - rho) phi; with
  Table 1's rho = 0.02 the target would be 98% the main network, i.e. no
  target network at all. We read rho as DDPG's tau: rho weighs the *main*
  network and the target keeps 1 - rho of itself.
* TD priority (Alg. 1 line 1 and §3.4.1 both write
  |r + gamma Q(s', a) - Q(s, a)|, the stored action evaluated at s').
  ``td_priority="paper"`` uses that formula with the main critic;
  ``"target"`` uses the TD error of the critic loss,
  |r + gamma Q'(s', pi'(s')) - Q(s, a)|.
* Priorities of all stored experiences are recomputed once per call of
  Algorithm 1, then ``updates_per_round`` batches are sampled by TD rank.
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_agg import checks
from fedjax_agg.aggregators._feddrl import networks as networks_lib
from fedjax_agg.aggregators._feddrl import replay

__all__ = ["Agent", "AgentConfig", "AgentState", "TD_PRIORITIES",
    "check_config", "make_agent"]

TD_PRIORITIES = ("paper", "target")


class AgentConfig(NamedTuple):
  """Hyperparameters of the agent; defaults follow Table 1 where it speaks.

  Attributes:
    policy_hidden: hidden layer sizes of pi (3 x 256).
    value_hidden: hidden layer sizes of Q (2 x 256).
    max_mean: upper bound of every mu_k (not in the paper; see networks).
    beta: Eq. (6), sigma <= beta * mu, in [0, 1] (value not in the paper).
    policy_lr: Adam learning rate of pi (1e-4).
    value_lr: Adam learning rate of Q (1e-3).
    discount: gamma (0.99).
    target_update: rho, weight of the main network in the soft update (0.02).
    buffer_capacity: experience buffer size (100,000).
    batch_size: |B| per learning step (not in the paper).
    updates_per_round: b, learning steps per call of Algorithm 1 (not in
      the paper).
    min_buffer_size: Algorithm 2's "D is sufficient": learn once the buffer
      holds this many experiences (0 means ``batch_size``).
    priority_exponent: TD-rank sampling P(rank r) ~ r ** -exponent.
    td_priority: "paper" or "target" (see the module docstring).
    exploration_std: std of the Gaussian noise added to (mu, sigma) while
      exploring (Algorithm 2 line 14; the std is not in the paper: 1.0,
      a fifth of mu's range, learned reliably in our tests where 0.5 was
      slower).
    priority_chunk: rows per forward pass when recomputing priorities
      (only the filled rows are visited).
  """
  policy_hidden: tuple[int, ...] = (256, 256, 256)
  value_hidden: tuple[int, ...] = (256, 256)
  max_mean: float = 5.0
  beta: float = 0.5
  policy_lr: float = 1e-4
  value_lr: float = 1e-3
  discount: float = 0.99
  target_update: float = 0.02
  buffer_capacity: int = 100_000
  batch_size: int = 64
  updates_per_round: int = 1
  min_buffer_size: int = 0
  priority_exponent: float = 1.0
  td_priority: str = "paper"
  exploration_std: float = 1.0
  priority_chunk: int = 1024


def check_config(config: AgentConfig) -> AgentConfig:
  """Raises ValueError/TypeError naming the first bad field; returns it."""
  for name in ("policy_hidden", "value_hidden"):
    sizes = getattr(config, name)
    if not isinstance(sizes, (tuple, list)) or not sizes:
      raise ValueError(f"{name} must be a non-empty tuple of positive ints, "
                       f"got {sizes!r}")
    for i, size in enumerate(sizes):
      checks.check_int(f"{name}[{i}]", size, 1)
  for name in ("buffer_capacity", "batch_size", "updates_per_round",
               "priority_chunk"):
    checks.check_int(name, getattr(config, name), 1)
  checks.check_int("min_buffer_size", config.min_buffer_size, 0)
  checks.check_range("beta", config.beta, 0, 1)
  checks.check_range("discount", config.discount, 0, 1)
  checks.check_range("target_update", config.target_update, 0, 1,
                     low_open=True)
  for name in ("max_mean", "policy_lr", "value_lr"):
    checks.check_range(name, getattr(config, name), 0, low_open=True)
  for name in ("priority_exponent", "exploration_std"):
    checks.check_range(name, getattr(config, name), 0)
  checks.check_choice("td_priority", config.td_priority, TD_PRIORITIES)
  return config


class AgentState(NamedTuple):
  """Main and target networks with the main networks' Adam states."""
  policy: Any
  value: Any
  target_policy: Any
  target_value: Any
  policy_opt_state: Any
  value_opt_state: Any


class Agent(NamedTuple):
  """The agent's pure functions (all jittable, all vmappable).

  Attributes:
    networks: the ``Networks`` (policy/value init and apply).
    init: ``init(key) -> AgentState`` (targets start as copies).
    act: ``act(agent, s, key, explore) -> (mu, sigma)``, s [3K]; with
      ``explore`` (a Python bool) Gaussian noise is added and the action
      projected back onto 0 <= mu <= max_mean, 0 <= sigma <= beta mu.
    td_loss: ``td_loss(agent, batch) -> []`` mean (Q(s, a) - y)^2.
    critic_step / actor_step: ``(agent, batch) -> (agent, loss)``.
    soft_update: ``soft_update(agent) -> agent`` (lines 8-9).
    update: ``update(agent, batch) -> (agent, metrics)``, lines 5-9.
    td_priorities: ``td_priorities(agent, buffer) -> [C]``, line 1; rows
      >= size are 0.
    train: ``train(agent, buffer, key) -> (agent, metrics)``, Algorithm 1
      with b = ``updates_per_round``.
  """
  networks: networks_lib.Networks
  init: Any
  act: Any
  td_loss: Any
  critic_step: Any
  actor_step: Any
  soft_update: Any
  update: Any
  td_priorities: Any
  train: Any


def make_agent(num_participants: int,
               config: Optional[AgentConfig] = None) -> Agent:
  """Builds the DDPG agent for cohorts of ``num_participants`` (K).

  Args:
    num_participants: K.
    config: the ``AgentConfig`` (defaults when None).
  """
  checks.check_int("num_participants", num_participants, 1)
  config = check_config(config or AgentConfig())
  nets = networks_lib.make_networks(
      num_participants, tuple(config.policy_hidden),
      tuple(config.value_hidden), config.max_mean, config.beta)
  policy_tx = optax.adam(config.policy_lr)
  value_tx = optax.adam(config.value_lr)

  def pi(params, s):
    return jnp.concatenate(nets.policy_apply(params, s), axis=-1)

  def init(key):
    key_pi, key_q = jax.random.split(key)
    policy, value = nets.policy_init(key_pi), nets.value_init(key_q)
    # Targets as copies (distinct buffers, so a state can be donated).
    copy = lambda tree: jax.tree.map(jnp.copy, tree)
    return AgentState(policy, value, copy(policy), copy(value),
                      policy_tx.init(policy), value_tx.init(value))

  def act(agent, s, key, explore: bool):
    mu, sigma = nets.policy_apply(agent.policy, s)
    # ``explore`` is a Python bool: the greedy and the exploring policy
    # compile as separate programs, and the greedy one draws no noise.
    if explore:
      noise = config.exploration_std * jax.random.normal(key, (2,) + mu.shape)
      mu, sigma = networks_lib.project_action(
          mu + noise[0], sigma + noise[1], config.max_mean, config.beta)
    return mu, sigma

  def targets(agent, batch):
    # Alg. 1 line 5: y = r + gamma Q'(s', pi'(s')).
    next_q = nets.value_apply(agent.target_value, batch.next_state,
                              pi(agent.target_policy, batch.next_state))
    # y is a fixed regression target: differentiating td_loss with respect
    # to the whole agent must not move the target networks.
    return jax.lax.stop_gradient(batch.reward + config.discount * next_q)

  def critic_loss(value, y, batch):
    q = nets.value_apply(value, batch.state, batch.action)
    return jnp.mean(jnp.square(q - y))

  def td_loss(agent, batch):
    return critic_loss(agent.value, targets(agent, batch), batch)

  def critic_step(agent, batch):
    # Alg. 1 line 6: gradient descent on mean (Q(s, a) - y)^2.
    loss, grads = jax.value_and_grad(critic_loss)(
        agent.value, targets(agent, batch), batch)
    updates, opt_state = value_tx.update(grads, agent.value_opt_state,
                                         agent.value)
    return agent._replace(value=optax.apply_updates(agent.value, updates),
                          value_opt_state=opt_state), loss

  def actor_step(agent, batch):
    # Alg. 1 line 7: gradient ascent on mean Q(s, pi(s)) = descent on -Q.
    def negative_q(policy):
      return -jnp.mean(nets.value_apply(agent.value, batch.state,
                                        pi(policy, batch.state)))
    loss, grads = jax.value_and_grad(negative_q)(agent.policy)
    updates, opt_state = policy_tx.update(grads, agent.policy_opt_state,
                                          agent.policy)
    return agent._replace(policy=optax.apply_updates(agent.policy, updates),
                          policy_opt_state=opt_state), loss

  def soft_update(agent):
    # Alg. 1 lines 8-9 with rho on the main network (module docstring).
    rho = config.target_update
    return agent._replace(
        target_policy=optax.incremental_update(agent.policy,
                                               agent.target_policy, rho),
        target_value=optax.incremental_update(agent.value,
                                              agent.target_value, rho))

  def update(agent, batch):
    # The paper's order: the actor ascends the critic just updated, and only
    # then do both targets move.
    agent, critic = critic_step(agent, batch)
    agent, actor = actor_step(agent, batch)
    return soft_update(agent), {"critic_loss": critic, "actor_q": -actor}

  def batch_priorities(agent, batch):
    q = nets.value_apply(agent.value, batch.state, batch.action)
    if config.td_priority == "paper":
      # Alg. 1 line 1 as printed: |r + gamma Q(s', a) - Q(s, a)|.
      next_q = nets.value_apply(agent.value, batch.next_state, batch.action)
      return jnp.abs(batch.reward + config.discount * next_q - q)
    return jnp.abs(targets(agent, batch) - q)

  def td_priorities(agent, buffer):
    capacity = buffer.capacity
    chunk = min(config.priority_chunk, capacity)
    # buffer.size is traced, so the loop bound is dynamic (fori_loop becomes
    # a while loop): a nearly empty buffer costs a few chunks, not its
    # capacity.
    num_chunks = (buffer.size + chunk - 1) // chunk  # only filled rows

    def body(i, priorities):
      start = jnp.minimum(i * chunk, capacity - chunk)
      rows = jax.tree.map(
          lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk),
          buffer.data)
      return jax.lax.dynamic_update_slice_in_dim(
          priorities, batch_priorities(agent, rows), start, 0)

    priorities = jax.lax.fori_loop(0, num_chunks, body,
                                   jnp.zeros((capacity,), jnp.float32))
    # A chunk may run past the filled rows; their priorities are zeroed so
    # that empty slots are never sampled.
    return jnp.where(jnp.arange(capacity) < buffer.size, priorities, 0.0)

  def train(agent, buffer, key):
    priorities = td_priorities(agent, buffer)  # Alg. 1 line 1
    probs = replay.rank_probabilities(priorities, buffer.size,
                                      config.priority_exponent)  # line 2

    def step(agent, step_key):  # lines 3-10
      indices = replay.sample_indices(step_key, probs, config.batch_size)
      return update(agent, replay.gather(buffer, indices))

    agent, metrics = jax.lax.scan(
        step, agent, jax.random.split(key, config.updates_per_round))
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics["mean_priority"] = (jnp.sum(priorities)
                                / jnp.maximum(buffer.size, 1))
    return agent, metrics

  return Agent(nets, init, act, td_loss, critic_step, actor_step, soft_update,
               update, td_priorities, train)
