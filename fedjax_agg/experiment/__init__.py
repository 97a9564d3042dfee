"""Config-driven experiments: several algorithms × seeds on one setting.

A config is a JSON-able dict::

  {
    "name": "5iid_5noniid",
    "dataset": {"name": "fashion_mnist", "source": "auto",
                "standardize": false, "max_test_examples": null},
    "partition": {"name": "mixed_iid", "num_clients": 10,
                  "args": {"num_iid": 5, "num_noniid": 5}},
    "model": {"name": "cnn_fedlayerwise", "args": {}},
    "train": {"rounds": 30, "participation": 1.0, "local_epochs": 1,
              "batch_size": 16, "learning_rate": 0.005, "momentum": 0.0,
              "stragglers": 0.0, "eval_every": 1, "eval_clients": true},
    "algorithms": {
      "FedAvg": {"aggregator": "fedavg"},
      "FedLayerWise": {"aggregator": "fedlayerwise",
                        "aggregator_args": {"alpha": 5.0}},
      "FedProx": {"aggregator": "fedavg", "objective": "fedprox",
                  "objective_args": {"mu": 0.01}}
    },
    "seeds": [0, 1, 2],
    "target_accuracy": 0.8
  }

Any "train" key can be overridden per algorithm (e.g. a different learning
rate). ``run_config`` writes each algorithm as one run folder in the one
layout of ``fedjax_agg.history`` (``<out>/<algorithm>/history.csv|json``
for one seed, else ``<out>/<algorithm>/seed<k>/history.csv|json`` and
``<out>/<algorithm>/summary.csv``), ``<out>/summary.json`` (per
algorithm: final and best accuracy, rounds to target, mean ± std over
seeds), ``<out>/curves.png`` and
``<out>/config.json`` (``run_record``: the config with every default
written out, plus a "provenance" entry with the data source and sizes,
every rule's full arguments, versions, devices and the command line; it
can be run again as it is).

A config file is read by ``load_config``, which refuses a key given
twice (naming its path), and into the typed description
``spec.Experiment`` by ``check_config`` (``spec.Experiment.from_dict``),
which refuses unknown keys anywhere (naming the key path and the allowed
keys), values of the wrong type or range, and arguments that the
aggregator or objective factories or the run's own settings reject,
before anything runs; every function here that takes
an experiment takes the ``spec.Experiment`` (a JSON config is read the
same way). ``check_output_dir`` refuses an output folder that cannot take
the results. The keys "report_rounds", "early_rounds", "reference" and
an algorithm's "two_stage" belong to scripts of ``experiments/`` and are
passed over here.

"train.devices" picks the devices a run shards its clients over
(``simulation.run``'s ``devices``): null = every device of the job, an int
= that many; vmapped sweeps (``sweep_algorithm``) shard their members
over that many devices (null = the most devices that divide the member
count).

The code lives in submodules, each importing only those above it in this
list (every public name is re-exported here):

- ``_data``: reading a config (``load_config``, ``override``) and its
  data (``load_dataset``, ``partition_indices``, ``prepare_data``,
  ``plot_partition``).
- ``_build``: one algorithm built (``check_config``; ``build`` ->
  ``Built``: model, data, rule and ``RunOptions``; ``build_rule``,
  ``attack_update``).
- ``_record``: what a run writes down (``run_record``,
  ``write_run_config``, ``environment``, ``describe_data``,
  ``shown_path``), the output folder's check (``check_output_dir``)
  and ``setting_title``.
- ``_folder``: the one writer of a run's folder (``RunFolder``: where
  each file goes, the history writers, what sums the run up;
  ``output_names``, ``saved_algorithm_dir``,
  ``refuse_held_checkpoints``), used by ``run_config``
  and the command line alike.
- ``_runs``: running (``run_algorithm``, ``sweep_algorithm``,
  ``run_config``, ``announced_run_config``, ``warn_short_feddrl``).
- ``_summary``: summing up (``summarize``, ``write_summary_csv``).
- ``_script``: the command line of the ``experiments/`` scripts
  (``script_parser``, ``config_path``, ``parse_sets``,
  ``script_config``).

The checks themselves live with the description, in ``fedjax_agg.spec``.
"""

from fedjax_agg.experiment._build import attack_update
from fedjax_agg.experiment._build import build
from fedjax_agg.experiment._build import build_rule
from fedjax_agg.experiment._build import Built
from fedjax_agg.experiment._build import check_config
from fedjax_agg.experiment._data import load_config
from fedjax_agg.experiment._data import load_dataset
from fedjax_agg.experiment._data import natural_clients
from fedjax_agg.experiment._data import note_substitution
from fedjax_agg.experiment._data import override
from fedjax_agg.experiment._data import partition_indices
from fedjax_agg.experiment._data import partition_source
from fedjax_agg.experiment._data import plot_partition
from fedjax_agg.experiment._data import prepare_data
from fedjax_agg.experiment._folder import output_names
from fedjax_agg.experiment._folder import refuse_held_checkpoints
from fedjax_agg.experiment._folder import RunFolder
from fedjax_agg.experiment._folder import saved_algorithm_dir
from fedjax_agg.experiment._data import substitution
from fedjax_agg.experiment._record import check_output_dir
from fedjax_agg.experiment._record import describe_data
from fedjax_agg.experiment._record import environment
from fedjax_agg.experiment._record import run_record
from fedjax_agg.experiment._record import setting_title
from fedjax_agg.experiment._record import shown_path
from fedjax_agg.experiment._record import write_run_config
from fedjax_agg.experiment._runs import FEDDRL_MIN_AGENT_STEPS
from fedjax_agg.experiment._runs import announced_run_config
from fedjax_agg.experiment._runs import run_algorithm
from fedjax_agg.experiment._runs import run_config
from fedjax_agg.experiment._summary import summarize
from fedjax_agg.experiment._runs import sweep_algorithm
from fedjax_agg.experiment._runs import warn_short_feddrl
from fedjax_agg.experiment._summary import write_summary_csv
from fedjax_agg.experiment._script import config_path
from fedjax_agg.experiment._script import parse_sets
from fedjax_agg.experiment._script import script_config
from fedjax_agg.experiment._script import script_parser

__all__ = ["announced_run_config", "attack_update", "build", "build_rule",
           "Built", "check_config",
           "check_output_dir", "config_path", "describe_data",
           "environment", "FEDDRL_MIN_AGENT_STEPS", "load_config",
           "load_dataset", "natural_clients", "note_substitution",
           "RunFolder", "output_names", "override", "parse_sets",
           "partition_indices",
           "partition_source", "plot_partition", "prepare_data",
           "refuse_held_checkpoints", "run_algorithm", "run_config",
           "run_record",
           "saved_algorithm_dir", "script_config",
           "script_parser", "setting_title", "shown_path",
           "substitution", "summarize",
           "sweep_algorithm", "warn_short_feddrl", "write_run_config",
           "write_summary_csv"]
