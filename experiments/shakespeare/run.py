"""FedAvg with the char-LSTM on the Shakespeare federation built offline.

McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data" (AISTATS 2017), Shakespeare next-character prediction
(Table 2 / Fig. 3 there); the federation is ``data.shakespeare()`` (one
client per play and role, LEAF's characters and split), see RESULTS.md for
what differs from the paper's setting.

  python experiments/shakespeare/run.py                  # configs/fedavg.json
  python experiments/shakespeare/run.py --set train.rounds=5

Writes ``results/<config name>/`` in the one layout of
``fedjax_agg.history`` (``config.json`` with the federation's provenance,
``FedAvg/history.csv|json``, ``summary.json``, ``curves.png``,
``partition.png``).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from fedjax_agg import distributed  # pylint: disable=wrong-import-position
from fedjax_agg import experiment  # pylint: disable=wrong-import-position


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="configs/fedavg.json")
  parser.add_argument("--set", action="append", default=[],
                      metavar="KEY=VALUE",
                      help="override a config key (JSON value)")
  parser.add_argument("--out", default=None)
  args = parser.parse_args(argv)
  distributed.use_cpu_devices(os.cpu_count() or 1)
  config = experiment.load_config(os.path.join(HERE, args.config))
  config = experiment.override(config, {
      key: json.loads(value) for key, value in
      (item.split("=", 1) for item in args.set)})
  out = args.out or os.path.join(HERE, "results", config["name"])
  start = time.perf_counter()
  summary = experiment.run_config(config, out, progress=True)
  print(json.dumps({"minutes": round((time.perf_counter() - start) / 60, 2),
                    **summary["FedAvg"]}))


if __name__ == "__main__":
  main()
