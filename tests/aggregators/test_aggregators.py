"""Tables over several registered rules: ``aggregators.get``'s argument
checks, the rules with a streaming form, permutation symmetry and a single
real participant for the robust rules (Krum, Bulyan, geometric median,
centered clipping, norm bounding), and outliers against the
coordinate-wise median and trimmed mean.
"""

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from fedjax_agg import aggregators
from fedjax_agg import testing
from tests import agg_testutil as tu
from tests.agg_testutil import EXAMPLES
from tests.aggregators._util import _assert_update
from tests.aggregators._util import _cohort
from tests.aggregators._util import _run
from tests.aggregators._util import garbage_cohort
from tests.aggregators._util import K
from tests.aggregators._util import MEDIAN
from tests.aggregators._util import MEDIAN_AGG
from tests.aggregators._util import permute_info
from tests.aggregators._util import TRIMMED
from tests.aggregators._util import TRIMMED_AGG


SYMMETRIC = [("krum", (("num_byzantine", 1), ("num_selected", 2))),
             ("bulyan", ()), ("geometric_median", ()),
             ("norm_bounding", ()), ("centered_clipping", (("radius", 1.0),))]


@pytest.mark.parametrize("name,items", SYMMETRIC)
@settings(max_examples=EXAMPLES, deadline=None)
@given(cohort=testing.cohorts(K), perm_seed=st.integers(0, 2**31))
def test_permuting_the_clients_changes_nothing(name, items, cohort,
                                               perm_seed):
  global_params, clients, info = cohort
  perm = np.random.default_rng(perm_seed).permutation(K)
  out, _, _ = _run(name, global_params, clients, info, **dict(items))
  p_out, _, _ = _run(name, global_params, tu.take_rows(clients, perm),
                     permute_info(info, perm), **dict(items))
  tu.assert_trees_close(p_out, out, rtol=1e-5, atol=1e-5)


def test_a_single_real_participant_is_its_own_aggregate():
  mask = [0, 0, 0, 1, 0, 0]
  global_params, clients, info, updates, _ = garbage_cohort(4, mask)
  for name in ("krum", "bulyan", "geometric_median", "centered_clipping"):
    out, _, _ = _run(name, global_params, clients, info)
    _assert_update(out, global_params, updates[0], atol=1e-5)


@pytest.mark.parametrize("name,kwargs,arg", [
    ("krum", {"num_byzantine": -1}, "num_byzantine"),
    ("krum", {"num_selected": 0}, "num_selected"),
    ("krum", {"num_selected": 1.5}, "num_selected"),
    ("geometric_median", {"max_iterations": 0}, "max_iterations"),
    ("geometric_median", {"tolerance": -1.0}, "tolerance"),
    ("geometric_median", {"smoothing": 0.0}, "smoothing"),
    ("centered_clipping", {"radius": 0.0}, "radius"),
    ("centered_clipping", {"num_iterations": 0}, "num_iterations"),
    ("norm_bounding", {"max_norm": -2.0}, "max_norm"),
    ("bulyan", {"num_byzantine": -1}, "num_byzantine"),
    ("qffl", {"q": -1.0}, "q"),
    ("qffl", {"lipschitz": 0.0}, "lipschitz"),
])
def test_bad_arguments_name_the_argument(name, kwargs, arg):
  with pytest.raises((ValueError, TypeError), match=arg):
    aggregators.get(name, **kwargs)


@settings(max_examples=EXAMPLES)
@given(seed=st.integers(0, 2**31), num_bad=st.integers(0, 2),
       sign=st.sampled_from([-1.0, 1.0]))
def test_a_minority_of_huge_outliers_stays_outside(seed, num_bad, sign):
  # 2 of 6 real clients send +-1e6 (the same side: the worst case); the
  # median and the 0.34-trimmed mean stay within the honest clients' range.
  global_params, clients, info, _ = _cohort(seed, [1.0] * K)
  clients = jax.tree.map(lambda c: c.at[:num_bad].set(sign * 1e6), clients)
  honest = jax.tree.map(lambda c: np.asarray(c)[num_bad:], clients)
  for rule, aggregate in ((MEDIAN, MEDIAN_AGG),
                          (TRIMMED[0.34], TRIMMED_AGG[0.34])):
    out, _, _ = aggregate(global_params, clients, info,
                          rule.init(global_params))
    for got, values in zip(jax.tree.leaves(out), jax.tree.leaves(honest),
                           strict=True):
      assert np.all(got >= values.min(axis=0) - 1e-5)
      assert np.all(got <= values.max(axis=0) + 1e-5)


# The rules that are a single-pass sum over clients, and only those.
STREAMING = {"fedavg", "fednnnn", "norm_norm", "momentum", "fedopt",
             "fedavgm", "fedadam", "fedyogi", "fedadagrad", "norm_bounding",
             "dp_fedavg", "dp_ftrl", "fednova", "feddyn", "ffa_lora"}


def test_rules_with_a_streaming_form():
  assert STREAMING <= set(aggregators.REGISTRY)
  for name in aggregators.REGISTRY:
    assert (tu.build(name).stream is not None) == (name in STREAMING), name
