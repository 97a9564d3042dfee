"""Working memory of local training, read from the compiled program.

  python experiments/bench/engine_memory.py [--dump DIR]

Compiles the engine's local trainer for mlp2 (batch 5) at 2 and 8 clients
side by side, 1 and 4 epochs, at each matmul precision, and prints one
JSON line per program: XLA's ``memory_analysis()`` temporary bytes, and
the bytes each added client costs in models' worth. With ``--dump`` the
width-8 programs' buffer assignments are written there (XLA's own dump),
to see which buffers a client adds on a backend.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dump", default=None,
                      help="folder for XLA's dump of the width-8 programs")
  parser.add_argument("--precisions", default="highest,default",
                      help="comma-separated matmul precisions")
  args = parser.parse_args(argv)
  if args.dump:
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [
        os.environ.get("XLA_FLAGS"), f"--xla_dump_to={args.dump}",
        "--xla_dump_hlo_module_re=.*train.*"]))
  # pylint: disable=g-import-not-at-top
  import jax
  import jax.numpy as jnp
  import numpy as np
  from fedjax_agg import engine, federated, models
  from fedjax_agg.config import LocalTraining

  model = models.get("mlp2", num_classes=10, input_shape=(28, 28, 1))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(160, 28, 28, 1)).astype(np.float32)
  data = federated.from_partition(x, rng.integers(0, 10, 160),
                                  list(np.array_split(np.arange(160), 8)))
  params = model.init(jax.random.key(0))
  model_bytes = sum(a.nbytes for a in jax.tree.leaves(params))
  for precision in args.precisions.split(","):
    temp = {}
    for epochs in (1, 4):
      for width in (2, 8):
        train = engine.make_local_trainer(
            model, LocalTraining(batch_size=5, epochs=epochs,
                                 matmul_precision=precision),
            clients_per_step=width)
        ids = jnp.arange(width, dtype=jnp.int32)
        compiled = jax.jit(train).lower(
            params, data, ids, jnp.full((width,), 0.1),
            engine.full_steps(data, ids, 5, epochs),
            jax.random.key(1)).compile()
        temp[epochs, width] = compiled.memory_analysis().temp_size_in_bytes
    print(json.dumps({
        "bench": "engine_memory", "backend": jax.default_backend(),
        "matmul_precision": precision, "model_bytes": model_bytes,
        "temp_bytes": {f"epochs{e}_width{w}": v
                       for (e, w), v in sorted(temp.items())},
        "models_per_added_client": round(
            (temp[1, 8] - temp[1, 2]) / 6 / model_bytes, 3),
        "models_added_by_3_more_epochs": round(
            max(temp[4, w] - temp[1, w] for w in (2, 8)) / model_bytes, 3),
    }), flush=True)


if __name__ == "__main__":
  main()
