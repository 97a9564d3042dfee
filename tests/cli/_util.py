"""A config file for the command-line tests."""

import json


def _config_file(tmp_path, **changes) -> str:
  config = {
      "name": "file",
      "dataset": {"name": "mnist", "source": "mnist_5k",
                  "max_train_examples": 400},
      "partition": {"name": "iid", "num_clients": 4},
      "model": {"name": "mlp2", "args": {"hidden": 16}},
      "train": {"rounds": 5, "learning_rate": 0.1, "participation": 0.5},
      "algorithms": {"FedAdp": {"aggregator": "fedadp",
                                "aggregator_args": {"alpha": 2.0}}},
      "seeds": [3],
  }
  config.update(changes)
  path = tmp_path / "config.json"
  path.write_text(json.dumps(config))
  return str(path)
