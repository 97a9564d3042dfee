"""NaturalFederation: its checks, FederatedData view and summary."""

import numpy as np
import pytest

from fedjax_agg.data import _natural
from fedjax_agg.types import PAD_TARGET


def _federation(**changes):
  x = np.arange(24, dtype=np.int32).reshape(6, 4) % 5
  y = (x + 1) % 5
  y[1, 2:] = PAD_TARGET
  fields = dict(
      name="toy", train_x=x[:4], train_y=y[:4],
      train_clients=(np.array([0, 1]), np.array([2, 3])),
      test_x=x[4:], test_y=y[4:],
      test_clients=(np.array([0, 1]), np.array([], np.int64)),
      client_ids=("a", "b"), num_classes=5, input_shape=(4,),
      task="sequence", provenance={"source": "test"})
  fields.update(changes)
  return _natural.NaturalFederation(**fields)


def test_a_consistent_federation_passes_and_federates():
  fed = _natural.check_federation(_federation())
  data = fed.federated()
  assert data.num_clients == 2
  np.testing.assert_array_equal(np.asarray(data.y), fed.train_y)
  np.testing.assert_array_equal(np.asarray(data.num_examples), [2, 2])


@pytest.mark.parametrize("changes,message", [
    (dict(client_ids=("a", "a")), "client ids must be unique"),
    (dict(client_ids=("a",)), "1 client ids but 2 training"),
    (dict(train_clients=(np.array([0, 1]), np.array([], np.int64))),
     "client 'b' has no training rows"),
    (dict(train_clients=(np.array([0, 9]), np.array([2]))),
     "train rows of client 'a' index outside"),
    (dict(num_classes=3), r"train_y holds values in \[-1, 4\], outside"),
    (dict(task="sequence", train_y=np.zeros(4, np.int32)),
     "train_y must have 2 dimension"),
    (dict(task="images"), "task must be one of"),
    (dict(input_shape=(5,)), r"train_x rows have shape \(4,\)"),
])
def test_inconsistent_federations_are_refused_by_name(changes, message):
  with pytest.raises(ValueError, match=message):
    _natural.check_federation(_federation(**changes))


def test_summary_counts_rows_tokens_and_targets():
  fed = _federation()
  got = _natural.summary(fed)
  assert got["clients"] == 2 and got["clients_without_test_rows"] == 1
  assert got["train_rows"]["total"] == 4 and got["test_rows"]["max"] == 2
  scored = fed.train_y[fed.train_y != PAD_TARGET]
  assert got["train_tokens"]["total"] == scored.size
  np.testing.assert_allclose(got["targets"],
                             np.bincount(scored, minlength=5) / scored.size)
  assert got["top_targets"][0][1] == pytest.approx(max(got["targets"]))
