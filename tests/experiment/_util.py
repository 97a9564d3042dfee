"""A tiny config of the experiment tests."""

CONFIG = {
    "name": "tiny",
    "dataset": {"name": "fashion_mnist", "source": "files",
                "max_train_examples": 1200, "max_test_examples": 500},
    "partition": {"name": "shards", "num_clients": 6},
    "model": {"name": "mlp2", "args": {"hidden": 32}},
    "train": {"rounds": 2, "participation": 0.5, "batch_size": 20,
              "learning_rate": 0.1, "eval_clients": False},
    "algorithms": {
        "FedAvg": {"aggregator": "fedavg"},
        "FedProx": {"aggregator": "fedavg", "objective": "fedprox",
                    "objective_args": {"mu": 0.1}},
        "FedAdp": {"aggregator": "fedadp"},
    },
    "seeds": [0, 1],
    "target_accuracy": 0.3,
}
