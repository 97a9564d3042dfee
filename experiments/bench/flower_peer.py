"""The benchmarks' rounds in Flower's simulation: the peer that
``round_bench.py`` (image) and ``finetune_bench.py`` (LoRA fine-tuning)
are compared with.

  python experiments/bench/flower_peer.py --workload image --clients 100
  python experiments/bench/flower_peer.py --workload finetune --clients 10 100

Needs ``flwr[simulation]`` (1.41), ``torch`` and, for fine-tuning, ``peft``
in the environment that runs it (none of them is a dependency of the
library); where they do not import, one JSON line says so and nothing is
timed.

* image: ``round_bench.py``'s workload (its ``make_client_data``: N
  clients x 600 random 28x28x1 images; the 1,663,370-parameter CNN; one
  epoch of SGD at 0.005, batch 16, the last batch of 8 kept, reshuffled
  per client per round), the CNN written in PyTorch.
* finetune: ``finetune_bench.py``'s workload (its ``workload``: the
  pre-trained ``transformer_lm`` base of ``experiments/fine_tuning``, 40
  rows of 80 characters a client, rank-8 PEFT LoRA on the six matrices a
  block, 3 SGD steps at 3.0), through ``finetune_torch.py``'s module,
  whose logits are checked against the base before timing.

Flower's ``FedAvg`` (every client every round, weighted by examples:
equal here, so FedIT's mean of A and B for fine-tuning), no client
evaluation, its Ray backend with ``--actors`` clients at once of
``2 / actors`` CPUs each (torch's threads set to them). Round 1 (actors
starting, first compilation of nothing) is reported apart; ``round_s`` is
the median of the next ``--rounds``, each from configuring the round to
the aggregate; ``cpu_s`` is the machine's busy CPU seconds in that time
(``/proc/stat``: Flower's work runs in its actors' processes), so run it
on a quiet machine. One JSON line per run.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for _path in (ROOT, HERE, os.path.join(ROOT, "experiments", "fine_tuning")):
  if _path not in sys.path:
    sys.path.insert(0, _path)

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

_CACHE = {}  # per actor process: the data and the module, built once


def _busy_seconds() -> float:
  """The machine's non-idle CPU seconds so far (/proc/stat)."""
  with open("/proc/stat") as f:
    fields = [int(v) for v in f.readline().split()[1:]]
  idle = fields[3] + fields[4]
  return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _image_model():
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top
  return nn.Sequential(
      nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
      nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
      nn.Flatten(), nn.Linear(7 * 7 * 64, 512), nn.ReLU(),
      nn.Linear(512, 10)), torch


def _image_fit(folder, k, parameters, server_round):
  """One client's local epoch of the image workload."""
  if "image" not in _CACHE:
    model, torch = _image_model()
    x = np.load(os.path.join(folder, "x.npy"), mmap_mode="r",
                allow_pickle=False)
    y = np.load(os.path.join(folder, "y.npy"), mmap_mode="r",
                allow_pickle=False)
    _CACHE["image"] = model, torch, x, y
  model, torch, x, y = _CACHE["image"]
  with torch.no_grad():
    for p, value in zip(model.parameters(), parameters, strict=True):
      p.copy_(torch.from_numpy(value))
  # NHWC -> NCHW, as torch's convolution reads it.
  xs = torch.from_numpy(np.array(x[k])).permute(0, 3, 1, 2)
  ys = torch.from_numpy(np.array(y[k])).long()
  order = torch.randperm(len(ys), generator=torch.Generator().manual_seed(
      1000 * server_round + k))
  optimizer = torch.optim.SGD(model.parameters(), lr=0.005)
  loss_fn = torch.nn.CrossEntropyLoss()
  for first in range(0, len(ys), 16):
    batch = order[first:first + 16]
    optimizer.zero_grad()
    loss_fn(model(xs[batch]), ys[batch]).backward()
    optimizer.step()
  return [p.detach().numpy().copy() for p in model.parameters()], len(ys)


def _finetune_fit(folder, k, parameters, server_round):
  """One client's 3 SGD steps on its rank-8 PEFT adapters."""
  del server_round
  if "finetune" not in _CACHE:
    import finetune_torch  # pylint: disable=g-import-not-at-top
    import peft  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    with open(os.path.join(folder, "args.json")) as f:
      args = json.load(f)
    model = finetune_torch.TransformerLM(80, args["width"], args["depth"],
                                         args["heads"], 80)
    with np.load(os.path.join(folder, "base.npz"),
                 allow_pickle=False) as weights:
      model.load_state_dict({name: torch.from_numpy(weights[name])
                             for name in weights.files})
    model = peft.get_peft_model(model, peft.LoraConfig(
        r=8, lora_alpha=8, lora_dropout=0.0,
        target_modules=finetune_torch.TARGETS, bias="none"))
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    x = torch.from_numpy(np.load(os.path.join(folder, "x.npy"),
                                 allow_pickle=False)).long()
    y = torch.from_numpy(np.load(os.path.join(folder, "y.npy"),
                                 allow_pickle=False)).long()
    _CACHE["finetune"] = model, torch, [params[n] for n in names], x, y
  model, torch, adapters, x, y = _CACHE["finetune"]
  with torch.no_grad():
    for p, value in zip(adapters, parameters, strict=True):
      p.copy_(torch.from_numpy(value))
  optimizer = torch.optim.SGD(adapters, lr=3.0)
  loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-1)
  for first in range(0, x.shape[1], 16):
    xb, yb = x[k, first:first + 16], y[k, first:first + 16]
    optimizer.zero_grad()
    out = model(xb)
    loss_fn(out.reshape(-1, out.shape[-1]), yb.reshape(-1)).backward()
    optimizer.step()
  return [p.detach().numpy().copy() for p in adapters], int(x.shape[1])


def client_fn(context):
  """Flower's client of node ``partition-id``, for the run's workload."""
  from flwr.client import NumPyClient  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  config = json.loads(os.environ["FLOWER_PEER"])
  torch.set_num_threads(int(config["threads"]))
  k = int(context.node_config["partition-id"])
  fit = _image_fit if config["workload"] == "image" else _finetune_fit

  class Client(NumPyClient):

    def fit(self, parameters, fit_config):
      new, count = fit(config["folder"], k, parameters,
                       int(fit_config["round"]))
      return new, count, {}

  return Client().to_client()


def _prepare(workload: str, clients: int, folder: str) -> list:
  """Writes the workload's data (and base) to ``folder``; returns the
  initial global parameters."""
  if workload == "image":
    import round_bench  # pylint: disable=g-import-not-at-top
    x, y = round_bench.make_client_data(clients, 0)
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), y)
    model, torch = _image_model()
    torch.manual_seed(0)
    return [p.detach().numpy().copy() for p in model.parameters()]
  import finetune_bench  # pylint: disable=g-import-not-at-top
  import finetune_torch  # pylint: disable=g-import-not-at-top
  import peft  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  base, x, y, _ = finetune_bench.workload(clients)
  args = base.record["model_args"]
  model, _ = finetune_torch.checked_model(base, x)
  np.savez(os.path.join(folder, "base.npz"),
           **{name: value.numpy() for name, value in
              model.state_dict().items()})
  np.save(os.path.join(folder, "x.npy"), x)
  np.save(os.path.join(folder, "y.npy"), y)
  with open(os.path.join(folder, "args.json"), "w") as f:
    json.dump(args, f)
  torch.manual_seed(0)
  adapted = peft.get_peft_model(model, peft.LoraConfig(
      r=8, lora_alpha=8, lora_dropout=0.0,
      target_modules=finetune_torch.TARGETS, bias="none"))
  return [p.detach().numpy().copy() for p in adapted.parameters()
          if p.requires_grad]


def run(workload: str, clients: int, rounds: int, actors: int) -> dict:
  """One Flower simulation of ``1 + rounds`` rounds; its timings."""
  import flwr  # pylint: disable=g-import-not-at-top
  from flwr.client import ClientApp  # pylint: disable=g-import-not-at-top
  from flwr.common import ndarrays_to_parameters  # pylint: disable=g-import-not-at-top
  from flwr.server import ServerApp, ServerAppComponents, ServerConfig  # pylint: disable=g-import-not-at-top
  from flwr.server.strategy import FedAvg  # pylint: disable=g-import-not-at-top
  from flwr.simulation import run_simulation  # pylint: disable=g-import-not-at-top
  import flower_peer  # this file as a module: Ray's actors import it
  times = []

  class Timed(FedAvg):
    """FedAvg that times each round from its configuration to its
    aggregate."""

    def configure_fit(self, server_round, parameters, client_manager):
      self.start = (time.perf_counter(), _busy_seconds())
      return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
      out = super().aggregate_fit(server_round, results, failures)
      times.append((time.perf_counter() - self.start[0],
                    _busy_seconds() - self.start[1], len(results),
                    len(failures)))
      return out

  cpus = os.cpu_count() / actors
  with tempfile.TemporaryDirectory() as folder:
    initial = _prepare(workload, clients, folder)
    strategy = Timed(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=clients,
        min_available_clients=clients,
        on_fit_config_fn=lambda r: {"round": r},
        initial_parameters=ndarrays_to_parameters(initial))
    server = ServerApp(server_fn=lambda context: ServerAppComponents(
        strategy=strategy, config=ServerConfig(num_rounds=1 + rounds)))
    app = ClientApp(client_fn=flower_peer.client_fn)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [HERE, ROOT, os.path.join(ROOT, "experiments", "fine_tuning"),
         os.environ.get("PYTHONPATH", "")])
    # The clients read the workload from the environment Ray's actors
    # inherit (run_simulation takes no run config).
    os.environ["FLOWER_PEER"] = json.dumps(
        {"workload": workload, "folder": folder,
         "threads": max(1, int(cpus))})
    run_simulation(
        server_app=server, client_app=app, num_supernodes=clients,
        backend_config={
            "client_resources": {"num_cpus": cpus, "num_gpus": 0.0},
            "init_args": {"num_cpus": os.cpu_count()}})
  later = times[1:]
  return {"variant": "flower", "workload": workload, "clients": clients,
          "actors": actors, "threads": max(1, int(cpus)),
          "first_round_s": round(times[0][0], 3),
          "round_s": round(statistics.median(t for t, *_ in later), 4),
          "cpu_s": round(statistics.median(c for _, c, *_ in later), 3),
          "rounds": len(later),
          "results": [r for *_, r, _ in times],
          "failures": [f for *_, f in times],
          "flwr": flwr.__version__}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workload", choices=("image", "finetune"),
                      required=True)
  parser.add_argument("--clients", type=int, nargs="+", default=[10])
  parser.add_argument("--rounds", type=int, default=2,
                      help="timed rounds after the first")
  parser.add_argument("--actors", type=int, default=os.cpu_count(),
                      help="clients trained at once (Ray actors)")
  args = parser.parse_args(argv)
  import importlib.util  # pylint: disable=g-import-not-at-top
  needed = ("flwr", "ray", "torch") + (
      ("peft",) if args.workload == "finetune" else ())
  missing = [name for name in needed if importlib.util.find_spec(name) is None]
  if missing:
    print(json.dumps({"variant": "flower", "workload": args.workload,
                      "skipped": f"not installed: {', '.join(missing)}"}))
    return 0
  for clients in args.clients:
    result = run(args.workload, clients, args.rounds, args.actors)
    print(json.dumps({**result, "date": datetime.date.today().isoformat(),
                      "machine": f"{platform.machine()}, "
                                 f"{os.cpu_count()} cores",
                      "load": [round(x, 2) for x in os.getloadavg()]}),
          flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
