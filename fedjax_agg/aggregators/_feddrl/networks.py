"""FedDRL's policy and value networks and its action -> impact factor map.

Nguyen et al., "FedDRL: Deep Reinforcement Learning-based Adaptive
Aggregation for Non-IID Data in Federated Learning", ICPP 2022, §3.3-3.4,
Table 1, Fig. 3(c).

* Policy pi(s): 3 fully connected hidden layers of 256 with LeakyReLU, then a
  linear output of 2K numbers (h_mu, h_sigma), mapped to the action
  ``mu = max_mean * sigmoid(h_mu - mean(h_mu))`` (in (0, max_mean)) and
  ``sigma = beta * mu * sigmoid(h_sigma)``, so that Eq. (6),
  sigma <= beta * mu, holds by construction.
* Value Q(s, a): [s, a'] -> 2 hidden layers of 256 with LeakyReLU -> 1,
  where a' is the action rescaled to about [-1, 1] (2 mu / max_mean - 1,
  2 sigma / (beta max_mean) - 1). A fixed affine map of the input, so the
  same function class; but with action inputs of mean ~0 the critic fits
  the (large, at first fast-moving) level of Q with its biases instead of
  with action weights, whose spurious gradient the actor would follow.
* Eq. (5): alpha = softmax(z) with z_k ~ N(mu_k, sigma_k), over the real
  participants only (padded clients get alpha_k = 0).

The paper leaves the range of mu open; softmax is shift invariant, so
bounding mu to (0, max_mean) only bounds the ratio of two impact factors'
means by exp(max_mean). Networks are plain lists of ``{'w', 'b'}`` layers.
"""

from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from fedjax_agg import tree_math

__all__ = ["FINAL_LAYER_INIT", "Networks", "impact_factors", "make_networks",
    "mlp_apply", "mlp_init", "project_action"]

# Final layers start small so the first actions sit mid-range (as in DDPG).
FINAL_LAYER_INIT = 3e-3


def mlp_init(key, sizes: Sequence[int]) -> list[dict]:
  """Fully connected layers ``sizes[0] -> ... -> sizes[-1]``.

  Hidden layers: He-normal weights (LeakyReLU), zero biases. The last layer:
  uniform in [-FINAL_LAYER_INIT, FINAL_LAYER_INIT].
  """
  keys = jax.random.split(key, len(sizes) - 1)
  layers = []
  layer_sizes = zip(keys, sizes[:-1], sizes[1:], strict=True)
  for i, (k, fan_in, fan_out) in enumerate(layer_sizes):
    if i < len(sizes) - 2:
      w = jax.random.normal(k, (fan_in, fan_out)) * jnp.sqrt(2.0 / fan_in)
      b = jnp.zeros((fan_out,))
    else:
      kw, kb = jax.random.split(k)
      w = jax.random.uniform(kw, (fan_in, fan_out), minval=-FINAL_LAYER_INIT,
                             maxval=FINAL_LAYER_INIT)
      b = jax.random.uniform(kb, (fan_out,), minval=-FINAL_LAYER_INIT,
                             maxval=FINAL_LAYER_INIT)
    layers.append({"w": w.astype(jnp.float32), "b": b.astype(jnp.float32)})
  return layers


def mlp_apply(layers: list[dict], x: jax.Array) -> jax.Array:
  """LeakyReLU after every layer but the last. [..., in] -> [..., out]."""
  # The agent is part of the aggregation: full float32 on every backend.
  def dense(x, layer):
    return jnp.matmul(x, layer["w"], precision=tree_math.FULL) + layer["b"]
  for layer in layers[:-1]:
    x = jax.nn.leaky_relu(dense(x, layer))
  return dense(x, layers[-1])


class Networks(NamedTuple):
  """The agent's two networks for a cohort of K participants.

  Attributes:
    policy_init: ``policy_init(key) -> policy_params``.
    policy_apply: ``policy_apply(params, s) -> (mu, sigma)``; s [..., 3K],
      mu and sigma [..., K].
    value_init: ``value_init(key) -> value_params``.
    value_apply: ``value_apply(params, s, action) -> q``; s [..., 3K],
      action [..., 2K] (mu then sigma), q [...].
  """
  policy_init: Callable
  policy_apply: Callable
  value_init: Callable
  value_apply: Callable


def make_networks(num_participants: int,
                  policy_hidden: Sequence[int] = (256, 256, 256),
                  value_hidden: Sequence[int] = (256, 256),
                  max_mean: float = 5.0, beta: float = 0.5) -> Networks:
  """Builds the policy and value networks (Table 1 defaults)."""
  state_dim, action_dim = 3 * num_participants, 2 * num_participants

  def policy_apply(params, s):
    h = mlp_apply(params, s)
    h_mu = h[..., :num_participants]
    # softmax ignores a common shift of mu; centring removes that direction
    # so the actor cannot drift every mu_k into the sigmoid's flat ends.
    h_mu = h_mu - jnp.mean(h_mu, axis=-1, keepdims=True)
    mu = max_mean * jax.nn.sigmoid(h_mu)
    # Eq. (6): sigma <= beta * mu.
    sigma = beta * mu * jax.nn.sigmoid(h[..., num_participants:])
    return mu, sigma

  def value_apply(params, s, action):
    # Action rescaled to about [-1, 1] (module docstring).
    mu, sigma = action[..., :num_participants], action[..., num_participants:]
    # beta = 0 is allowed (sigma is then always 0); the floor only keeps
    # this static divisor nonzero.
    sigma_scale = max(beta, 1e-6) * max_mean
    scaled = jnp.concatenate(
        [2.0 * mu / max_mean - 1.0, 2.0 * sigma / sigma_scale - 1.0], axis=-1)
    return mlp_apply(params, jnp.concatenate([s, scaled], axis=-1))[..., 0]

  return Networks(
      policy_init=lambda key: mlp_init(
          key, (state_dim, *policy_hidden, action_dim)),
      policy_apply=policy_apply,
      value_init=lambda key: mlp_init(
          key, (state_dim + action_dim, *value_hidden, 1)),
      value_apply=value_apply)


def project_action(mu: jax.Array, sigma: jax.Array, max_mean: float,
                   beta: float) -> tuple[jax.Array, jax.Array]:
  """Clips a (noisy) action into 0 <= mu <= max_mean, 0 <= sigma <= beta mu."""
  # mu first: sigma's bound must use the projected mu, so that Eq. (6)
  # holds for the pair actually returned.
  mu = jnp.clip(mu, 0.0, max_mean)
  return mu, jnp.clip(sigma, 0.0, beta * mu)


def impact_factors(key, mu: jax.Array, sigma: jax.Array,
                   mask: jax.Array) -> jax.Array:
  """Eq. (5): alpha = softmax(N(mu, sigma)) over real participants. [K]."""
  z = mu + sigma * jax.random.normal(key, mu.shape, mu.dtype)
  # A -inf logit gets exactly 0 from softmax, so the normalisation runs
  # over the real participants only, whatever the padding's mu and sigma.
  z = jnp.where(mask > 0, z, -jnp.inf)
  alpha = jax.nn.softmax(z)
  # An all-padding cohort gives NaN above; it aggregates nothing.
  return jnp.where(mask > 0, alpha, 0.0)
