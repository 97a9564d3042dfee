"""Classification metrics, and the rounds a history takes to a target."""

import numpy as np

from fedjax_agg import evaluation as evaluation_lib
from fedjax_agg import history as history_lib


def test_metrics_and_rounds_to_target():
  labels = np.array([0, 0, 1, 1, 2, 2])
  preds = np.array([0, 1, 1, 1, 2, 0])
  m = evaluation_lib.classification_metrics(labels, preds, 3)
  # Per-class F1: 1/2 (tp 1, fp 1, fn 1), 4/5, 2/3.
  np.testing.assert_allclose(m["macro_f1"], (1 / 2 + 4 / 5 + 2 / 3) / 3)
  np.testing.assert_allclose(m["accuracy"], 4 / 6)
  history = history_lib.History(
      rows=[{"round": 0, "test_accuracy": 0.1},
            {"round": 1, "test_accuracy": 0.5},
            {"round": 2, "test_accuracy": 0.7}], client_rows=[], config={})
  assert history_lib.rounds_to_target(history, 0.6) == 2
  assert history_lib.rounds_to_target(history, 0.9) is None


def test_a_language_models_rows_hold_its_perplexity():
  """``test_perplexity`` = exp(mean loss over the real tokens), against
  numpy; class labels get none."""
  import jax.numpy as jnp
  from fedjax_agg import evaluation
  from fedjax_agg import types

  vocab = 5

  def apply(params, x, train=False):
    del train
    return params["logits"][x], params  # [B, T, V] from a token table

  model = types.Model(init=None, apply=apply,
                      loss=types.sequence_cross_entropy)
  rng = np.random.default_rng(0)
  params = {"logits": jnp.asarray(rng.normal(size=(vocab, vocab)),
                                  jnp.float32)}
  x = rng.integers(0, vocab, size=(6, 4)).astype(np.int32)
  y = rng.integers(0, vocab, size=(6, 4)).astype(np.int32)
  y[:, -1] = types.PAD_TARGET  # a padded position is not scored
  row, = evaluation.member_rows(model, params, (x, y), vocab, 4)
  logits = np.asarray(params["logits"], np.float64)[x]
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  real = y != types.PAD_TARGET
  nll = -np.take_along_axis(logp, np.where(real, y, 0)[..., None],
                            -1)[..., 0]
  want = np.exp(nll[real].mean())
  np.testing.assert_allclose(row["test_perplexity"], want, rtol=1e-5)
  np.testing.assert_allclose(row["test_perplexity"],
                             np.exp(row["test_loss"]), rtol=1e-6)
  labels = rng.integers(0, vocab, size=6).astype(np.int32)
  row, = evaluation.member_rows(
      types.Model(init=None, apply=lambda p, x, train=False: (
          p["logits"][x[:, 0]], p)), params, (x, labels), vocab, 4)
  assert "test_perplexity" not in row
