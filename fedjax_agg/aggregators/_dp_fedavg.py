"""DP-FedAvg: user-level differentially private FedAvg, adaptive clipping.

McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018 (Algorithm 1, fixed denominator);
Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning
with Adaptive Clipping", NeurIPS 2021 (Algorithm 1).

Round t over the m real participants (mask 1), clip norm C, denominator
D (below):

  Alg. 1 (2018)  dw_k <- dw_k min(1, C / |dw_k|),  dw_k = w_k - w_t
                 w_{t+1} = w_t + (sum_k dw_k + N(0, (sigma_dw C)^2 I)) / D
  Alg. 1 (2021)  b_k = 1 if |dw_k| <= C else 0
                 b = (sum_k b_k + N(0, sigma_b^2)) / D
                 C <- C exp(-eta_C (b - gamma))
  Thm. 1 (2021)  sigma_dw = (z^-2 - (2 sigma_b)^-2)^(-1/2)

z is ``noise_multiplier``, the noise multiplier of the whole round for the
privacy accounting (``fedjax_agg.privacy``): without adaptive clipping
sigma_dw = z; with it the clipped-count query takes its share of the
budget, so the update noise grows to sigma_dw (two Gaussian queries of
sensitivities C and 1/2 compose as one of multiplier z).

Interpretations:
* The denominator D. With ``expected_clients`` given, D = expected_clients
  = qN, the expected cohort size: McMahan et al.'s fixed-denominator
  estimator, the same D every round whatever the realised m, so the noise
  on the update has the standard deviation sigma_dw C / qN that the
  accountant assumes under Poisson sampling (dividing by the realised m
  would make it depend on who was drawn). Without it (None), D = max(m, 1):
  for fixed-size cohorts, where m is the cohort size (smaller only when
  participants were excluded as non-finite). Every client weighs the same
  (w_k = 1): the number of examples is unused.
* Every round adds its noise, including a round with no real participant
  (an empty Poisson draw, or every participant excluded as non-finite):
  the accountant counts each round as a Gaussian release, and an empty
  round left exactly unchanged would also tell that it was empty. Its
  update is the noise alone, N(0, (sigma_dw C / D)^2 I); with z = 0 the
  model stays. With ``adaptive`` an empty round also takes its Alg. 1
  (2021) step, with sum_k b_k = 0: b = N(0, sigma_b^2) / D, so C is
  multiplied by exp(eta_C (gamma - b)), by exp(eta_C gamma) when z = 0
  (the noised count is released as in any round; without
  ``expected_clients`` D = 1 there, so its noise is sigma_b itself).
* Norms are whole-model (all leaves together). The noise is drawn from
  the round's key ``info.key`` (split once: update noise, count noise).
* ``clipped_count_stddev`` (sigma_b) defaults to 5 z: the paper's
  sigma_b = m / 20 at its cohort of m = 100 clients and z = 1, i.e. the
  count takes 1 % of the privacy budget ((2 sigma_b)^-2 = z^-2 / 100,
  sigma_dw = z / sqrt(0.99)) whatever z. Pass m / 20 for the paper's
  rule at another cohort size. It must exceed z / 2 (else no sigma_dw
  exists: the count alone would spend the budget).
* The clip norm lives in the state (fixed unless ``adaptive``); the round
  clips with the state's C, then updates it.
* The ``Aggregator`` carries ``noise_multiplier`` (z) and
  ``expected_clients`` for the privacy accounting of a run.

Flower compatibility. ``flower_compatible=True`` reproduces the
``aggregate_fit`` of Flower's central-DP wrappers around its ``FedAvg``
strategy: ``DifferentialPrivacyServerSideFixedClipping`` and
``DifferentialPrivacyClientSideFixedClipping``
(``flwr/server/strategy/dp_fixed_clipping.py``), and, with ``adaptive``,
``DifferentialPrivacyServerSideAdaptiveClipping`` and
``DifferentialPrivacyClientSideAdaptiveClipping``
(``flwr/server/strategy/dp_adaptive_clipping.py``; their
``aggregate_train`` in ``flwr/serverapp/strategy/`` computes the same),
with the noise's standard deviation from ``compute_stdv`` and sigma_b,
sigma_dw from ``compute_adaptive_noise_params``
(``flwr/common/differential_privacy.py``). ``expected_clients`` is then
required: it is Flower's ``num_sampled_clients``. What changes:
* Weighting: the clipped updates are averaged with FedAvg's weights,
  sum_k n_k dw_k / sum_k n_k (n_k = ``num_examples``), not summed and
  divided by D.
* Update noise: N(0, (sigma_dw C' / qN)^2) per coordinate on that mean,
  where C' is the clip norm after this round's adaptive step (Flower
  steps C before it draws the noise; the papers noise with the C that
  clipped). With a fixed clip norm C' = C and the standard deviation is
  the library's, z C / qN.
* Empty round (no real participant): the model is left unchanged and no
  noise is drawn (Flower's inner ``FedAvg.aggregate_fit`` returns no
  parameters, so no noise is added); with ``adaptive`` the clip norm is
  kept too (Flower's count divides by the number of results, zero there).
* Adaptive step: Flower counts the clipped clients (|dw_k| > C, its
  "norm bit") where Alg. 1 (2021) counts the unclipped ones, with
  Alg. 1's sign, C <- C exp(-eta_C ((sum_k 1[|dw_k| > C]
  + N(0, sigma_b^2)) / m - (1 - gamma))), and divides by the round's m rather
  than D. ``target_quantile`` keeps its one meaning, the fraction of
  unclipped updates C aims at: Flower's ``target_clipped_quantile`` is
  1 - gamma, and the step is C <- C exp(-eta_C (clipped / m - (1 -
  gamma))), so both modes rest where a fraction gamma is unclipped. From
  there C moves the other way: a cohort clipped more often than 1 - gamma
  shrinks C further.
* ``clipped_count_stddev`` defaults to qN / 20 (0 when z = 0), Flower's
  default, instead of 5 z; sigma_dw is computed as above (Thm. 1).
Flower's weighted mean bounds one client's influence by C n_k / sum n,
not C / qN, and its noise follows C', which may be below the C that
clipped: the accounting in ``fedjax_agg.privacy`` assumes the papers'
rule and does not hold for this mode, so the rule then declares no
``noise_multiplier`` and a run with ``config.Privacy`` refuses it.

Breakdown point: 0 (a mean); each client's influence is bounded by C / D.

Memory: a sum over clients, so with a fixed clip norm the rule streams
(``Aggregator.stream``; the noise is drawn in ``finalize``). With
``adaptive=True`` it has no streaming form: the clients clip with the
state's C, which the streaming contract does not pass to
``client_stats``; the round then holds the stacked [K, ...] models.
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_agg import checks
from fedjax_agg import run_context
from fedjax_agg import tree_math
from fedjax_agg.aggregators._clipped_sums import clipped_update_stats
from fedjax_agg.aggregators._clipped_sums import summed_client_stats
from fedjax_agg.types import Aggregator, Params, PRNGKey, StreamingForm

__all__ = ["DPFedAvgState", "dp_fedavg", "gaussian_noise",
           "update_noise_multiplier"]


class DPFedAvgState(NamedTuple):
  """The clip norm C [] (float32) used by the next round."""
  clip_norm: jax.Array


def update_noise_multiplier(noise_multiplier, clipped_count_stddev):
  """sigma_dw = (z^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al., Thm. 1).

  0 for z = 0; requires 2 sigma_b > z otherwise (checked by the caller).
  """
  z = jnp.asarray(noise_multiplier, jnp.float32)
  count = jnp.asarray(clipped_count_stddev, jnp.float32)
  # sigma_b = 0 is allowed only with z = 0 (2 sigma_b > z fails
  # otherwise); the ratio is then 0 instead of 0 / 0.
  ratio = jnp.where(count > 0, z / (2.0 * jnp.where(count > 0, count, 1.0)),
                    0.0)
  return z / jnp.sqrt(1.0 - jnp.square(ratio))


def gaussian_noise(key: PRNGKey, tree: Params, stddev) -> Params:
  """N(0, stddev^2) per coordinate, a tree like ``tree`` (one key per leaf)."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  return treedef.unflatten([
      jnp.asarray(stddev, leaf.dtype)
      * jax.random.normal(leaf_key, leaf.shape, leaf.dtype)
      for leaf_key, leaf in zip(keys, leaves, strict=True)])


@run_context.derived_from_run(expected_clients="expected_clients")
def dp_fedavg(clip_norm: float = 1.0, noise_multiplier: float = 1.0,
              adaptive: bool = False, target_quantile: float = 0.5,
              clip_learning_rate: float = 0.2,
              clipped_count_stddev: Optional[float] = None,
              expected_clients: Optional[float] = None,
              flower_compatible: bool = False) -> Aggregator:
  """DP-FedAvg aggregator (user-level DP, optional adaptive clipping).

  Args:
    clip_norm: C > 0, the (initial, when adaptive) clip norm.
    noise_multiplier: z >= 0, the round's noise multiplier for accounting.
    adaptive: update C toward the ``target_quantile`` of the update norms.
    target_quantile: gamma in [0, 1], the quantile of norms C tracks
      (the fraction of unclipped updates it aims at), in both modes: with
      ``flower_compatible`` it is Flower's ``target_clipped_quantile``
      = 1 - gamma.
    clip_learning_rate: eta_C >= 0, the geometric step of C.
    clipped_count_stddev: sigma_b >= 0, the noise of the clipped count
      (used when adaptive; default 5 z, see the module docstring).
    expected_clients: qN > 0, the fixed denominator of the update and of
      the adaptive count (McMahan et al. 2018): the expected cohort size
      under Poisson sampling with rate q over N clients. None: divide by
      the round's number of real participants, max(m, 1), as suits
      fixed-size cohorts.
    flower_compatible: reproduce Flower's DP wrappers around ``FedAvg``
      (``flwr/server/strategy/dp_fixed_clipping.py`` and
      ``dp_adaptive_clipping.py``, ``aggregate_fit``): weighting by
      ``num_examples``, noise with the stepped clip norm and none in an
      empty round, clipped-count step, ``clipped_count_stddev`` default
      qN / 20 (module docstring). Requires ``expected_clients``.

  Returns:
    An ``Aggregator`` (with a streaming form unless ``adaptive``) whose
    ``noise_multiplier`` is z and ``expected_clients`` the argument;
    metrics hold "clip_norm" [] (the C used this round), "fraction_clipped"
    [] (of the real participants) and "noise_stddev" [] (of the noise
    added to each coordinate of the update, sigma_dw C / D; with
    ``flower_compatible`` sigma_dw C' / qN, 0 in an empty round).

  Raises:
    ValueError: naming the argument out of range,
      ``clipped_count_stddev`` <= z / 2 with ``adaptive``, or
      ``flower_compatible`` without ``expected_clients``.
  """
  checks.check_range("clip_norm", clip_norm, 0, low_open=True)
  checks.check_range("noise_multiplier", noise_multiplier, 0)
  checks.check_bool("adaptive", adaptive)
  checks.check_range("target_quantile", target_quantile, 0, 1)
  checks.check_range("clip_learning_rate", clip_learning_rate, 0)
  checks.check_bool("flower_compatible", flower_compatible)
  if expected_clients is not None:
    checks.check_range("expected_clients", expected_clients, 0,
                       low_open=True)
  elif flower_compatible:
    raise ValueError(
        "expected_clients is required with flower_compatible (it is "
        "Flower's num_sampled_clients, the noise's denominator)")
  if clipped_count_stddev is None and flower_compatible:
    # Flower's compute_adaptive_noise_params: num_sampled_clients / 20,
    # 0 without noise.
    # A traced z (a sweep vmapped over the multiplier) cannot drive a Python
    # if; the same choice is made with jnp.where.
    if checks.is_traced(noise_multiplier):
      clipped_count_stddev = jnp.where(noise_multiplier > 0,
                                       expected_clients / 20.0, 0.0)
    else:
      clipped_count_stddev = (expected_clients / 20.0
                              if noise_multiplier > 0 else 0.0)
  elif clipped_count_stddev is None:
    clipped_count_stddev = 5.0 * noise_multiplier
  else:
    checks.check_range("clipped_count_stddev", clipped_count_stddev, 0)
  if not adaptive:
    update_multiplier, count_stddev = noise_multiplier, 0.0
  else:
    if not (checks.is_traced(noise_multiplier)
            or checks.is_traced(clipped_count_stddev)
            or noise_multiplier == 0
            or 2 * clipped_count_stddev > noise_multiplier):
      raise ValueError(
          "clipped_count_stddev must exceed noise_multiplier / 2 = "
          f"{noise_multiplier / 2} with adaptive clipping (the clipped "
          "count would spend the whole privacy budget), got "
          f"{clipped_count_stddev}")
    update_multiplier = update_noise_multiplier(noise_multiplier,
                                                clipped_count_stddev)
    count_stddev = clipped_count_stddev
  # The streaming form may clip with the constructor's C: it exists only
  # without adaptive clipping, where the state's C never moves.
  stream_stats = functools.partial(clipped_update_stats, max_norm=clip_norm,
                                   weighted=flower_compatible)

  def init(global_params):
    del global_params
    return DPFedAvgState(jnp.asarray(clip_norm, jnp.float32))

  def flower_finalize(global_params, stats, info, state):
    # Flower's DP wrappers' aggregate_fit (module docstring).
    clip = state.clip_norm
    num_real = stats.sums.count
    any_real = num_real > 0
    update_key, count_key = jax.random.split(info.key)
    new_clip = clip
    if adaptive:
      # Noised fraction of clipped clients over the m results, C stepped.
      clipped = (stats.num_clipped
                 + count_stddev * jax.random.normal(count_key))
      # Flower's target_clipped_quantile is 1 - gamma (module docstring).
      stepped = clip * jnp.exp(-clip_learning_rate
                               * (clipped / jnp.maximum(num_real, 1.0)
                                  - (1.0 - target_quantile)))
      new_clip = jnp.where(any_real, stepped, clip)
    # compute_stdv(z, C', num_sampled_clients), none in an empty round.
    stddev = jnp.where(
        any_real,
        update_multiplier * new_clip / jnp.asarray(expected_clients,
                                                   jnp.float32), 0.0)
    update = tree_math.add_update(
        tree_math.mean_from_sums(stats.sums),  # sum n_k dw_k / sum n_k
        gaussian_noise(update_key, global_params, stddev))
    new_global = jax.tree.map(lambda new, old: jnp.where(any_real, new, old),
                              tree_math.add_update(global_params, update),
                              global_params)
    return (new_global, DPFedAvgState(new_clip.astype(jnp.float32)), {
        "clip_norm": clip,
        "fraction_clipped": (stats.num_clipped
                             / jnp.maximum(num_real, 1.0)),
        "noise_stddev": jnp.asarray(stddev, jnp.float32)})

  def finalize(global_params, stats, info, state):
    if flower_compatible:
      return flower_finalize(global_params, stats, info, state)
    clip = state.clip_norm
    num_real = stats.sums.count
    if expected_clients is None:
      denominator = jnp.maximum(num_real, 1.0)
    else:
      denominator = jnp.asarray(expected_clients, jnp.float32)
    # Split the same way with or without adaptive, so the update noise of a
    # round is the same draw in both modes.
    update_key, count_key = jax.random.split(info.key)
    # Alg. 1 (2018): noise sigma_dw C on the sum, then / D. Every round,
    # empty or not (module docstring).
    stddev = update_multiplier * clip / denominator
    clipped_sum = stats.sums.weighted  # unweighted: sum_k clipped dw_k
    inverse = 1.0 / denominator
    update = tree_math.add_update(
        jax.tree.map(lambda x: x * inverse.astype(x.dtype), clipped_sum),
        gaussian_noise(update_key, global_params, stddev))
    new_clip = clip
    if adaptive:
      # Alg. 1 (2021): noised fraction of unclipped clients, geometric step.
      unclipped = (num_real - stats.num_clipped
                   + count_stddev * jax.random.normal(count_key))
      new_clip = clip * jnp.exp(-clip_learning_rate
                                * (unclipped / denominator
                                   - target_quantile))
    # The clip norm is stored as float32 explicitly: the state's dtype must
    # stay the same from round to round (a change would retrace the step).
    return (tree_math.add_update(global_params, update),
            DPFedAvgState(new_clip.astype(jnp.float32)), {
                "clip_norm": clip,
                "fraction_clipped": (stats.num_clipped
                                     / jnp.maximum(num_real, 1.0)),
                "noise_stddev": jnp.asarray(stddev, jnp.float32)})

  def aggregate(global_params, client_params, info, state):
    checks.check_cohort(global_params, client_params, info,
                        uses_num_examples=flower_compatible)
    client_stats = functools.partial(
        clipped_update_stats, max_norm=state.clip_norm,
        weighted=flower_compatible)
    return finalize(global_params, summed_client_stats(
        client_stats, global_params, client_params, info), info, state)

  stream = None if adaptive else StreamingForm(stream_stats, finalize)
  # Flower's weighting gives a client influence C n_k / sum_j n_j, not
  # C / D, so the Gaussian mechanism's accounting does not hold: such a
  # rule declares no calibrated noise and runs refuse to account it.
  return Aggregator(init, aggregate, stream,
                    noise_multiplier=(None if flower_compatible
                                      else noise_multiplier),
                    expected_clients=expected_clients)
