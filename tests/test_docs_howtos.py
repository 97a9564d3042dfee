"""The how-to pages' code runs as written and prints what they show.

Each page's fenced blocks are taken from the Markdown in order, so the
page and the test cannot drift apart:

* a ``python`` block whose first line is ``# NAME.py`` is a file of the
  reader's: it is written to the working folder (importable from there);
* every other ``python`` block runs, in one namespace per page;
* a ``text`` block right after a ``python`` or ``sh`` block is what it
  prints: the words must be the same and every number within
  ``rel=2e-2, abs=2e-3`` of it (the page's numbers come from a run
  compiled as users' runs are, the test's programs are compiled fast);
* a ``sh`` block holds ``python -m fedjax_agg ...`` commands, run
  in-process.

Everything runs in a fresh folder; the ``module:factory`` names a page
resolved are dropped from the registries afterwards.
"""

import contextlib
import io
import math
import re
import shlex
import sys

import pytest

from fedjax_agg import cli
from fedjax_agg import experiment
from tests._docs_util import ROOT
from tests.test_config_never_runs_code import _registries

HOWTO = ROOT / "docs" / "howto"
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```|^## ([^\n]*)$", re.M | re.S)
_FILE = re.compile(r"# ([A-Za-z_]\w*)\.py\n")
_CONFIG_5K = {"name": "refused",
              "dataset": {"name": "mnist", "source": "mnist_5k"},
              "partition": {"name": "iid", "num_clients": 4},
              "model": {"name": "mlp2"}, "seeds": [0]}
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def page_blocks(name, sections=None):
  """``(language, code)`` of each fenced block of docs/howto/``name``;
  ``sections``: only those under a ``## `` heading starting with one of
  these (e.g. ``("1.", "4.")``)."""
  text = (HOWTO / name).read_text("utf8")
  blocks, heading = [], ""
  for match in _BLOCK.finditer(text):
    if match.group(3) is not None:
      heading = match.group(3)
    elif sections is None or heading.startswith(tuple(sections)):
      blocks.append((match.group(1), match.group(2)))
  return blocks


def _numbers(text):
  return [float(n.replace(",", "")) for n in _NUMBER.findall(text)]


def same_output(printed, shown):
  """Whether ``printed`` is ``shown`` up to the numbers' tolerance."""
  words = lambda text: _NUMBER.sub("#", text).split()
  if words(printed) != words(shown):
    return False
  return all(math.isclose(a, b, rel_tol=2e-2, abs_tol=2e-3)
             for a, b in zip(_numbers(printed), _numbers(shown),
                             strict=True))


def _commands(code):
  """The shell block's commands, continuation lines joined."""
  return [line for line in code.replace("\\\n", " ").splitlines()
          if line.strip()]


def run_page(name, folder, monkeypatch, sections=None, check=True):
  """Runs the page's blocks (of ``sections``, see ``page_blocks``) in
  ``folder``; -> each block's printed text (``check``: compared with the
  page's ``text`` blocks)."""
  monkeypatch.chdir(folder)
  monkeypatch.syspath_prepend(str(folder))
  namespace = {"__name__": f"docs_howto_{name[:-3].replace('-', '_')}"}
  modules, printed, previous = [], [], None
  try:
    for i, (language, code) in enumerate(page_blocks(name, sections)):
      where = f"docs/howto/{name}, block {i + 1} of sections {sections}"
      output = io.StringIO()
      if language == "python" and _FILE.match(code):
        module = _FILE.match(code).group(1)
        (folder / f"{module}.py").write_text(code)
        modules.append(module)
      elif language == "python":
        with contextlib.redirect_stdout(output):
          exec(compile(code, where, "exec"), namespace)  # pylint: disable=exec-used
      elif language == "sh":
        for command in _commands(code):
          argv = shlex.split(command)
          assert argv[:3] == ["python", "-m", "fedjax_agg"], (where, command)
          with contextlib.redirect_stdout(output):
            assert cli.main(argv[3:]) == 0, (where, command)
      elif language == "text" and check:
        assert previous in ("python", "sh"), f"{where}: output of no code"
        shown = code
        assert same_output(printed[-1], shown), (
            f"{where} shows\n{shown}\nbut the block before printed\n"
            f"{printed[-1]}")
      printed.append(output.getvalue())
      previous = language
  finally:
    for module in modules:
      sys.modules.pop(module, None)
      for registry in _registries():
        for entry in [n for n in registry if n.startswith(f"{module}:")]:
          registry._entries.pop(entry, None)  # pylint: disable=protected-access
  return printed


def test_same_output_allows_rounding_only():
  assert same_output("round 10: accuracy 0.8123\n", "round 10: accuracy "
                     "0.812")
  assert same_output("15,770 parameters", "15,770 parameters")
  assert not same_output("accuracy 0.81", "accuracy 0.91")
  assert not same_output("accuracy 0.81", "loss 0.81")
  assert not same_output("1 2", "1")


def test_bring_your_own_model_and_data(tmp_path, monkeypatch):
  run_page("own-model-and-data.md", tmp_path, monkeypatch)
  assert (tmp_path / "results" / "tiny_mlp" / "history.csv").is_file()


def test_your_own_local_objective_and_client_side(tmp_path, monkeypatch):
  run_page("own-local-training.md", tmp_path, monkeypatch,
           sections=("1.", "2.", "3."))


def test_your_own_local_training_from_a_config(tmp_path, monkeypatch):
  run_page("own-local-training.md", tmp_path, monkeypatch,
           sections=("1.", "4."))
  for run in ("local_training/MyFedProx", "local_training/VisitDecay",
              "my_fedprox"):
    assert (tmp_path / "results" / run / "history.csv").is_file(), run
  # What the page says is refused: a module the run did not allow (not
  # even imported) and an object the module did not declare.
  config = experiment.override(_CONFIG_5K, {"algorithms": {"A": {
      "aggregator": "fedavg", "objective": "my_local:my_fedprox"}}})
  with pytest.raises(ValueError, match="not allowed"):
    experiment.check_config(config)
  assert "my_local" not in sys.modules
  config["algorithms"]["A"]["objective"] = "my_local:jnp"
  with pytest.raises(ValueError, match="not declared"):
    experiment.check_config(config, allow_imports=["my_local"])
  sys.modules.pop("my_local", None)


def test_federated_fine_tuning_with_lora(tmp_path, monkeypatch):
  # The page runs from the repository's root, where the base is.
  (tmp_path / "experiments").symlink_to(ROOT / "experiments")
  run_page("lora-fine-tuning.md", tmp_path, monkeypatch)
  assert (tmp_path / "results" / "lora" / "report" / "report.md").is_file()


def test_fine_tuning_a_downloaded_checkpoint(tmp_path, monkeypatch):
  run_page("downloaded-checkpoint.md", tmp_path, monkeypatch)
  history = (tmp_path / "results" / "gpt2" / "FedIT" / "history.json")
  assert "model.base_files" in history.read_text()
  assert (tmp_path / "adapters" / "adapter_model.safetensors").is_file()
