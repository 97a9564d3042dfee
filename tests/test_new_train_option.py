"""A new train option is one declaration plus the code that reads it, as
docs/contributing.md says: a copy of the package gains a field of
``LocalTraining`` (``grad_scale``, declared with ``spec_field``) and one
line of the trainer (``engine/_trainer.py``) that reads it, and nothing
else. The option is then a
flag in ``--help``, a key of a JSON config, checked by name from both,
echoed in ``config.json``, and it reaches the trainer: SGD with gradients
scaled by 1/2 is SGD at half the learning rate, so the two histories are
equal, and unequal to the unscaled run's."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import fedjax_agg

_DECLARATION = '''\
  grad_scale: float = spec_field(1.0, Flag(
      "--grad-scale", "factor on every local gradient", type=float),
      check=lambda name, value: checks.check_number(name, value, 0))
'''
_READ = "updates, new_opt_state = optimizer.update(grads, opt_state, params)"
_READER = ("grads = jax.tree.map(lambda g: g * training.grad_scale, grads)"
           "\n{indent}" + _READ)

_SCRIPT = textwrap.dedent('''
    import contextlib, io, json, sys
    from fedjax_agg import cli
    assert cli.__file__.startswith(sys.argv[1]), cli.__file__
    out, base = sys.argv[2], json.loads(sys.argv[3])
    result = {}
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text):
      try:
        cli.main(["--help"])
      except SystemExit:
        pass
    result["help"] = help_text.getvalue()
    def run(name, *flags):
      cli.main(base + ["--out", f"{out}/{name}", *flags])
    run("half_grad", "--lr", "0.1", "--grad-scale", "0.5")
    run("half_lr", "--lr", "0.05")
    run("full", "--lr", "0.1")
    run("json", "--config", f"{out}/config_in.json")
    refusals = {}
    for name, flags in {"negative": ["--grad-scale", "-1"],
                        "nan": ["--grad-scale", "nan"],
                        "word": ["--grad-scale", "big"],
                        "typo": ["--config", f"{out}/typo.json"]}.items():
      err = io.StringIO()
      with contextlib.redirect_stderr(err):
        try:
          run("refused_" + name, *flags)
          refusals[name] = "ran"
        except SystemExit:
          refusals[name] = err.getvalue()
    result["refusals"] = refusals
    print(json.dumps(result))
''')

_BASE = ["--dataset", "mnist", "--source", "mnist_5k",
         "--max-train-examples", "200", "--num-clients", "4", "--model",
         "mlp2", "--rounds", "2", "--participation", "1.0", "--batch-size",
         "20", "--no-progress", "--no-client-eval", "--seed", "3"]
_JSON = {"dataset": {"name": "mnist", "source": "mnist_5k",
                     "max_train_examples": 200},
         "partition": {"name": "iid", "num_clients": 4},
         "model": {"name": "mlp2"},
         "train": {"rounds": 1, "grad_scale": 0.25, "eval_clients": False},
         "algorithms": {"FedAvg": {"aggregator": "fedavg"}}}


def _patched_copy(root) -> str:
  source = os.path.dirname(os.path.abspath(fedjax_agg.__file__))
  target = os.path.join(root, "fedjax_agg")
  shutil.copytree(source, target,
                  ignore=shutil.ignore_patterns("__pycache__"))
  path = os.path.join(target, "config", "_training.py")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  anchor = "  optimizer: OptimizerFactory = optax.sgd\n"
  assert text.count(anchor) == 1
  with open(path, "w", encoding="utf-8") as f:
    f.write(text.replace(anchor, _DECLARATION + anchor))
  path = os.path.join(target, "engine", "_trainer.py")
  with open(path, encoding="utf-8") as f:
    lines = f.read().split("\n")
  [row] = [i for i, line in enumerate(lines) if line.strip() == _READ]
  indent = lines[row][:len(lines[row]) - len(lines[row].lstrip())]
  lines[row] = indent + _READER.format(indent=indent)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines))
  return target


def _rows(folder):
  with open(os.path.join(folder, "history.json")) as f:
    return [row for row in json.load(f)["rows"] if row["round"] > 0]


def test_one_declaration_and_one_reader_make_a_working_option(tmp_path):
  package = _patched_copy(str(tmp_path / "pkg"))
  out = tmp_path / "runs"
  out.mkdir()
  (out / "config_in.json").write_text(json.dumps(_JSON))
  typo = json.loads(json.dumps(_JSON))
  typo["train"]["grad_scal"] = typo["train"].pop("grad_scale")
  (out / "typo.json").write_text(json.dumps(typo))
  env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg")}
  done = subprocess.run(
      [sys.executable, "-c", _SCRIPT, package, str(out), json.dumps(_BASE)],
      capture_output=True, text=True, env=env, cwd=str(tmp_path),
      check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert "--grad-scale" in result["help"]
  assert "factor on every local gradient" in result["help"]
  # It reaches the trainer: half the gradient is half the learning rate.
  half_grad, half_lr = _rows(out / "half_grad"), _rows(out / "half_lr")
  full = _rows(out / "full")
  assert len(half_grad) == len(half_lr) == len(full) == 2
  for a, b, c in zip(half_grad, half_lr, full, strict=True):
    for key in ("train_loss", "test_loss"):
      assert abs(a[key] - b[key]) <= 1e-6 * abs(b[key]), (key, a, b)
      assert abs(a[key] - c[key]) > 1e-3 * abs(c[key]), (key, a, c)
  # Echoed in config.json, from the flag and from a JSON config.
  for name, value in (("half_grad", 0.5), ("half_lr", 1.0), ("json", 0.25)):
    with open(out / name / "config.json") as f:
      echoed = json.load(f)
    assert echoed["train"]["grad_scale"] == value, (name, echoed["train"])
  refusals = result["refusals"]
  for name in ("negative", "nan", "word"):
    assert "grad_scale" in refusals[name] or "--grad-scale" in (
        refusals[name]), (name, refusals[name])
  assert "did you mean 'grad_scale'" in refusals["typo"], refusals["typo"]
  # Nothing was written for a refused run.
  assert not any(p.name.startswith("refused_") for p in out.iterdir())
