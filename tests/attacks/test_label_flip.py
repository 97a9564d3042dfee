"""Label flipping: the malicious clients train on flipped labels; the
permutation is checked when built and against the model's classes.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import attacks
from fedjax_agg import federated
from fedjax_agg.types import Model
from tests.attacks._util import _args
from tests.attacks._util import _attacked
from tests.attacks._util import _check_rows
from tests.attacks._util import _clean
from tests.attacks._util import _cohort
from tests.attacks._util import _flat
from tests.attacks._util import BAD
from tests.attacks._util import KEY
from tests.attacks._util import MALICIOUS
from tests.attacks._util import QUIET
from tests.attacks._util import TRAINING


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
