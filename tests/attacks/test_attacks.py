"""Simulated malicious clients: each attack against its formula in numpy."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import engine
from fedjax_agg import federated
from fedjax_agg import simulation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import LocalUpdate
from fedjax_agg.types import Model
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model

TRAINING = LocalTraining(batch_size=3, learning_rate=0.2,
                         compute_losses=False)
QUIET = Execution(clients_per_step=2, progress=False)
# Five real clients and a padding row that repeats a malicious id.
IDS = jnp.array([0, 1, 2, 3, 4, 1])
MASK = jnp.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
BAD = (1, 3)
MALICIOUS = np.array([False, True, False, True, False, False])
HONEST = np.array([True, False, True, False, True, False])
KEY = jax.random.key(7)


@pytest.fixture(scope="module")
def setup():
  data, x, y, parts = tiny_data()
  model = tiny_model()
  params = model.init(jax.random.key(1))
  trainer = engine.make_local_trainer(model, TRAINING, clients_per_step=2)
  return data, x, y, parts, model, params, trainer


def _args(data):
  steps = jnp.where(MASK > 0, engine.full_steps(data, IDS, 3, 1), 0)
  return IDS, MASK, jnp.full(IDS.shape, 0.2), steps


def _clean(setup, data=None):
  """The cohort's models without any attack."""
  data0, *_, params, trainer = setup
  data = data0 if data is None else data
  ids, _, lrs, steps = _args(data)
  return jax.jit(trainer)(params, data, ids, lrs, steps, KEY).client_params


def _attacked_fn(setup, attack, adversaries=None, update=None):
  """The jitted attacked update of the cohort: ``fn(state, key)``."""
  data, *_, params, trainer = setup
  update = attacks.with_attack(
      attack, adversaries or attacks.fixed(data.num_clients, ids=BAD),
      trainer if update is None else update)
  ids, mask, lrs, steps = _args(data)
  fn = jax.jit(update.update)
  return lambda state, key: fn(state, params, data, ids, mask, lrs, steps,
                               jnp.int32(1), key)


def _attacked(setup, attack, adversaries=None, state=(), update=None):
  return _attacked_fn(setup, attack, adversaries, update)(state, KEY)


def _flat(stacked):
  """[K, P] numpy: every client's params as one vector."""
  return np.concatenate([np.asarray(a).reshape(a.shape[0], -1)
                         for a in jax.tree.leaves(stacked)], axis=1)


def _flat_one(params):
  return np.concatenate([np.asarray(a).ravel()
                         for a in jax.tree.leaves(params)])


def _normal_ppf(p):
  """Φ^{-1}(p) by bisection on math.erf."""
  low, high = -10.0, 10.0
  for _ in range(200):
    mid = (low + high) / 2
    if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < p:
      low = mid
    else:
      high = mid
  return (low + high) / 2


def _check_rows(got, clean, malicious_rows):
  """Non-malicious rows bit-identical to ``clean``; malicious as given."""
  got, clean = _flat(got), _flat(clean)
  np.testing.assert_array_equal(got[~MALICIOUS], clean[~MALICIOUS])
  np.testing.assert_allclose(got[MALICIOUS], malicious_rows, rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize("attack, formula", [
    (attacks.sign_flip(), lambda w, g: g - (w - g)),
    (attacks.sign_flip(scale=2.5), lambda w, g: g - 2.5 * (w - g)),
    (attacks.scale_update(5.0), lambda w, g: g + 5.0 * (w - g)),
    (attacks.free_rider(), lambda w, g: np.broadcast_to(g, w.shape)),
    (attacks.nonfinite(), lambda w, g: np.full_like(w, np.nan)),
    (attacks.nonfinite(-math.inf), lambda w, g: np.full_like(w, -np.inf)),
])
def test_update_attacks_follow_their_formula(setup, attack, formula):
  params = setup[5]
  clean = _clean(setup)
  result, state, metrics = _attacked(setup, attack)
  g = _flat_one(params)[None]
  _check_rows(result.client_params, clean,
              formula(_flat(clean)[MALICIOUS], g))
  assert state == ()
  np.testing.assert_array_equal(metrics["malicious"], MALICIOUS)
  assert float(metrics["num_malicious"]) == 2.0


def test_gaussian_is_noise_around_the_global_model(setup):
  params = setup[5]
  clean = _clean(setup)
  attacked = _attacked_fn(setup, attacks.gaussian(stddev=0.5))
  got = _flat(attacked((), KEY)[0].client_params)
  np.testing.assert_array_equal(got[~MALICIOUS], _flat(clean)[~MALICIOUS])
  noise = got[MALICIOUS] - _flat_one(params)[None]
  assert 0.4 < noise.std() < 0.6 and abs(noise.mean()) < 0.1
  assert not np.allclose(noise[0], noise[1])  # independent per client
  np.testing.assert_array_equal(
      _flat(attacked((), KEY)[0].client_params), got)
  other = _flat(attacked((), jax.random.key(8))[0].client_params)
  assert not np.allclose(other[MALICIOUS], got[MALICIOUS])


def _honest_numpy(clean, g):
  updates = _flat(clean)[HONEST] - g
  return updates.mean(axis=0), updates.std(axis=0)


def test_little_is_enough_matches_numpy(setup):
  params = setup[5]
  clean = _clean(setup)
  g = _flat_one(params)
  mu, sigma = _honest_numpy(clean, g)
  # n = 5 real, m = 2 malicious: s = floor(3.5) - 2 = 1, z = Φ^-1(4/5).
  z = _normal_ppf(4 / 5)
  result, _, _ = _attacked(setup, attacks.little_is_enough())
  want = np.broadcast_to(g + mu - z * sigma, (2, g.size))
  np.testing.assert_allclose(_flat(result.client_params)[MALICIOUS], want,
                             rtol=1e-5, atol=1e-6)
  _check_rows(result.client_params, clean, want)
  fixed_z, _, _ = _attacked(setup, attacks.little_is_enough(z=1.5))
  _check_rows(fixed_z.client_params, clean,
              np.broadcast_to(g + mu - 1.5 * sigma, (2, g.size)))


def test_inner_product_matches_numpy(setup):
  params = setup[5]
  clean = _clean(setup)
  g = _flat_one(params)
  mu, _ = _honest_numpy(clean, g)
  result, _, _ = _attacked(setup, attacks.inner_product(epsilon=0.1))
  _check_rows(result.client_params, clean,
              np.broadcast_to(g - 0.1 * mu, (2, g.size)))


def test_default_z_is_the_papers_z_max():
  # n = 50, m = 10: s = floor(26) - 10 = 16, z = Φ^-1((50 - 16) / 50).
  np.testing.assert_allclose(attacks.little_is_enough_z(50, 10),
                             _normal_ppf(34 / 50), rtol=1e-5)
  # A malicious majority needs nobody: s is taken as 1.
  np.testing.assert_allclose(attacks.little_is_enough_z(10, 8),
                             _normal_ppf(9 / 10), rtol=1e-5)
  assert np.isfinite(jax.jit(attacks.little_is_enough_z)(7, 3))


def _cohort(malicious, mask=MASK):
  return attacks.Cohort(IDS, mask, jnp.asarray(malicious), jnp.int32(1),
                        KEY)


@pytest.mark.parametrize("attack", [attacks.little_is_enough(),
                                    attacks.inner_product(epsilon=2.0)])
def test_omniscient_attacks_read_only_honest_updates(setup, attack):
  params = setup[5]
  clean = _clean(setup)
  update = jax.jit(attack.update)
  want = update(params, clean, _cohort(MALICIOUS))
  # A malicious client's own model, or a padding row's, changes nothing.
  changed = jax.tree.map(
      lambda a: a.at[1].set(jnp.nan).at[3].add(100.0).at[5].set(jnp.inf),
      clean)
  got = update(params, changed, _cohort(MALICIOUS))
  np.testing.assert_array_equal(_flat(got)[MALICIOUS],
                                _flat(want)[MALICIOUS])
  # Without an honest client the malicious clients send g.
  everyone = update(params, clean, _cohort(MASK > 0))
  np.testing.assert_array_equal(
      _flat(everyone), np.broadcast_to(_flat_one(params), (6, 75)))


def _flipped_data(x, y, parts, permutation):
  flipped = np.array(y)
  for cid in BAD:
    flipped[parts[cid]] = permutation[y[parts[cid]]]
  return federated.from_partition(x, flipped, parts)


@pytest.mark.parametrize("permutation", [None, [1, 2, 0]])
def test_label_flip_trains_malicious_clients_on_flipped_labels(
    setup, permutation):
  data, x, y, parts, *_ = setup
  table = np.array([2, 1, 0] if permutation is None else permutation)
  poisoned = _flipped_data(x, y, parts, table)
  attack = attacks.label_flip(permutation)
  # The data side alone: exactly the malicious clients' labels change.
  got = jax.jit(attack.data)(data, _cohort(MALICIOUS))
  np.testing.assert_array_equal(got.y, poisoned.y)
  np.testing.assert_array_equal(got.x, data.x)
  # Malicious models are those trained on flipped labels, honest ones the
  # clean ones.
  result, _, metrics = _attacked(setup, attack)
  want = _flat(_clean(setup, poisoned))[MALICIOUS]
  _check_rows(result.client_params, _clean(setup), want)
  np.testing.assert_array_equal(metrics["malicious"], MALICIOUS)


def test_label_flip_with_num_classes(setup):
  data, x, y, parts, *_ = setup
  got = attacks.label_flip(num_classes=5).data(data, _cohort(MALICIOUS))
  want = np.array(y)
  for cid in BAD:
    want[parts[cid]] = 4 - y[parts[cid]]
  np.testing.assert_array_equal(got.y, want)


class _TenClasses(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(10)(x.reshape((x.shape[0], -1)))


def _ten_class_model() -> Model:
  module = _TenClasses()
  return Model(
      init=lambda key: module.init(key, jnp.zeros((1, 5))),
      apply=lambda params, x, train: (module.apply(params, x), params))


def _ten_class_update(setup, attack):
  """The jitted round update of ``attacks.local_update`` with a 10-class
  model on the tiny data (labels 0 .. 2, valid for 10 classes)."""
  data = setup[0]
  model = _ten_class_model()
  params = model.init(jax.random.key(1))
  update = attacks.local_update(model, TRAINING, attack,
                                attacks.fixed(data.num_clients, ids=BAD),
                                execution=QUIET)
  ids, mask, lrs, steps = _args(data)
  return lambda: jax.jit(update.update)((), params, data, ids, mask, lrs,
                                        steps, jnp.int32(1), KEY)


@pytest.mark.parametrize("permutation", [[1, 0], list(range(12))[::-1]],
                         ids=["2_of_10", "12_of_10"])
def test_label_flip_permutation_must_match_the_models_classes(
    setup, permutation):
  # [1, 0] would send classes 2 .. 9 to 0; 12 entries would create labels
  # 10 and 11 that the 10-class model does not have.
  with pytest.raises(ValueError, match=r"^permutation: .* written for "
                     rf"{len(permutation)} classes, but the model has C=10"):
    _ten_class_update(setup, attacks.label_flip(permutation))()
  # The same holds inside a composition.
  with pytest.raises(ValueError, match="permutation: .*C=10"):
    _ten_class_update(setup, attacks.compose(
        attacks.sign_flip(), attacks.label_flip(permutation)))()


def test_label_flip_with_a_permutation_of_the_models_classes(setup):
  data = setup[0]
  table = np.array([3, 7, 9, 0, 1, 2, 4, 5, 6, 8])
  attack = attacks.label_flip(table.tolist())
  assert attack.num_classes == 10
  result, _, metrics = _ten_class_update(setup, attack)()
  np.testing.assert_array_equal(metrics["malicious"], MALICIOUS)
  assert all(np.isfinite(leaf).all()
             for leaf in jax.tree.leaves(result.client_params))
  flipped = jax.jit(attack.data)(data, _cohort(MALICIOUS)).y
  labels = np.asarray(data.y)
  for cid in range(data.num_clients):
    held = np.asarray(data.client_indices[cid, :data.num_examples[cid]])
    want = table[labels[held]] if cid in BAD else labels[held]
    np.testing.assert_array_equal(np.asarray(flipped)[held], want)


def test_label_flip_permutation_is_checked_when_built():
  for permutation in ([1, 1, 0], [0, 2], [-1, 0], [0, 1, 3]):
    with pytest.raises(ValueError, match="permutation must be a "
                       "permutation of 0 .. "):
      attacks.label_flip(permutation)
  with pytest.raises(TypeError, match="permutation"):
    attacks.label_flip([])
  with pytest.raises(ValueError, match="num_classes"):
    attacks.compose(attacks.label_flip([1, 0]),
                    attacks.label_flip(num_classes=3))


def test_compose_chains_both_sides(setup):
  params = setup[5]
  clean = _clean(setup)
  g = _flat_one(params)[None]
  result, _, _ = _attacked(setup, attacks.compose(
      attacks.sign_flip(), attacks.scale_update(3.0)))
  _check_rows(result.client_params, clean,
              g - 3.0 * (_flat(clean)[MALICIOUS] - g))
  both = attacks.compose(attacks.label_flip(), attacks.free_rider())
  assert both.data is not None and both.update is not None
  result, _, _ = _attacked(setup, both)
  _check_rows(result.client_params, clean, np.broadcast_to(g, (2, 75)))


def test_per_round_picks_floor_fraction_of_the_real_clients():
  for fraction, size, real in [(0.5, 6, 5), (0.7, 12, 10), (0.3, 10, 10),
                               (0.0, 4, 4), (0.99, 8, 1)]:
    select = jax.jit(attacks.per_round(fraction).select)
    ids = jnp.arange(size)
    mask = jnp.arange(size) < real
    picks = []
    for seed in range(6):
      chosen = np.asarray(select(ids, mask.astype(jnp.float32),
                                 jax.random.key(seed)))
      assert chosen.sum() == math.floor(fraction * real)
      assert not chosen[real:].any()
      np.testing.assert_array_equal(
          chosen, select(ids, mask.astype(jnp.float32),
                         jax.random.key(seed)))
      picks.append(tuple(chosen))
    if 0 < math.floor(fraction * real) < real:
      assert len(set(picks)) > 1


def test_per_round_through_the_wrapper(setup):
  result, _, metrics = _attacked(setup, attacks.free_rider(),
                                 attacks.per_round(0.5))
  chosen = np.asarray(metrics["malicious"]) > 0
  assert chosen.sum() == 2 and not chosen[5]
  params = setup[5]
  np.testing.assert_array_equal(
      _flat(result.client_params)[chosen],
      np.broadcast_to(_flat_one(params), (2, 75)))


def test_fixed_picks_the_same_clients_every_round():
  adversaries = attacks.fixed(20, 0.25, seed=3)
  table = np.asarray(adversaries.table)
  assert table.sum() == 5
  np.testing.assert_array_equal(attacks.fixed(20, count=5, seed=3).table,
                                table)
  assert not np.array_equal(attacks.fixed(20, 0.25, seed=4).table, table)
  ids = jnp.array([3, 0, 17, 9, 12, 5, 3])
  mask = jnp.array([1, 1, 1, 1, 1, 1, 0.0])
  select = jax.jit(adversaries.select)
  for seed in range(3):
    chosen = np.asarray(select(ids, mask, jax.random.key(seed)))
    np.testing.assert_array_equal(chosen[:6], table[np.asarray(ids)][:6])
    assert not chosen[6]
  assert np.asarray(attacks.fixed(4, ids=[2]).table).tolist() == [
      False, False, True, False]


def test_fixed_adversaries_must_be_drawn_for_the_runs_population(setup):
  # fixed(100, 0.25) on 8 clients would make the ids < 8 of the 25 drawn
  # among 100 malicious: a fraction that has nothing to do with 0.25.
  data, x, y, _ = tiny_data(sizes=(3,) * 8)
  model = setup[4]
  update = attacks.local_update(model, TRAINING, attacks.sign_flip(),
                                attacks.fixed(100, fraction=0.25),
                                execution=QUIET)
  message = (r"^num_clients: the fixed adversaries were drawn for "
             r"num_clients=100 but the run has num_clients=8")
  with pytest.raises(ValueError, match=message):
    update.init(8)
  with pytest.raises(ValueError, match=message):
    simulation.run(model, data, (x, y), aggregators.fedavg(), num_rounds=1,
                   participation=1.0, training=TRAINING, execution=QUIET,
                   local_update=update, seed=0)
  # Drawn for the population, it runs; per_round needs no population.
  assert attacks.local_update(model, TRAINING, attacks.sign_flip(),
                              attacks.fixed(8, fraction=0.25)).init(8) == ()
  assert attacks.local_update(model, TRAINING, attacks.sign_flip(),
                              attacks.per_round(0.25)).init(8) == ()


def test_stateful_inner_update_keeps_its_state(setup):
  """The inner update records each client's last round; the wrapper passes
  its state (init included) and its metrics through."""
  data, *_, trainer = setup

  def update(last_round, global_params, data, ids, mask, lrs, steps,
             round_num, key):
    rows = jnp.where(mask > 0, ids, last_round.shape[0])
    return (trainer(global_params, data, ids, lrs, steps, key),
            last_round.at[rows].set(round_num + 10, mode="drop"),
            {"inner_round": round_num})

  inner = LocalUpdate(lambda n: jnp.full((n,), -1, jnp.int32), update)
  wrapped = attacks.with_attack(attacks.sign_flip(),
                                attacks.fixed(data.num_clients, ids=BAD),
                                inner)
  state = wrapped.init(data.num_clients)
  assert np.asarray(state).tolist() == [-1] * 5
  _, state, metrics = _attacked(setup, attacks.sign_flip(), state=state,
                                update=inner)
  assert np.asarray(state).tolist() == [11] * 5
  assert int(metrics["inner_round"]) == 1 and "malicious" in metrics


def _run(setup, attack, ids, rounds=2):
  data, x, y, _, model, *_ = setup
  update = attacks.local_update(model, TRAINING, attack,
                                attacks.fixed(data.num_clients, ids=ids),
                                execution=QUIET)
  return simulation.run(model, data, (x, y), aggregators.fedavg(),
                        num_rounds=rounds, participation=1.0,
                        training=TRAINING, execution=QUIET,
                        local_update=update, seed=0)


def test_simulation_records_the_malicious_clients(setup):
  result = _run(setup, attacks.sign_flip(scale=2.0), BAD)
  assert len(result.history.client_rows) == 2
  for row in result.history.client_rows:
    np.testing.assert_array_equal(row["malicious"],
                                  np.isin(row["client_ids"], BAD))
  assert [row["num_malicious"] for row in result.history.rows[1:]] == [
      2.0, 2.0]


def test_nonfinite_clients_are_excluded_by_the_round(setup):
  result = _run(setup, attacks.nonfinite(), (1,))
  assert [row["nonfinite_clients"] for row in result.history.rows[1:]] == [
      1, 1]
  assert all(np.isfinite(leaf).all()
             for leaf in jax.tree.leaves(result.state.params))


def test_registry_builds_every_attack():
  assert set(attacks.REGISTRY) == {
      "label_flip", "sign_flip", "scale", "gaussian", "free_rider",
      "nonfinite", "little_is_enough", "inner_product", "backdoor"}
  for name in attacks.REGISTRY:
    assert isinstance(attacks.build(name), attacks.Attack)
  assert isinstance(attacks.build("sign_flip", scale=10), attacks.Attack)
  with pytest.raises(ValueError, match="attack must be one of"):
    attacks.build("poison")
  with pytest.raises(TypeError, match="scale"):
    attacks.build("sign_flip", factor=2.0)


@pytest.mark.parametrize("build, error, name", [
    (lambda: attacks.per_round(1.0), ValueError, "fraction"),
    (lambda: attacks.per_round(-0.1), ValueError, "fraction"),
    (lambda: attacks.per_round("half"), TypeError, "fraction"),
    (lambda: attacks.fixed(10, 1.5), ValueError, "fraction"),
    (lambda: attacks.fixed(10, count=11), ValueError, "count"),
    (lambda: attacks.fixed(10, 0.1, count=1), ValueError, "exactly one"),
    (lambda: attacks.fixed(10, ids=[3, 3]), ValueError, "ids"),
    (lambda: attacks.fixed(0, 0.1), ValueError, "num_clients"),
    (lambda: attacks.gaussian(-1.0), ValueError, "stddev"),
    (lambda: attacks.gaussian(math.nan), ValueError, "stddev"),
    (lambda: attacks.sign_flip(math.inf), ValueError, "scale"),
    (lambda: attacks.sign_flip(0.0), ValueError, "scale"),
    (lambda: attacks.scale_update(math.nan), ValueError, "factor"),
    (lambda: attacks.nonfinite(1.0), ValueError, "value"),
    (lambda: attacks.little_is_enough(z=math.inf), ValueError, "z"),
    (lambda: attacks.inner_product(-0.5), ValueError, "epsilon"),
    (lambda: attacks.label_flip([0, 0, 1]), ValueError, "permutation"),
    (lambda: attacks.label_flip([0.5, 1.0]), TypeError, "permutation"),
    (lambda: attacks.label_flip([1, 0], num_classes=3), ValueError,
     "num_classes"),
    (lambda: attacks.build("nope"), ValueError, "attack"),
    (lambda: attacks.with_attack("sign_flip", attacks.per_round(0.1),
                                 lambda *a: None), TypeError, "attack"),
    (lambda: attacks.with_attack(attacks.sign_flip(), 0.1,
                                 lambda *a: None), TypeError, "adversaries"),
    (lambda: attacks.with_attack(attacks.sign_flip(), attacks.per_round(0.1),
                                 3), TypeError, "local_update"),
    (lambda: attacks.compose(attacks.sign_flip(), None), TypeError,
     "second"),
])
def test_bad_arguments_are_named(build, error, name):
  with pytest.raises(error, match=name):
    build()
