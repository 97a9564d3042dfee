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
