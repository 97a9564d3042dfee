"""``experiments/bench/hf_round_bench.py`` at toy size: the engine's FedIT
round on a Hugging Face checkpoint folder (a fresh GPT-2 over the 80
characters, written by ``save_pretrained``) is timed and printed as one
JSON line; the loop is left out (transformers is not a dependency)."""

import json

import jax

from fedjax_agg.models import pretrained
from tests.experiments_scripts._util import load_script

bench = load_script("bench", "hf_round_bench.py")


def test_the_engine_round_on_a_checkpoint_folder(tmp_path, capsys):
  model, variables = pretrained.init_pretrained(
      {"architectures": ["GPT2LMHeadModel"], "vocab_size": 80,
       "n_positions": 80, "n_embd": 16, "n_layer": 1, "n_head": 2},
      jax.random.key(0))
  pretrained.save_pretrained(tmp_path / "gpt2", model, variables)
  assert bench.main(["--base", str(tmp_path / "gpt2"), "--clients", "2",
                     "--rounds", "1", "--no-loop"]) == 0
  line, = capsys.readouterr().out.strip().splitlines()
  result = json.loads(line)
  assert result["variant"] == "engine" and result["clients"] == 2
  assert result["architecture"] == "GPT2LMHeadModel"
  assert result["round_s"] > 0 and result["date"]
