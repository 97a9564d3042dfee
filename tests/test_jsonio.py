"""Strict, atomic JSON files."""

import json
import math
import os

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_agg import jsonio


def _strict_load(path):
  def refuse(token):
    raise ValueError(f"not JSON: {token}")
  with open(path) as f:
    return json.load(f, parse_constant=refuse)


def test_dump_json_is_strict_and_converts_arrays(tmp_path):
  path = tmp_path / "x.json"
  jsonio.dump_json({
      "nan": math.nan, "inf": -math.inf, "f32": np.float32(0.5),
      "int": np.int64(3), "bool": np.bool_(True),
      "array": np.array([1.0, np.nan, np.inf]),
      "jax": jnp.arange(3), "bf16": jnp.ones(2, jnp.bfloat16),
      "nested": ({"t": (1, 2)}, [math.nan]), 7: "int key",
      "other": object}, str(path))
  data = _strict_load(path)
  assert data["nan"] is None and data["inf"] is None
  assert data["f32"] == 0.5 and data["int"] == 3 and data["bool"] is True
  assert data["array"] == [1.0, None, None]
  assert data["jax"] == [0, 1, 2] and data["bf16"] == [1.0, 1.0]
  assert data["nested"] == [{"t": [1, 2]}, [None]]
  assert data["7"] == "int key" and "object" in data["other"]
  assert os.listdir(tmp_path) == ["x.json"]  # no temporary file left
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


def test_dump_json_failure_keeps_the_old_file(tmp_path):
  path = tmp_path / "x.json"
  jsonio.dump_json({"a": 1}, str(path))

  class Bad:
    def __array__(self, *args, **kwargs):
      raise RuntimeError("no")
  with pytest.raises(RuntimeError):
    jsonio.dump_json({"a": Bad()}, str(path))
  assert _strict_load(path) == {"a": 1}
  assert os.listdir(tmp_path) == ["x.json"]


@pytest.mark.parametrize("text,path,values", [
    ('{"train": {"rounds": 1, "lr": 0.1, "rounds": 30}}', "train.rounds",
     "(1, then 30)"),
    ('{"algorithms": {"A": {"aggregator": "fedavg"}, '
     '"A": {"aggregator": "krum"}}}', "algorithms.A",
     '({"aggregator": "fedavg"}, then {"aggregator": "krum"})'),
    ('{"seeds": [0], "name": "x", "seeds": [1]}', "seeds", "([0], then [1])"),
    ('{"a": [{"b": 1}, {"c": {"d": 1, "d": 1}}]}', "a[1].c.d",
     "(1, then 1)"),
])
def test_load_json_refuses_a_key_given_twice_naming_its_path(
    tmp_path, text, path, values):
  file = tmp_path / "config.json"
  file.write_text(text)
  with pytest.raises(jsonio.DuplicateKeyError) as raised:
    jsonio.load_json(str(file))
  assert raised.value.path == path
  assert str(raised.value).startswith(f"{path}: given twice {values}")
  assert isinstance(raised.value, ValueError)


def test_load_json_reads_what_json_reads_when_keys_are_distinct(tmp_path):
  # The same key in different objects is no repeat.
  text = ('{"a": {"x": 1, "y": [1, {"x": 2}]}, "b": {"x": null}, '
          '"x": [true, 1.5, "s"]}')
  file = tmp_path / "config.json"
  file.write_text(text)
  loaded = jsonio.load_json(str(file))
  assert loaded == json.loads(text)
  assert type(loaded["a"]) is dict and type(loaded["a"]["y"][1]) is dict
