"""A short real run: FedAvg on real Fashion-MNIST improves test accuracy.

Also drives the command line end to end (history, plot).
"""

import json
import os

import numpy as np
import pytest

from fedjax_agg import aggregators
from fedjax_agg import cli
from fedjax_agg import data as data_lib
from fedjax_agg import federated
from fedjax_agg import models
from fedjax_agg import partitions
from fedjax_agg import simulation
from fedjax_agg.config import Evaluation
from fedjax_agg.config import Execution
from fedjax_agg.config import LocalTraining


@pytest.fixture(scope="module")
def fashion():
  try:
    return data_lib.load("fashion_mnist", source="files")
  except data_lib.DatasetNotFoundError as e:
    pytest.skip(f"Fashion-MNIST files not installed: {e}")


def test_three_cnn_rounds_improve_accuracy(fashion):
  labels = fashion.train_y[:3000]
  parts = partitions.iid(labels, num_clients=10, seed=0,
                         samples_per_client=150)
  data = federated.from_partition(fashion.train_x[:3000], labels, parts)
  model = models.get("cnn_fednnnn_mnist", num_classes=10)
  result = simulation.run(model, data,
      (fashion.test_x[:2000], fashion.test_y[:2000]), aggregators.fedavg(),
      num_rounds=3, participation=0.5, seed=0,
      training=LocalTraining(epochs=1, batch_size=16, learning_rate=0.05),
      execution=Execution(progress=False),
      evaluation=Evaluation(clients=True))
  accuracy = result.history.column("test_accuracy")
  assert accuracy[0] < 0.25  # an untrained 10-class model
  assert accuracy[-1] > accuracy[0] + 0.3, accuracy
  assert np.all(np.isfinite(result.history.column("client_loss_var")))


def test_cli_writes_history_and_plot(fashion, tmp_path, capsys):
  del fashion
  out = tmp_path / "run"
  code = cli.main([
      "--dataset", "fashion_mnist", "--source", "files", "--partition",
      "shards", "--num-clients", "10", "--max-train-examples", "2000",
      "--model", "mlp2", "--rounds", "2", "--participation", "0.5",
      "--lr", "0.1", "--out", str(out), "--no-progress", "--partition-plot"])
  assert code == 0
  summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert summary["final_test_accuracy"] > summary["initial_test_accuracy"]
  for name in ("history.csv", "history.json", "accuracy.png",
               "partition.png"):
    assert os.path.getsize(out / name) > 0
  with open(out / "history.json") as f:
    saved = json.load(f)
  assert len(saved["rows"]) == 3 and saved["config"]["algorithm"] == "fedavg"
