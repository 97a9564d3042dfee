"""Instruction records and templates: what is read, what is refused (naming
the file and the record), and templates that are data, never code."""

import json
import math

import pytest

from fedjax_agg import data
from fedjax_agg.data import _instructions
from tests.data import _instruction_util

RECORDS = [
    {"instruction": "Name a colour.", "input": "", "output": "Blue.",
     "category": "open_qa"},
    {"instruction": "Add them.", "input": "2 and 3", "output": "5",
     "category": "math", "score": 0.5},
    {"instruction": "Say hi.", "output": "Hi!", "category": 7},
    {"instruction": "Echo.", "input": None, "output": "Echo."},
]
WANT = [
    data.InstructionRecord("Name a colour.", "", "Blue.", "open_qa"),
    data.InstructionRecord("Add them.", "2 and 3", "5", "math"),
    data.InstructionRecord("Say hi.", "", "Hi!", "7"),
    data.InstructionRecord("Echo.", "", "Echo.", None),
]


def _lines(records):
  return "\n".join(json.dumps(record) for record in records) + "\n"


def test_json_list_and_json_lines_read_the_same_records(tmp_path):
  (tmp_path / "a.json").write_text(json.dumps(RECORDS, indent=1))
  (tmp_path / "a.jsonl").write_text(_lines(RECORDS) + "\n\n")
  (tmp_path / "a.txt").write_text(_lines(RECORDS))  # sniffed: starts "{"
  for name in ("a.json", "a.jsonl", "a.txt"):
    assert data.read_instructions(tmp_path / name) == WANT


def test_fields_map_a_files_own_keys(tmp_path):
  dolly = [{"instruction": "Why?", "context": "Because.",
            "response": "So.", "category": "closed_qa"}]
  (tmp_path / "dolly.jsonl").write_text(_lines(dolly))
  got = data.read_instructions(tmp_path / "dolly.jsonl",
                               fields={"input": "context",
                                       "output": "response"})
  assert got == [data.InstructionRecord("Why?", "Because.", "So.",
                                        "closed_qa")]
  with pytest.raises(ValueError, match="no 'output'"):
    data.read_instructions(tmp_path / "dolly.jsonl")
  with pytest.raises(ValueError, match="unknown record fields"):
    data.read_instructions(tmp_path / "dolly.jsonl", fields={"answer": "x"})
  with pytest.raises(TypeError, match="fields"):
    data.read_instructions(tmp_path / "dolly.jsonl", fields={"input": 3})


@pytest.mark.parametrize("record,error,message", [
    ({"output": "x"}, ValueError, "no 'instruction'"),
    ({"instruction": "x"}, ValueError, "no 'output'"),
    ({"instruction": 5, "output": "x"}, TypeError, "'instruction' must be"),
    ({"instruction": "x", "output": ["y"]}, TypeError, "'output' must be"),
    ({"instruction": "x", "output": None}, TypeError, "'output' must be"),
    ({"instruction": "x", "input": 3, "output": "y"}, TypeError,
     "'input' must be"),
    ({"instruction": "x", "output": "y", "category": 1.5}, TypeError,
     "'category' must be"),
    ({"instruction": "x", "output": "y", "category": True}, TypeError,
     "'category' must be"),
    ({"instruction": "x", "output": "y", "category": math.nan}, ValueError,
     "'category' is nan"),
    ({"instruction": "x", "output": "y", "category": -math.inf},
     ValueError, "'category' is -inf"),
    ({"instruction": "x", "output": ""}, ValueError, "'output' is empty"),
    ({"instruction": "x", "output": " \n\t"}, ValueError,
     "'output' is empty"),
    ({"instruction": "", "output": "y"}, ValueError,
     "'instruction' is empty"),
    ({"instruction": "x", "output": "y", "category": " "}, ValueError,
     "'category' is empty"),
    (["x", "y"], TypeError, "must be an object"),
    ("instruction", TypeError, "must be an object"),
])
def test_bad_records_are_refused_naming_the_record(record, error, message):
  good = {"instruction": "a", "output": "b"}
  with pytest.raises(error, match=message) as caught:
    data.check_records([good, record], where="mine")
  assert "mine[1]" in str(caught.value)


@pytest.mark.parametrize("records,error", [
    ([], ValueError), ({"instruction": "a", "output": "b"}, TypeError),
    ("records", TypeError), (None, TypeError)])
def test_a_collection_that_is_not_a_list_of_records_is_refused(records,
                                                                error):
  with pytest.raises(error):
    data.check_records(records)


def test_a_bad_json_lines_line_is_named_by_its_number(tmp_path):
  path = tmp_path / "bad.jsonl"
  lines = _lines(RECORDS[:2]).splitlines()
  path.write_text("\n".join(lines + ["", "{\"instruction\": \"x\", "]))
  with pytest.raises(ValueError,
                     match=r"bad.jsonl line 4 is not valid JSON: .* line 4 "):
    data.read_instructions(path)
  path.write_text("\n".join(lines + ["{\"instruction\": 1, \"output\": "
                                     "\"y\"}"]))
  with pytest.raises(TypeError, match="bad.jsonl line 3: 'instruction'"):
    data.read_instructions(path)
  path.write_text("\n".join(lines + ["[1, 2]"]))
  with pytest.raises(TypeError, match="bad.jsonl line 3 must be an object"):
    data.read_instructions(path)


@pytest.mark.parametrize("text,message", [
    (json.dumps(RECORDS)[:-7], "not valid JSON: .* at line 1"),
    ("[{\"instruction\": \"a\", \"output\": \"b\", \"score\": NaN}]",
     "NaN is not JSON"),
    ("[{\"instruction\": \"a\", \"output\": \"b\", \"score\": -Infinity}]",
     "-Infinity is not JSON"),
    ("{\"instruction\": \"a\", \"output\": \"b\", \"score\": NaN}\n",
     "line 1: NaN is not JSON"),
    ("\n{\"instruction\": \"a\", \"output\": \"b\", \"output\": \"c\"}",
     "key 'output' is given twice"),
    ("[{\"instruction\": \"a\", \"output\": \"b\", \"output\": \"c\"}]",
     "key 'output' is given twice"),
    ("[]", "holds no record"),
    ("\n\n", "must hold a JSON list"),
    ("\"just a string\"", "must hold a JSON list"),
])
def test_files_that_are_not_records_are_refused_naming_them(tmp_path, text,
                                                            message):
  _instruction_util.assert_refused_naming_file(
      data.read_instructions, tmp_path / "records.json", text.encode(),
      message)


def test_a_byte_order_mark_is_dropped(tmp_path):
  path = tmp_path / "bom.jsonl"
  path.write_bytes(b"\xef\xbb\xbf" + _lines(RECORDS).encode())
  assert data.read_instructions(path) == WANT


def test_unreadable_and_missing_files_are_refused(tmp_path):
  path = tmp_path / "latin1.json"
  path.write_bytes(b"[{\"instruction\": \"caf\xe9\", \"output\": \"x\"}]")
  with pytest.raises(ValueError, match="latin1.json is not UTF-8"):
    data.read_instructions(path)
  with pytest.raises(FileNotFoundError, match="nope.json"):
    data.read_instructions(tmp_path / "nope.json")
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n \n")
  with pytest.raises(ValueError, match="empty.jsonl holds no record"):
    data.read_instructions(empty)


# ------------------------------------------------------------- templates


def _by_replacement(template: str, record) -> tuple[str, str]:
  """The (prompt, response) of a plain template by string replacement."""
  before, after = template.split("{output}")
  prompt = before.replace("{instruction}", record.instruction).replace(
      "{input}", record.input)
  return prompt, record.output + after


def test_alpacas_template_is_chosen_by_whether_there_is_an_input():
  with_input, without = WANT[1], WANT[0]
  assert data.render(with_input) == _by_replacement(data.ALPACA_TEMPLATE,
                                                    with_input)
  assert data.render(without) == _by_replacement(
      data.ALPACA_TEMPLATE_NO_INPUT, without)
  prompt, response = data.render(with_input)
  assert prompt.endswith("### Input:\n2 and 3\n\n### Response:\n")
  assert response == "5"


def test_a_template_places_fields_and_literal_braces():
  template = data.parse_template(
      "{{note}} {instruction} | {input} -> {output} {{end}}")
  prompt, response = data.render(WANT[1], template)
  assert prompt == "{note} Add them. | 2 and 3 -> "
  assert response == "5 {end}"


def test_record_text_that_looks_like_a_template_is_placed_verbatim():
  hostile = data.InstructionRecord("{input.__class__} {0} {{x}}",
                                   "{instruction.__init__.__globals__}",
                                   "{output!r}")
  template = data.parse_template("I: {instruction} / {input} / {output}")
  assert data.render(hostile, template) == (
      "I: {input.__class__} {0} {{x}} / {instruction.__init__.__globals__} "
      "/ ", "{output!r}")


def test_rendering_never_calls_format(monkeypatch):

  class NoFormat(str):
    def format(self, *args, **kwargs):
      raise AssertionError("format called")

  template = data.parse_template(NoFormat("{instruction} {input} {output}"))
  assert isinstance(template.text, NoFormat)
  monkeypatch.setattr(_instructions, "ALPACA",
                      tuple(t._replace(text=NoFormat(t.text))
                            for t in _instructions.ALPACA))
  assert data.render(WANT[1], template) == ("Add them. 2 and 3 ", "5")
  assert data.render(WANT[1])[1] == "5"


@pytest.mark.parametrize("template,message", [
    ("{instruction.__class__} {output}", "'{instruction.__class__}'"),
    ("{instruction} {input.__init__.__globals__} {output}",
     "'{input.__init__.__globals__}'"),
    ("{instruction[0]} {output}", "'{instruction[0]}'"),
    ("{instruction} {output!r}", "'{output!r}'"),
    ("{instruction} {input:>10} {output}", "'{input:>10}'"),
    ("{instruction} {input:{output}} {output}", "not allowed"),
    ("{0} {instruction} {output}", "'{0}'"),
    ("{} {instruction} {output}", "'{}'"),
    ("{instruction} {context} {output}", "'{context}'"),
    ("{instruction} {output} {input}", "after {output}"),
    ("{instruction} {output}{output}", "after {output}"),
    ("{instruction} answer", "no {output}"),
    ("{input} {output}", "no {instruction}"),
    ("{instruction {output}", "malformed"),
    ("{instruction} } {output}", "malformed"),
    ("", "no {output}"),
])
def test_templates_that_are_not_plain_fields_are_refused(template, message):
  with pytest.raises(ValueError, match=message.replace("[", r"\[").replace(
      "{", r"\{").replace("}", r"\}")):
    data.parse_template(template)


def test_a_template_must_be_a_string():
  with pytest.raises(TypeError, match="template must be a str"):
    data.parse_template(b"{instruction} {output}")


def test_a_template_without_input_refuses_a_record_with_one():
  template = data.parse_template("{instruction}: {output}")
  assert data.render(WANT[0], template) == ("Name a colour.: ", "Blue.")
  with pytest.raises(ValueError, match="rec has an input.*would be lost"):
    data.render(WANT[1], template, where="rec")
