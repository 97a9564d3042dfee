"""Every ``--*-arg NAME=VALUE`` flag reads VALUE one way (booleans in any
case, Python literals, else text) and refuses hostile pairs by name."""

import pytest

from fedjax_agg.cli import _flags


@pytest.mark.parametrize("text, value", [
    ("false", False), ("False", False), ("FALSE", False), ("true", True),
    ("True", True), ("0", 0), ("0.5", 0.5), ("[8, 16]", [8, 16]),
    ("None", None), ("'8'", "8"), ("fc1|fc2", "fc1|fc2"), ("nan", "nan"),
    ("1e400", float("inf")),
])
def test_values_are_read_one_way(text, value):
  assert _flags.parse_kv([f"uniform={text}"], "--agg-arg") == {
      "uniform": value}
  assert _flags.parse_grid([f"alpha={text}"]) == {"alpha": [value]} or (
      "," in text)


@pytest.mark.parametrize("pairs, message", [
    (["a=1", "a=2"], "a is given twice"),
    (["=1"], "is not an argument name"),
    (["a b=1"], "is not an argument name"),
    (["../x=1"], "is not an argument name"),
    (["novalue"], "expects name=value"),
    (["a=" + "1" * 20_000], "characters long"),
])
def test_hostile_pairs_are_refused_naming_the_flag(pairs, message):
  with pytest.raises(_flags.UsageError, match=message) as raised:
    _flags.parse_kv(pairs, "--agg-arg")
  assert str(raised.value.message).startswith("--agg-arg")
  with pytest.raises(_flags.UsageError, match="--sweep"):
    _flags.parse_grid(["lr=0.1", "learning_rate=0.2"])


def test_a_value_nested_past_the_parser_is_text_or_refused():
  deep = "[" * 5000 + "]" * 5000
  try:
    value = _flags.parse_kv([f"a={deep}"], "--agg-arg")["a"]
  except _flags.UsageError as error:
    assert "nested too deeply" in error.message
  else:
    assert value == deep  # then refused by the argument's own type check
