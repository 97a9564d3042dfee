"""The language models: parameter counts of the stated architectures, the
sequence loss against numpy over the unpadded tokens, causality, and a
vmapped round of text clients equal to training each alone."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_agg import engine
from fedjax_agg import evaluation
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import objectives
from fedjax_agg.config import LocalTraining
from fedjax_agg.types import PAD_TARGET
from fedjax_agg.types import sequence_cross_entropy
from fedjax_agg.types import target_counts
from tests.test_engine import reference_client


def _lstm_layer(inputs, hidden):
  # Keras/TF count: per gate an input kernel, a recurrent kernel, a bias.
  return 4 * (inputs * hidden + hidden * hidden + hidden)


def _count(name, num_classes, **options):
  """The parameter count, from the initialised tree's shapes."""
  model = models.get(name, num_classes=num_classes, **options)
  return models.count_params(jax.eval_shape(model.init, jax.random.key(0)))


def test_char_lstm_has_leafs_parameter_count():
  vocab = 80
  want = (vocab * 8 + _lstm_layer(8, 256) + _lstm_layer(256, 256)
          + 256 * vocab + vocab)
  assert want == 817_872
  assert _count("char_lstm", vocab) == want


def test_word_lstm_has_the_stack_overflow_parameter_count():
  vocab = 10_004  # 10,000 words, padding, out-of-vocabulary, BOS, EOS
  want = (vocab * 96 + _lstm_layer(96, 670) + 670 * 96 + 96
          + 96 * vocab + vocab)
  assert want == 4_050_748  # Reddi et al. 2021, Stack Overflow NWP
  assert _count("word_lstm", vocab) == want


@pytest.mark.parametrize("width,depth,heads,length", [(128, 2, 4, 80),
                                                      (32, 3, 2, 20)])
def test_transformer_parameter_count(width, depth, heads, length):
  vocab = 80
  block = (2 * width + 4 * (width * width + width)  # LayerNorm, q k v out
           + 2 * width + width * 4 * width + 4 * width  # LayerNorm, MLP in
           + 4 * width * width + width)  # MLP out
  want = (vocab * width + length * width + depth * block + 2 * width
          + width * vocab + vocab)
  got = _count("transformer_lm", vocab, width=width, depth=depth,
               heads=heads, max_length=length,
               input_shape=(length,))
  assert got == want


def test_transformer_is_causal_and_refuses_long_inputs():
  model = models.get("transformer_lm", num_classes=11, width=16, depth=1,
                     heads=2, max_length=6, input_shape=(6,))
  params = jax.jit(model.init)(jax.random.key(0))
  tokens = jnp.array([[1, 2, 3, 4, 5, 6]])
  changed = tokens.at[0, 4].set(9)
  apply = jax.jit(model.apply, static_argnums=2)
  out, _ = apply(params, tokens, False)
  out2, _ = apply(params, changed, False)
  # Positions before the change see the same prefix.
  np.testing.assert_allclose(out[0, :4], out2[0, :4], rtol=1e-6)
  assert not np.allclose(out[0, 4:], out2[0, 4:])
  with pytest.raises(ValueError, match="max_length"):
    apply(params, jnp.zeros((1, 7), jnp.int32), False)


def test_models_refuse_an_image_input_shape():
  with pytest.raises(ValueError, match="input_shape of 'char_lstm'"):
    models.get("char_lstm", num_classes=80, input_shape=(28, 28, 1))


def _np_token_loss(logits, targets):
  logits = np.asarray(logits, np.float64)
  logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + (
      logits.max(-1))
  losses, counts = [], []
  for b in range(targets.shape[0]):
    real = [t for t in range(targets.shape[1]) if targets[b, t] != -1]
    losses.append(sum(logz[b, t] - logits[b, t, targets[b, t]]
                      for t in real))
    counts.append(len(real))
  return np.array(losses), np.array(counts)


def test_sequence_loss_equals_numpy_over_the_unpadded_tokens():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 6, 7)).astype(np.float32) * 3
  targets = rng.integers(0, 7, size=(4, 6))
  targets[0, 3:] = PAD_TARGET
  targets[2, :] = PAD_TARGET  # no real token at all
  targets[3, 0] = PAD_TARGET
  sums, counts = _np_token_loss(logits, targets)
  got = jax.jit(sequence_cross_entropy)(logits, targets)
  np.testing.assert_allclose(got, sums / np.maximum(counts, 1), rtol=1e-5)
  np.testing.assert_array_equal(jax.jit(target_counts)(targets), counts)
  assert float(got[2]) == 0.0
  # A batch's data loss is the mean over its real tokens, not over rows.
  batch = {"x": jnp.asarray(logits), "y": jnp.asarray(targets),
           "mask": jnp.array([1.0, 1.0, 1.0, 0.0])}
  identity = models.get("char_lstm", num_classes=7)._replace(
      apply=lambda params, x, train: (x, params))
  loss, _ = jax.jit(objectives.local_loss(identity, objectives.cross_entropy()
                                          ))({}, batch, {}, ())
  np.testing.assert_allclose(loss, sums[:3].sum() / counts[:3].sum(),
                             rtol=1e-5)


def test_evaluation_scores_only_real_tokens():
  rng = np.random.default_rng(1)
  vocab = 5
  x = rng.integers(0, vocab, size=(9, 4)).astype(np.int32)
  y = rng.integers(0, vocab, size=(9, 4)).astype(np.int32)
  y[::2, 2:] = PAD_TARGET
  model = models.get("char_lstm", num_classes=vocab, hidden=6,
                     input_shape=(4,))
  params = jax.jit(model.init)(jax.random.key(3))
  got = evaluation.evaluate(model, params, x, y, vocab, batch_size=4)
  logits, _ = jax.jit(model.apply, static_argnums=2)(params, x, False)
  sums, counts = _np_token_loss(logits, y)
  real = y != PAD_TARGET
  preds = np.asarray(logits).argmax(-1)
  np.testing.assert_allclose(got["loss"], sums.sum() / counts.sum(),
                             rtol=1e-5)
  assert got["accuracy"] == pytest.approx(np.mean(preds[real] == y[real]))
  # Per-client means weigh each client's rows by their real tokens.
  parts = [np.array([0, 3, 4]), np.array([1, 2, 5, 6, 7, 8])]
  data = federated.from_partition(x, y, parts)
  per_client = evaluation.client_losses(model, params, data, batch_size=4)
  for k, part in enumerate(parts):
    np.testing.assert_allclose(per_client[k],
                               sums[part].sum() / counts[part].sum(),
                               rtol=1e-5)


def test_vmapped_round_of_text_clients_equals_each_alone():
  rng = np.random.default_rng(2)
  vocab, length, sizes = 6, 5, (3, 5, 2, 4)
  total = sum(sizes)
  x = rng.integers(0, vocab, size=(total, length)).astype(np.int32)
  y = rng.integers(0, vocab, size=(total, length)).astype(np.int32)
  y[rng.random((total, length)) < 0.3] = PAD_TARGET
  bounds = np.cumsum((0,) + sizes)
  parts = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:],
                                                   strict=True)]
  data = federated.from_partition(x, y, parts)
  model = models.get("char_lstm", num_classes=vocab, embed_dim=3, hidden=5,
                     input_shape=(length,))
  params = model.init(jax.random.key(1))
  objective = objectives.cross_entropy()
  optimizer = functools.partial(optax.sgd)
  batch_size, epochs = 2, 2
  train = engine.make_local_trainer(
      model, LocalTraining(batch_size=batch_size, epochs=epochs,
                           objective=objective, optimizer=optimizer),
      clients_per_step=2)
  ids = jnp.arange(len(sizes))
  lrs = jnp.full(len(sizes), 0.5)
  steps = engine.full_steps(data, ids, batch_size, epochs)
  key = jax.random.key(5)
  result = train(params, data, ids, lrs, steps, key)
  for k in range(len(sizes)):
    ref, ref_steps = reference_client(
        model, params, x, y, parts[k], jax.random.fold_in(key, k), 0.5,
        batch_size, epochs, int(steps[k]), objective, optimizer)
    assert int(result.steps_taken[k]) == ref_steps
    got = jax.tree.map(lambda a, k=k: a[k], result.client_params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5,
                                                         atol=2e-6),
                 got, ref)
