"""The pixel-pattern backdoor (Bagdasaryan et al., AISTATS 2020) and the
run's scored sets (``config.Evaluation.extra``) that give its attack
success, against numpy."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import attacks
from fedjax_agg import federated
from fedjax_agg import simulation
from fedjax_agg.attacks._backdoor import trigger_mask
from fedjax_agg.evaluation import EvalSet
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining
from tests.attacks._util import _cohort
from tests.attacks._util import BAD
from tests.attacks._util import IDS
from tests.attacks._util import KEY
from tests.attacks._util import MALICIOUS
from tests.test_engine import tiny_data
from tests.test_engine import tiny_model


def np_poison(x, y, parts, fraction, size, target, value=None):
  """The malicious clients' first ceil(fraction n) examples (in their index
  order) with the last ``size`` features set to ``value`` (default: the
  largest input) and label ``target``."""
  x, y = np.array(x), np.array(y)
  fill = x.max() if value is None else value
  for cid in BAD:
    # The fraction as written (0.1 is 1/10), the ceiling exact.
    rows = parts[cid][:math.ceil(Fraction(repr(fraction))
                                 * len(parts[cid]))]
    x[np.ix_(rows, np.arange(x.shape[1] - size, x.shape[1]))] = fill
    y[rows] = target
  return x, y


@pytest.mark.parametrize("fraction,size,value", [(0.5, 2, None),
                                                 (1.0, 1, -3.0),
                                                 (0.1, 5, 7.0)])
def test_only_the_malicious_clients_examples_are_poisoned(fraction, size,
                                                         value):
  data, x, y, parts = tiny_data()
  attack = attacks.backdoor(target=2, poison_fraction=fraction,
                            trigger_size=size, trigger_value=value)
  assert attack.update is None
  got = jax.jit(attack.data)(data, _cohort(MALICIOUS))
  want_x, want_y = np_poison(x, y, parts, fraction, size, 2, value)
  np.testing.assert_array_equal(got.x, want_x)
  np.testing.assert_array_equal(got.y, want_y)
  # No malicious row: nothing changes (the padding row repeats id 1).
  clean = attack.data(data, _cohort(np.zeros(len(IDS), bool)))
  np.testing.assert_array_equal(clean.x, x)
  np.testing.assert_array_equal(clean.y, y)


# The shares as meant (1/3 as given by Python's 1 / 3); 0.3 and 0.6 were
# the ones float32 got wrong below 300 examples (0.3 of 100: 31), 0.07 one
# float64 gets wrong (0.07 * 100 = 7.000000000000001).
EXACT_SHARES = [Fraction(1, 10), Fraction(1, 5), Fraction(3, 10),
                Fraction(3, 5), Fraction(7, 10), Fraction(1, 3),
                Fraction(7, 100), Fraction(1, 2), Fraction(1)]


@pytest.mark.parametrize("share", EXACT_SHARES,
                         ids=lambda share: str(share).replace("/", "_"))
def test_the_poisoned_count_is_the_exact_ceiling(share):
  # 300 clients holding 1 to 300 examples, all malicious, labels 1: the
  # examples relabelled to the target 0 are each client's poisoned count.
  sizes = np.arange(1, 301)
  starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
  parts = [np.arange(start, start + size)
           for start, size in zip(starts, sizes, strict=True)]
  x = np.zeros((int(sizes.sum()), 2), np.float32)
  data = federated.from_partition(x, np.ones(len(x), np.int32), parts)
  ids = jnp.arange(len(sizes), dtype=jnp.int32)
  cohort = attacks.Cohort(ids, jnp.ones(len(sizes)),
                          jnp.ones(len(sizes), bool), jnp.int32(1), KEY)
  attack = attacks.backdoor(target=0, poison_fraction=float(share),
                            trigger_size=1)
  got = np.asarray(jax.jit(attack.data)(data, cohort).y)
  poisoned = [int(np.sum(got[part] == 0)) for part in parts]
  expected = [math.ceil(share * int(size)) for size in sizes]
  assert poisoned == expected
  # The poisoned examples are each client's first ones.
  for part, count in zip(parts, expected, strict=True):
    assert np.all(got[part[:count]] == 0)


def test_image_trigger_is_a_square_off_the_corner():
  mask = trigger_mask((28, 28, 1), 3)
  assert mask.sum() == 9
  np.testing.assert_array_equal(np.argwhere(mask[..., 0]).min(0), [24, 24])
  np.testing.assert_array_equal(np.argwhere(mask[..., 0]).max(0), [26, 26])
  assert trigger_mask((6, 6, 3), 2).sum() == 12
  with pytest.raises(ValueError, match="does not fit"):
    trigger_mask((4, 4, 1), 4)
  with pytest.raises(ValueError, match="exceeds"):
    trigger_mask((5,), 6)


def test_eval_set_triggers_the_non_target_test_examples():
  rng = np.random.default_rng(0)
  x = rng.uniform(size=(40, 6, 6, 1)).astype(np.float32)
  y = rng.integers(0, 3, 40)
  eval_set = attacks.backdoor_eval_set(x, y, target=1, trigger_size=2,
                                       poison_fraction=0.3, boost=5.0)
  keep = y != 1
  assert eval_set.name == attacks.ATTACK_SUCCESS
  np.testing.assert_array_equal(eval_set.y, np.ones(keep.sum()))
  want = x[keep].copy()
  want[:, 3:5, 3:5, :] = x[keep].max()
  np.testing.assert_array_equal(eval_set.x, want)
  with pytest.raises(ValueError, match="every test label is the target"):
    attacks.backdoor_eval_set(x, np.ones(40, int), target=1)


def test_model_replacement_scales_the_malicious_updates():
  attack = attacks.backdoor(target=0, boost=4.0)
  g = {"w": jnp.zeros((3,))}
  clients = {"w": jnp.arange(18.0).reshape(6, 3)}
  out = jax.jit(attack.update)(g, clients, _cohort(MALICIOUS))
  # The wrapper keeps only the malicious rows of the update side.
  want = 4.0 * np.arange(18.0).reshape(6, 3)
  np.testing.assert_allclose(np.asarray(out["w"])[MALICIOUS],
                             want[MALICIOUS])


@pytest.mark.parametrize("kwargs,match", [
    ({"target": -1}, "target"), ({"poison_fraction": 0.0}, "poison_fraction"),
    ({"poison_fraction": 1.5}, "poison_fraction"),
    ({"trigger_size": 0}, "trigger_size"), ({"boost": 0.0}, "boost"),
    ({"trigger_value": math.nan}, "trigger_value")])
def test_bad_arguments_are_named(kwargs, match):
  with pytest.raises((ValueError, TypeError), match=match):
    attacks.backdoor(**kwargs)


def test_a_run_scores_attack_success_on_its_eval_set():
  """The ``attack_success`` column is the fraction of the triggered
  non-target test examples that the evaluated model labels as the target,
  recomputed here from the final model."""
  data, x, y, _ = tiny_data()
  model = tiny_model()
  training = LocalTraining(batch_size=3, learning_rate=0.3,
                           compute_losses=False)
  attack = attacks.backdoor(target=0, poison_fraction=1.0, trigger_size=2,
                            trigger_value=4.0)
  update = attacks.local_update(model, training, attack,
                                attacks.fixed(data.num_clients, ids=(1, 3)))
  eval_set = attacks.backdoor_eval_set(x, y, target=0, trigger_size=2,
                                       trigger_value=4.0)
  result = simulation.run(
      model, data, (x, y), aggregators.fedavg(), num_rounds=3,
      training=training, execution=Execution(progress=False),
      evaluation=Evaluation(extra=(eval_set,)), local_update=update,
      seed=0)
  column = result.history.column("attack_success")
  assert len(column) == 4 and all(0 <= v <= 1 for v in column)
  logits, _ = model.apply(result.state.params, jnp.asarray(eval_set.x),
                          False)
  want = float(np.mean(np.argmax(np.asarray(logits), -1) == 0))
  assert column[-1] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("extra,error,match", [
    ([], TypeError, "tuple"),
    ((("a", np.zeros((2, 5)), np.zeros(2)),), TypeError, "EvalSet"),
    ((EvalSet("test_accuracy", np.zeros((2, 5)), np.zeros(2, int)),),
     ValueError, "taken"),
    ((EvalSet("a b", np.zeros((2, 5)), np.zeros(2, int)),), ValueError,
     "identifier"),
    ((EvalSet("a", np.zeros((3, 5)), np.zeros(2, int)),), ValueError,
     "shapes"),
    ((EvalSet("a", np.zeros((2, 5)), np.zeros(2, int)),
      EvalSet("a", np.zeros((2, 5)), np.zeros(2, int))), ValueError,
     "taken"),
    ((EvalSet("a", np.zeros((2, 5)), np.zeros(2)),), TypeError,
     "int labels"),
    ((EvalSet("a", np.full((2, 5), np.nan), np.zeros(2, int)),),
     ValueError, "non-finite")])
def test_bad_eval_sets_are_refused(extra, error, match):
  with pytest.raises(error, match=match):
    Evaluation(extra=extra)


def test_eval_set_labels_outside_the_model_are_refused():
  data, x, y, _ = tiny_data()
  with pytest.raises(ValueError, match="Evaluation.extra 'bad'"):
    simulation.run(tiny_model(), data, (x, y), aggregators.fedavg(),
                   num_rounds=1, execution=Execution(progress=False),
                   evaluation=Evaluation(extra=(EvalSet(
                       "bad", x[:4], np.array([0, 1, 2, 7])),)))


def test_a_target_the_model_has_no_output_for_is_refused():
  data, x, y, _ = tiny_data()
  model = tiny_model()  # 3 classes
  training = LocalTraining(batch_size=3, compute_losses=False)
  for target in (3, 9):
    update = attacks.local_update(
        model, training, attacks.compose(attacks.backdoor(target=target),
                                         attacks.sign_flip()),
        attacks.fixed(data.num_clients, ids=(1,)))
    with pytest.raises(ValueError, match=f"target: the attack writes "
                       f"label {target}, but the model has C=3"):
      simulation.run(model, data, (x, y), aggregators.fedavg(),
                     num_rounds=1, training=training,
                     execution=Execution(progress=False),
                     local_update=update)
