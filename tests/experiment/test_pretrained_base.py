"""A downloaded checkpoint as a run's base: ``model.name`` "pretrained"
with ``model.base`` a Hugging Face folder, from a config, the command line
and Python alike; its files' hashes recorded in the run's config and its
checkpoints' fingerprint (a resume on another base is refused); hostile
folders, arguments and data refused by name before anything runs."""

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from fedjax_agg import cli
from fedjax_agg import experiment
from fedjax_agg import spec

_FIXTURE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models",
                        "pretrained_fixtures", "gpt2")
_VOCAB, _POSITIONS = 400, 256


def _checkpoint(folder, seed=0):
  """The GPT-2 fixture widened to a 400-token vocabulary and 256 positions
  (rows drawn with ``seed``): a byte-level BPE of the instruction task
  fits it."""
  tensors = load_file(os.path.join(_FIXTURE, "model.safetensors"))
  rng = np.random.default_rng(seed)
  wte = tensors["transformer.wte.weight"]
  tensors["transformer.wte.weight"] = np.concatenate([wte, 0.02 * rng.normal(
      size=(_VOCAB - len(wte), wte.shape[1])).astype(np.float32)])
  wpe = tensors["transformer.wpe.weight"]
  tensors["transformer.wpe.weight"] = np.concatenate([wpe, 0.02 * rng.normal(
      size=(_POSITIONS - len(wpe), wpe.shape[1])).astype(np.float32)])
  with open(os.path.join(_FIXTURE, "config.json")) as f:
    config = json.load(f)
  config.update(vocab_size=_VOCAB, n_positions=_POSITIONS)
  os.makedirs(folder, exist_ok=True)
  save_file(tensors, os.path.join(folder, "model.safetensors"))
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(config, f)
  return str(folder)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return _checkpoint(tmp_path_factory.mktemp("base") / "gpt2")


def _config(base_folder, **model):
  return {
      "dataset": {"name": "instructions",
                  "args": {"num_records": 80, "num_clients": 4,
                           "vocab_size": 400, "sequence_length": 192}},
      "partition": {"name": "natural", "num_clients": 4},
      "model": {"name": "pretrained", "base": base_folder, **model},
      "train": {"rounds": 2, "participation": 0.5, "batch_size": 8,
                "learning_rate": 0.5, "eval_clients": False},
      "algorithms": {"FedIT": {"aggregator": "fedit",
                               "adapters": {"rank": 2}}}}


def _sha256(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def test_a_config_fine_tunes_the_checkpoint_and_records_its_files(
    base, tmp_path):
  path = tmp_path / "config.json"
  path.write_text(json.dumps(_config(base)))
  out = tmp_path / "run"
  assert cli.main(["--config", str(path), "--out", str(out),
                   "--no-progress"]) == 0
  history = json.loads((out / "history.json").read_text())
  losses = [row["test_loss"] for row in history["rows"]]
  assert len(losses) == 3 and np.all(np.isfinite(losses))
  assert losses[-1] < losses[0]  # the adapters learned
  files = history["config"]["model.base_files"]
  assert files == {name: _sha256(os.path.join(base, name))
                   for name in ("config.json", "model.safetensors")}
  record = json.loads((out / "config.json").read_text())
  assert record["model"]["base"] == base
  assert record["model"]["args"] == {"dtype": "float32", "remat": False}


def test_python_and_the_command_line_build_the_same_run(base, tmp_path):
  config = _config(base, args={"dtype": "bfloat16"})
  config["algorithms"] = {"Full": {"aggregator": "fedavg"}}  # every weight
  summary = experiment.run_config(spec.Experiment.from_dict(config),
                                  str(tmp_path / "py"), progress=False)
  path = tmp_path / "config.json"
  path.write_text(json.dumps(config))
  assert cli.main(["--config", str(path), "--out", str(tmp_path / "cli"),
                   "--no-progress"]) == 0
  rows = [json.loads((tmp_path / name / "history.json").read_text())["rows"]
          for name in ("py", "cli")]
  assert [r["test_loss"] for r in rows[0]] == [r["test_loss"]
                                               for r in rows[1]]
  assert np.isfinite(summary["Full"]["final_test_accuracy"])
  # A language model's summary also gives its final perplexity.
  np.testing.assert_allclose(summary["Full"]["final_test_perplexity_mean"],
                             np.exp(rows[0][-1]["test_loss"]), rtol=1e-6)
  assert summary["Full"]["final_test_perplexity_std"] == 0.0


def test_a_resume_on_another_base_is_refused(base, tmp_path, capsys):
  mine = _checkpoint(tmp_path / "mine")
  path = tmp_path / "config.json"
  path.write_text(json.dumps(_config(mine)))
  out = tmp_path / "run"
  args = ["--config", str(path), "--out", str(out), "--no-progress",
          "--checkpoint-every", "1"]
  assert cli.main(args) == 0
  # The same shapes, other weights: only the files' hashes tell.
  shutil.rmtree(mine)
  _checkpoint(tmp_path / "mine", seed=1)
  capsys.readouterr()
  with pytest.raises(SystemExit):
    cli.main(args + ["--resume", "--rounds", "3"])
  assert "model.base_files" in capsys.readouterr().err


@pytest.mark.parametrize("model, error", [
    ({"base": None}, "model.base must name the checkpoint folder"),
    ({"base": "no/such/folder"}, "must be a Hugging Face checkpoint folder"),
    ({"base": 3}, "must be a Hugging Face checkpoint folder"),
    ({"args": {"dtype": "float16"}}, "model.args.dtype"),
    ({"args": {"remat": "yes"}}, "model.args.remat"),
    ({"args": {"dtyp": "float32"}}, "did you mean 'dtype'"),
    ({"args": {"width": 8}}, "model.args"),
])
def test_bad_settings_are_refused_by_name(base, model, error):
  config = _config(base)
  config["model"].update(model)
  with pytest.raises(spec.ConfigError, match=error):
    spec.Experiment.from_dict(config)


def test_a_checkpoint_folder_under_another_network_is_refused(base):
  config = _config(base)
  config["model"]["name"] = "transformer_lm"
  with pytest.raises(spec.ConfigError, match="set model.name to "
                     "'pretrained'"):
    spec.Experiment.from_dict(config)


def _damaged(tmp_path, base, damage):
  folder = tmp_path / "damaged"
  shutil.copytree(base, folder)
  damage(folder)
  return str(folder)


@pytest.mark.parametrize("damage, error", [
    (lambda f: (f / "config.json").write_text('{"vocab_size": NaN}'),
     "config.json"),
    (lambda f: (f / "config.json").write_text(json.dumps(
        {"architectures": ["BertModel"]})), "BertModel"),
    (lambda f: (f / "model.safetensors").write_bytes(b"\xff" * 64),
     "model.safetensors: not a valid safetensors file"),
    (lambda f: (f / "model.safetensors").unlink(), "model.safetensors"),
])
def test_a_damaged_checkpoint_is_refused_before_anything_runs(
    base, tmp_path, damage, error):
  config = _config(_damaged(tmp_path, base, damage))
  with pytest.raises(spec.ConfigError, match=error) as raised:
    spec.Experiment.from_dict(config)
  assert raised.value.path == "model.base"


@pytest.mark.parametrize("dataset, error", [
    ({"args": {"num_records": 80, "num_clients": 4, "vocab_size": 400,
               "sequence_length": 300}}, "longer than the checkpoint's 256"),
    ({"args": {"num_records": 80, "num_clients": 4, "vocab_size": 600,
               "sequence_length": 192}}, "more than the checkpoint's "
     "vocab_size 400"),
])
def test_data_the_checkpoint_cannot_read_is_refused(base, tmp_path, dataset,
                                                    error):
  config = _config(base)
  config["dataset"].update(dataset)
  with pytest.raises(spec.ConfigError, match=error):
    experiment.run_config(spec.Experiment.from_dict(config),
                          str(tmp_path / "run"), progress=False)
  assert not (tmp_path / "run" / "history.json").exists()


def test_images_are_refused_for_a_checkpoint(base, tmp_path):
  config = _config(base)
  config["dataset"] = {"name": "mnist", "source": "mnist_5k"}
  config["partition"] = {"name": "iid", "num_clients": 4}
  with pytest.raises(spec.ConfigError, match="reads token sequences"):
    experiment.run_config(spec.Experiment.from_dict(config),
                          str(tmp_path / "run"), progress=False)


_FLAGS = ["--model", "pretrained", "--dataset", "instructions",
          "--dataset-arg", "num_records=80", "--dataset-arg", "vocab_size=400",
          "--dataset-arg", "sequence_length=192", "--dataset-arg",
          "num_clients=4", "--partition", "natural", "--num-clients", "4",
          "--rounds", "1", "--no-progress"]


def test_the_flags_name_the_base(base, tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(_FLAGS + ["--base", base, "--lora-rank", "2",
                            "--aggregator", "ffa_lora", "--out",
                            str(out)]) == 0
  record = json.loads((out / "config.json").read_text())
  assert record["model"]["base"] == base
  assert record["algorithms"]["ffa_lora"]["aggregator"] == "ffa_lora"
  capsys.readouterr()
  with pytest.raises(SystemExit):
    cli.main(_FLAGS + ["--out", str(tmp_path / "none")])
  assert "--base: model.base must name the checkpoint folder" in (
      capsys.readouterr().err)
  assert not (tmp_path / "none").exists()


def test_secure_sums_private_rules_sweeps_and_report_take_it(base, tmp_path):
  # FFA-LoRA on the secure sum; DP-FedAvg on the adapters, two seeds as one
  # vmapped sweep; both read back by report.
  secure = _config(base)
  secure.update(systems={"secagg_bits": 20, "secagg_clip": 1.0})
  secure["algorithms"] = {"FFA-LoRA": {"aggregator": "ffa_lora",
                                       "adapters": {"rank": 2}}}
  experiment.run_config(secure, str(tmp_path / "secure"), progress=False)
  private = _config(base)
  private.update(seeds=[0, 1], vmap_seeds=True)
  private["algorithms"] = {"DP": {
      "aggregator": "dp_fedavg", "adapters": {"rank": 2},
      "aggregator_args": {"noise_multiplier": 0.5, "clip_norm": 1.0}}}
  experiment.run_config(private, str(tmp_path / "private"), progress=False)
  # One algorithm: no folder of its own; seeds: one folder each.
  for path in ("secure", "private/seed0", "private/seed1"):
    rows = json.loads((tmp_path / path / "history.json").read_text())["rows"]
    assert np.all(np.isfinite([r["test_perplexity"] for r in rows]))
  rows = json.loads((tmp_path / "private" / "seed0" /
                     "history.json").read_text())["rows"]
  assert rows[-1]["epsilon"] > 0
  assert cli.main(["report", str(tmp_path / "secure"),
                   str(tmp_path / "private"), "--metric", "test_perplexity",
                   "--out", str(tmp_path / "report")]) == 0
  report = (tmp_path / "report" / "report.md").read_text()
  assert "| secure | 1 |" in report and "| private | 2 |" in report
  assert "test perplexity" in report
