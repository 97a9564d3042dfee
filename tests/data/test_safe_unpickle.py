"""No code runs from data files: the restricted CIFAR unpickler, and no
unsafe deserialisation anywhere in the library or the experiments.
"""

import os
import pathlib
import pickle
import pickletools
import re

import numpy as np
import pytest

from fedjax_agg import data
from tests.data._util import _batch
from tests.data._util import _py2_style_pickle


ROOT = pathlib.Path(__file__).resolve().parents[2]


def _globals(raw: bytes) -> set[str]:
  names, strings = set(), []
  for op, arg, _ in pickletools.genops(raw):
    if op.name == "GLOBAL":
      names.add(arg.replace(" ", "."))
    elif op.name == "STACK_GLOBAL":
      names.add(".".join(strings[-2:]))
    if isinstance(arg, str):
      strings.append(arg)
  return names


def _write_cifar(tmp_path, name: str, write, num_images: int = 3):
  """Writes the CIFAR python archive of ``name`` with ``write(obj) ->
  bytes``; returns {file name: batch}."""
  rng = np.random.default_rng(0)
  if name == "cifar10":
    folder = tmp_path / "cifar-10-batches-py"
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    key, num_classes = b"labels", 10
  else:
    folder = tmp_path / "cifar-100-python"
    files, key, num_classes = ["train", "test"], b"fine_labels", 100
  folder.mkdir()
  batches = {}
  for file in files:
    batches[file] = _batch(rng, num_images, key, num_classes)
    (folder / file).write_bytes(write(batches[file]))
  return batches


WRITERS = {
    "python2_cpickle": _py2_style_pickle,
    "protocol_2": lambda obj: pickle.dumps(obj, protocol=2),
    "protocol_4": lambda obj: pickle.dumps(obj, protocol=4),
    "protocol_5": lambda obj: pickle.dumps(obj, protocol=5),
}


def test_python2_style_batch_references_what_real_cifar_does():
  raw = _py2_style_pickle(_batch(np.random.default_rng(0), 2, b"labels", 10))
  assert _globals(raw) == {"numpy.core.multiarray._reconstruct",
                           "numpy.ndarray", "numpy.dtype"}
  # Every key comes back as bytes, as with the real archives.
  batch = pickle.loads(raw, encoding="bytes")
  assert set(batch) == {b"batch_label", b"labels", b"data", b"filenames"}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_genuine_cifar_batches_load(tmp_path, name, writer):
  batches = _write_cifar(tmp_path, name, WRITERS[writer])
  ds = data.load(name, source="files", data_dir=str(tmp_path))
  key = b"labels" if name == "cifar10" else b"fine_labels"
  train_files = [f for f in batches if f not in ("test_batch", "test")]
  test_file = "test_batch" if name == "cifar10" else "test"
  expected_y = np.concatenate([batches[f][key] for f in train_files])
  np.testing.assert_array_equal(ds.train_y, expected_y)
  np.testing.assert_array_equal(ds.test_y, batches[test_file][key])
  # Row layout: the R, G, B planes of a 32x32 image.
  flat = batches[test_file][b"data"][1]
  np.testing.assert_allclose(ds.test_x[1, 4, 7] * 255,
                             flat.reshape(3, 32, 32)[:, 4, 7], atol=1e-3)
  assert ds.train_x.shape == (len(expected_y), 32, 32, 3)


class _RunsShell:
  def __init__(self, command: str):
    self.command = command

  def __reduce__(self):
    return os.system, (self.command,)


class _CallsBuiltin:
  def __init__(self, function, argument):
    self.function, self.argument = function, argument

  def __reduce__(self):
    return self.function, (self.argument,)


def test_crafted_batch_calling_os_system_is_refused(tmp_path):
  marker = tmp_path / "marker"
  _write_cifar(tmp_path, "cifar10", WRITERS["protocol_2"])
  crafted = tmp_path / "cifar-10-batches-py" / "data_batch_1"
  payload = {b"data": _RunsShell(f"touch {marker}"), b"labels": [0]}
  crafted.write_bytes(pickle.dumps(payload, protocol=2))
  assert any(name.endswith(".system") for name in
             _globals(crafted.read_bytes()))
  with pytest.raises(data.ForbiddenPickleError) as info:
    data.load("cifar10", source="files", data_dir=str(tmp_path))
  assert str(crafted) in str(info.value)
  assert "system" in str(info.value)
  assert not marker.exists()


@pytest.mark.parametrize("payload", [
    _CallsBuiltin(eval, "1 + 1"),
    _CallsBuiltin(exec, "import os"),
    _CallsBuiltin(getattr, None),
    _CallsBuiltin(np.load, "x.npy"),
    np.array([1, "text", None], dtype=object),  # Object dtype.
], ids=["eval", "exec", "getattr", "numpy.load", "object_array"])
@pytest.mark.parametrize("protocol", [2, 5])
def test_other_globals_are_refused(tmp_path, payload, protocol):
  path = tmp_path / "batch"
  path.write_bytes(pickle.dumps({b"data": payload, b"labels": [0]},
                                protocol=protocol))
  with pytest.raises(data.ForbiddenPickleError, match=re.escape(str(path))):
    data.read_cifar_batch(path, b"labels")


def test_codecs_encode_only_to_latin1(tmp_path):
  # protocol 2 writes bytes as _codecs.encode(text, "latin1"); any other
  # codec is refused.
  raw = pickle.dumps(b"\xff", protocol=2).replace(b"latin1", b"rot_13")
  path = tmp_path / "batch"
  path.write_bytes(raw)
  with pytest.raises(data.ForbiddenPickleError, match="rot_13"):
    data.read_cifar_batch(path, b"labels")


# Deserialisation that can run code or build arbitrary objects. The
# restricted unpickler's own module is the one place allowed to use pickle.
UNSAFE = {
    "pickle module": re.compile(
        r"\b(c?pickle|cloudpickle|dill|shelve|marshal|jsonpickle)\b"
        r"\s*(\.|import)|import\s+(c?pickle|cloudpickle|dill|shelve|"
        r"marshal|jsonpickle)\b"),
    "builtin eval/exec": re.compile(r"(?<![\w.])(eval|exec)\s*\("),
    "allow_pickle=True": re.compile(r"allow_pickle\s*=\s*True"),
    "yaml.load": re.compile(r"yaml\.(unsafe_|full_)?load(_all)?\s*\("),
    "pandas read_pickle": re.compile(r"read_pickle\s*\("),
    "torch.load / joblib.load": re.compile(r"\b(torch|joblib)\.load\s*\("),
}
ALLOWED = {ROOT / "fedjax_agg" / "data" / "_safe_unpickle.py"}


def _sources():
  for folder in ("fedjax_agg", "experiments"):
    for path in sorted((ROOT / folder).rglob("*")):
      if path.suffix in (".py", ".ipynb") and path not in ALLOWED:
        yield path


def _np_load_calls(text: str):
  """The argument text of every np.load / numpy.load call."""
  for match in re.finditer(r"\b(np|numpy)\.load\s*\(", text):
    depth, start = 1, match.end()
    for end in range(start, len(text)):
      depth += {"(": 1, ")": -1}.get(text[end], 0)
      if depth == 0:
        yield text[start:end]
        break


def test_no_unsafe_deserialisation_in_library_or_experiments():
  found = []
  for path in _sources():
    text = path.read_text(encoding="utf-8")
    for what, pattern in UNSAFE.items():
      for match in pattern.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    for arguments in _np_load_calls(text):
      if not re.search(r"allow_pickle\s*=\s*False", arguments):
        found.append(f"{path.relative_to(ROOT)}: np.load without "
                     f"allow_pickle=False: np.load({arguments})")
  assert not found, "\n".join(found)


def test_the_scan_finds_what_it_looks_for():
  samples = ["import pickle", "obj = pickle.loads(raw)", "eval(text)",
             "exec(code)", "np.load(path, allow_pickle=True)",
             "yaml.load(f)", "df = pd.read_pickle(p)"]
  for sample in samples:
    assert any(p.search(sample) for p in UNSAFE.values()), sample
  for sample in ["ast.literal_eval(text)", "model.eval()",
                 "allow_pickle=False", "yaml.safe_load(f)"]:
    assert not any(p.search(sample) for p in UNSAFE.values()), sample
  assert list(_np_load_calls("np.load(f(x), allow_pickle=False)")) == [
      "f(x), allow_pickle=False"]
