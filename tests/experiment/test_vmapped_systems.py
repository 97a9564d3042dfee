"""What a run refuses of its systems is refused before any file is written:
seeds vmapped as one sweep cannot each have a simulated clock or codec:
refused by name when the description is made (``vmap_seeds`` in the
config) or when ``run_config`` is asked to vmap them, before any file is
written; nor can a private rule run on the secure sum."""

import pytest

from fedjax_agg import experiment
from fedjax_agg import spec

_CONFIG = {"dataset": {"name": "mnist", "source": "mnist_5k"},
           "partition": {"name": "iid", "num_clients": 4},
           "model": {"name": "mlp2"},
           "train": {"rounds": 1},
           "algorithms": {"FedAvg": {"aggregator": "fedavg"}},
           "seeds": [0, 1], "systems": {"profiles": "constant"}}


def test_a_config_vmapping_seeds_with_systems_is_refused():
  with pytest.raises(spec.ConfigError, match="vmap_seeds to false") as error:
    spec.Experiment.from_dict({**_CONFIG, "vmap_seeds": True})
  assert error.value.path == "vmap_seeds"
  # One seed is no sweep; seeds in turn keep their clocks.
  spec.Experiment.from_dict({**_CONFIG, "vmap_seeds": True, "seeds": [0]})
  spec.Experiment.from_dict({**_CONFIG, "vmap_seeds": False})


def test_run_config_asked_to_vmap_them_writes_nothing(tmp_path):
  out = tmp_path / "run"
  with pytest.raises(spec.ConfigError, match="vmap_seeds"):
    experiment.run_config(_CONFIG, str(out), progress=False,
                          vmap_seeds=True)
  assert not out.exists()


def test_secure_aggregation_with_privacy_writes_nothing(tmp_path):
  config = {**_CONFIG, "seeds": [0], "systems": {"secagg_bits": 20},
            "algorithms": {"DP": {"aggregator": "dp_fedavg", "aggregator_args":
                                  {"noise_multiplier": 0.5,
                                   "clip_norm": 1.0}}}}
  out = tmp_path / "run"
  with pytest.raises(ValueError, match="secagg_bits=20 with privacy"):
    experiment.run_config(config, str(out), progress=False)
  assert not out.exists()
