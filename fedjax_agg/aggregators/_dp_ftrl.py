"""DP-FTRL: private follow-the-regularized-leader with tree-aggregated noise.

Kairouz, McMahan, Song, Thakkar, Thakurta and Xu, "Practical and Private
(Deep) Learning without Sampling or Shuffling", ICML 2021 (Alg. 1,
DP-FTRL with the tree aggregation of prefix sums; DP-FTRLM, its momentum
variant; the tree restarts of its App. D).

Round t (t = 1, 2, ... within the current tree) over the real
participants (mask 1), clip norm C, fixed denominator m
(``num_participants``), noise multiplier z, learning rate eta, momentum
gamma (the numbering is this file's):

  (1) Alg. 1    g_t = -(1/m) sum_k dw_k min(1, C / |dw_k|),
                dw_k = w_k - theta_{t-1}
  (2) tree      s_t = sum_{tau <= t} g_tau + sum_{(l, j) in B(t)} n_{l,j},
                n_{l,j} ~ N(0, (z C / m)^2 I),
                B(t) = {(l, floor(t / 2^l) - 1) : bit l of t is 1}
  (3) DP-FTRLM  v_t = gamma v_{t-1} + s_t  (v_0 = 0)
  (4) Alg. 1    theta_t = argmin <v_t, theta> + |theta - theta_0|^2 / (2 eta)
                        = theta_0 - eta v_t
  (5) App. D    every ``restart_every`` rounds a new tree: theta_0 <- the
                current model, the sums, v and the node noise start afresh.

Node (l, j) sums the rounds j 2^l + 1 .. (j + 1) 2^l of the tree (level
0: one round); B(t) is the binary decomposition of [1, t], so s_t carries
|B(t)| <= floor(log2 t) + 1 node noises.

The rule computes (4) round by round, theta_t = theta_{t-1} - eta u_t
with u_t = v_t - v_{t-1} = gamma u_{t-1} + s_t - s_{t-1} and

  (6)           s_t - s_{t-1} = g_t + n_{i, t/2^i - 1}
                                - sum_{l < i} n_{l, floor((t-1)/2^l) - 1},

i the lowest set bit of t: the node completed at round t replaces the i
nodes below it; the nodes above are in B(t-1) and B(t) and cancel. This
equals (4) in exact arithmetic, never subtracts two large float32 sums,
keeps only u in the state (theta_0 is the model the tree started from)
and, like every rule, moves the model it is given.

Interpretations:
* The FTRL "gradient" is the negative mean clipped update (the
  pseudo-gradient of federated learning). With z = 0, eta = 1 and
  gamma = 0, (4) is theta_{t-1} + (1/m) sum_k clipped dw_k: FedAvg of
  clipped updates over a fixed denominator, applied cumulatively.
* The regulariser is centred at theta_0, so (4) is FTRL's exact
  minimiser (as in the authors' implementation).
* DP-FTRLM applies heavy-ball momentum to the noisy prefix sums s_t (as
  in the authors' implementation), gamma in [0, 1).
* m is fixed (the cohort size): one client moves a node by at most C / m
  whatever the realised cohort, so the node noise z C / m has multiplier
  z; every client weighs the same (``num_examples`` is unused).
* Node noise is never stored: node (l, j) draws
  normal(fold_in(fold_in(key, l), j)) x z C / m each time (6) uses it,
  where key is the round key ``info.key`` of the tree's first round
  (kept in the state as key data): secret, and fresh per tree, so the
  trees' noise is independent, as the accounting of restarts needs. A
  round draws i + 1 nodes, two on average.
* Every round is a leaf, a round without real participants too (g_t = 0):
  it adds its node noise like any other (an untouched model would tell
  it was empty). With z = 0 and gamma = 0 it leaves the model unchanged;
  the state's tree position still advances.
* Restarts (5) follow the authors' implementation: the tree starts again
  from the model it is given, with u = 0. ``restart_every`` None: one
  tree for the whole run. Norms are whole-model.

Privacy: ``Aggregator.noise_multiplier`` is a ``TreeAggregationNoise``, z
together with ``restart_every``, from which a run accounts the tree
(``fedjax_agg.privacy.tree_epsilons``: no amplification by sampling; the
participations of every client in each tree of the drawn cohorts count).

Memory: a sum over clients, so the rule streams (``Aggregator.stream``);
its state holds one model-sized tree (u).
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg.aggregators._clipped_sums import clipped_update_stats
from fedjax_agg.aggregators._clipped_sums import summed_client_stats
from fedjax_agg.aggregators._dp_fedavg import gaussian_noise
from fedjax_agg.types import Aggregator, Params, StreamingForm

__all__ = ["DPFTRLState", "TreeAggregationNoise", "dp_ftrl"]


class TreeAggregationNoise(float):
  """The noise multiplier z of a rule whose noise is tree-aggregated.

  A float (z, what ``Aggregator.noise_multiplier`` holds) that also tells
  a run's privacy accounting the trees' layout: ``restart_every`` rounds
  per tree (None: one tree).
  """

  def __new__(cls, noise_multiplier, restart_every: Optional[int] = None):
    value = super().__new__(cls, noise_multiplier)
    value.restart_every = restart_every
    return value

  def __repr__(self):
    return (f"TreeAggregationNoise({float(self)!r}, "
            f"restart_every={self.restart_every!r})")


class DPFTRLState(NamedTuple):
  """The current tree's FTRL state.

  Attributes:
    step: u_t = v_t - v_{t-1}, the last round's change of DP-FTRLM's v.
    tree_key: the key data of the tree's node noise.
    tree_round: [] int32, t, the rounds of the current tree so far (0
      before the first).
  """
  step: Params
  tree_key: jax.Array
  tree_round: jax.Array


def _key_data(key: jax.Array) -> jax.Array:
  # The state holds raw uint32 key data whichever key style ``info.key``
  # uses, so its dtype and shape are the same from the first round on.
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return key


def _noise_change(key_data: jax.Array, position: jax.Array, params: Params,
                  stddev) -> Params:
  """The node noise of s_t - s_{t-1} (Eq. 6) at tree position t >= 1."""
  key = jax.random.wrap_key_data(key_data)
  # t & -t isolates the lowest set bit of t; 31 minus its leading zeros
  # is that bit's index.
  lowest = 31 - jax.lax.clz(position & -position)  # i

  def add_node(carry):
    level, total = carry
    top = level == lowest  # the node completed at t, else one it replaces
    # Eq. (6): the completed node is indexed from t, the replaced ones from
    # t - 1 (they belong to B(t-1)); the node is added or subtracted to match.
    index = jnp.right_shift(jnp.where(top, position, position - 1),
                            level) - 1
    node_key = jax.random.fold_in(jax.random.fold_in(key, level), index)
    node = gaussian_noise(node_key, params, stddev)
    return level + 1, jax.tree.map(
        lambda a, n: jnp.where(top, a + n, a - n), total, node)

  zeros = jax.tree.map(jnp.zeros_like, params)
  # i + 1 nodes, a count that depends on the traced t: a while_loop
  # rather than a Python loop over the levels.
  _, total = jax.lax.while_loop(lambda carry: carry[0] <= lowest, add_node,
                                (jnp.zeros((), jnp.int32), zeros))
  return total


@run_context.derived_from_run(num_participants="cohort_size")
def dp_ftrl(clip_norm: float = 1.0, noise_multiplier: float = 0.0,
            server_learning_rate: float = 1.0, momentum: float = 0.0, *,
            num_participants: int,
            restart_every: Optional[int] = None) -> Aggregator:
  """DP-FTRL aggregator (user-level DP by tree aggregation, no sampling).

  Args:
    clip_norm: C > 0, the clip norm of every client's update.
    noise_multiplier: z >= 0, the node noise's standard deviation over the
      sensitivity C / m.
    server_learning_rate: eta > 0, FTRL's step (1 / the regularisation).
    momentum: gamma in [0, 1) (DP-FTRLM; 0: DP-FTRL).
    num_participants: m >= 1, the fixed denominator: the cohort size.
    restart_every: rounds per tree (a new tree and FTRL restarted from the
      current model after that many rounds), or None: one tree.

  Returns:
    An ``Aggregator`` with a streaming form, ``noise_multiplier`` a
    ``TreeAggregationNoise`` (z with ``restart_every``) and
    ``expected_clients`` m; metrics hold "fraction_clipped" [] (of the
    real participants), "noise_stddev" [] (of the noise in s_t per
    coordinate, z C / m sqrt(|B(t)|)) and "tree_round" [] (t).

  Raises:
    ValueError, TypeError: naming the argument out of range.
  """
  checks.check_range("clip_norm", clip_norm, 0, low_open=True)
  checks.check_range("noise_multiplier", noise_multiplier, 0)
  checks.check_range("server_learning_rate", server_learning_rate, 0,
                     low_open=True)
  checks.check_range("momentum", momentum, 0, 1, high_open=True)
  checks.check_int("num_participants", num_participants, 1)
  if restart_every is not None:
    checks.check_int("restart_every", restart_every, 1)
  client_stats = functools.partial(clipped_update_stats, max_norm=clip_norm,
                                   weighted=False)
  node_stddev = noise_multiplier * clip_norm / num_participants
  # A concrete z = 0 skips the node draws entirely; a traced z (a sweep)
  # must draw them, scaled by its value.
  noiseless = not checks.is_traced(noise_multiplier) and noise_multiplier == 0

  def init(global_params):
    # The key is a placeholder: tree_round 0 makes the first round start a
    # tree with that round's own key.
    return DPFTRLState(jax.tree.map(jnp.zeros_like, global_params),
                       _key_data(jax.random.key(0)),
                       jnp.zeros((), jnp.int32))

  def finalize(global_params, stats, info, state):
    new_tree = state.tree_round == 0
    if restart_every is not None:  # Eq. (5)
      new_tree = new_tree | (state.tree_round >= restart_every)
    position = jnp.where(new_tree, 1, state.tree_round + 1).astype(
        jnp.int32)
    # A new tree takes a fresh, secret key: the trees' noises must be
    # independent for the accounting of restarts.
    tree_key = jnp.where(new_tree, _key_data(info.key), state.tree_key)
    # Eq. (1): minus the clipped updates' sum over the fixed denominator,
    # then Eq. (6): plus the change of the tree's noise.
    scale = -1.0 / num_participants
    noise = (jax.tree.map(jnp.zeros_like, global_params) if noiseless else
             _noise_change(tree_key, position, global_params, node_stddev))
    prefix_change = jax.tree.map(
        lambda x, n: x * jnp.asarray(scale, x.dtype) + n,
        stats.sums.weighted, noise)
    # Eq. (3) as u_t = gamma u_{t-1} + s_t - s_{t-1}, then Eq. (4).
    step = jax.tree.map(
        lambda u, d: (jnp.where(new_tree, 0.0, momentum) * u + d).astype(
            d.dtype), state.step, prefix_change)
    new_params = jax.tree.map(
        lambda w, u: (w - server_learning_rate * u).astype(w.dtype),
        global_params, step)
    num_nodes = jax.lax.population_count(position).astype(jnp.float32)
    return new_params, DPFTRLState(step, tree_key, position), {
        "fraction_clipped": (stats.num_clipped
                             / jnp.maximum(stats.sums.count, 1.0)),
        "noise_stddev": jnp.asarray(node_stddev * jnp.sqrt(num_nodes),
                                    jnp.float32),
        "tree_round": position.astype(jnp.float32)}

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=False)
    return finalize(global_params, summed_client_stats(
        client_stats, global_params, client_params, info), info, state)

  # A tracer cannot become a float subclass; runs account from rules built
  # with concrete hyperparameters.
  rule_noise = (noise_multiplier if checks.is_traced(noise_multiplier)
                else TreeAggregationNoise(noise_multiplier, restart_every))
  return Aggregator(init, aggregate, StreamingForm(client_stats, finalize),
                    noise_multiplier=rule_noise,
                    expected_clients=num_participants)
