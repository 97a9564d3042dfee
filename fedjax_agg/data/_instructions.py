"""Instruction-tuning records: reading, checking and the prompt template.

Records. An ``InstructionRecord`` is Alpaca's (Taori et al., "Stanford
Alpaca: An Instruction-following LLaMA Model", 2023) triple: an
``instruction``, an optional ``input`` giving context (empty when there is
none) and the ``output`` the model should learn to write, plus an
optional ``category`` (Dolly's ``category``, e.g. "open_qa"), which the
category splits read. Files hold a JSON list of objects (``.json``) or
one object per line (JSON Lines: ``.jsonl``/``.ndjson``, or any file
whose first character is ``{``). ``fields`` maps these names onto a file's
own keys, e.g. Dolly's ``{"input": "context", "output": "response"}``;
other keys are ignored.

What is refused, naming the file and the record (its index in a list, its
line number in JSON Lines): a file that is not UTF-8 JSON or is truncated,
``NaN`` or ``Infinity`` anywhere (they are not JSON), a record that is not
an object or that gives a key twice, a missing ``instruction`` or
``output``, a field that is not a string (``input`` may also be null or
absent; ``category`` may be a string or an integer, kept as its string),
an empty or whitespace-only
``instruction``, ``output`` or ``category`` (nothing to learn from, or
no category to split by). A UTF-8 byte order mark is dropped.

Templates. ``ALPACA_TEMPLATE`` and ``ALPACA_TEMPLATE_NO_INPUT`` are
Alpaca's prompts with and without an input, ending in ``### Response:``
and a newline (the layout the alpaca-lora project uses); ``template=None``
picks the first for a record with an input and the second for one
without. Your own template is one string with the fields
``{instruction}``, ``{input}`` and ``{output}``: ``{output}`` exactly once,
no field after it; ``{{`` and ``}}`` are literal braces. A template is
data, never code: it is split into its literal text and bare field names
and the record's strings are placed between them (``str.format`` is never
called), so attribute or index access (``{instruction.__class__}``,
``{input[0]}``), conversions and format specs (``{output!r}``,
``{input:>9}``), positional and unknown fields are refused. A template
without ``{input}`` refuses a record that has an input (it would be lost).

Prompt and response. ``render`` returns the text before ``{output}``
(the prompt, which the loss skips) and ``output`` with the text after it
(the response, which the loss scores).
"""

import math
import os
import pathlib
import string
from typing import Mapping, NamedTuple, Optional, Sequence, Union

from fedjax_agg.data._tokenizer import parse_json
from fedjax_agg.data._tokenizer import read_text

FIELDS = ("instruction", "input", "output", "category")
"""A record's fields, as ``fields`` maps them to a file's keys."""
ALPACA_TEMPLATE = (
    "Below is an instruction that describes a task, paired with an input "
    "that provides further context. Write a response that appropriately "
    "completes the request.\n\n### Instruction:\n{instruction}\n\n"
    "### Input:\n{input}\n\n### Response:\n{output}")
"""Alpaca's prompt for a record with an input."""
ALPACA_TEMPLATE_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that "
    "appropriately completes the request.\n\n### Instruction:\n"
    "{instruction}\n\n### Response:\n{output}")
"""Alpaca's prompt for a record without an input."""
PathLike = Union[str, os.PathLike]
"""A file path."""
_JSON_LINES = (".jsonl", ".ndjson")


class InstructionRecord(NamedTuple):
  """One instruction-tuning example.

  Attributes:
    instruction: the task, non-empty.
    input: its context ("" when there is none).
    output: the response to learn, non-empty.
    category: its category (Dolly's ``category``), or None.
  """
  instruction: str
  input: str
  output: str
  category: Optional[str] = None


def _field_names(fields: Optional[Mapping[str, str]]) -> dict[str, str]:
  names = {field: field for field in FIELDS}
  if fields is None:
    return names
  if not isinstance(fields, Mapping):
    raise TypeError(f"fields must be a mapping, got {type(fields).__name__}")
  unknown = sorted(set(fields) - set(FIELDS), key=str)
  if unknown:
    raise ValueError(f"fields: unknown record fields {unknown}; the fields "
                     f"are {FIELDS}")
  for field, key in fields.items():
    if not isinstance(key, str) or not key:
      raise TypeError(f"fields[{field!r}] must be a non-empty str, got "
                      f"{key!r}")
  names.update(fields)
  return names


def _text(value, where: str, key: str, optional: bool) -> str:
  if value is None and optional:
    return ""
  if not isinstance(value, str):
    raise TypeError(f"{where}: {key!r} must be a string, got "
                    f"{type(value).__name__} {value!r:.40}")
  if not optional and not value.strip():
    raise ValueError(f"{where}: {key!r} is empty")
  return value


def _category(value, where: str, key: str) -> Optional[str]:
  if isinstance(value, str) and not value.strip():
    raise ValueError(f"{where}: {key!r} is empty (leave it out or null)")
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, int) and not isinstance(value, bool):
    return str(value)
  if isinstance(value, float) and not math.isfinite(value):
    raise ValueError(f"{where}: {key!r} is {value} (not a category)")
  raise TypeError(f"{where}: {key!r} must be a string or an integer, got "
                  f"{type(value).__name__} {value!r:.40}")


def check_record(record, where: str = "record",
                 fields: Optional[Mapping[str, str]] = None
                 ) -> InstructionRecord:
  """One record (a mapping, or an ``InstructionRecord``) checked.

  Args:
    record: the record.
    where: how messages name it (e.g. "data.jsonl line 3").
    fields: record field -> the record's key (default the field's name).

  Raises:
    TypeError, ValueError: naming ``where`` and the key (see the module
      docstring for what is refused).
  """
  names = _field_names(fields)
  if isinstance(record, InstructionRecord):
    record = record._asdict()
    # An InstructionRecord already carries the field names; ``fields`` maps
    # a file's keys only.
    names = {field: field for field in FIELDS}
  if not isinstance(record, Mapping):
    raise TypeError(f"{where} must be an object with "
                    f"{names['instruction']!r} and {names['output']!r}, "
                    f"got {type(record).__name__}")
  for field in ("instruction", "output"):
    if names[field] not in record:
      raise ValueError(f"{where} has no {names[field]!r} (keys: "
                       f"{sorted(map(str, record))[:10]})")
  return InstructionRecord(
      instruction=_text(record[names["instruction"]], where,
                        names["instruction"], False),
      input=_text(record.get(names["input"]), where, names["input"], True),
      output=_text(record[names["output"]], where, names["output"], False),
      category=_category(record.get(names["category"]), where,
                         names["category"]))


def check_records(records: Sequence, where: str = "records",
                  fields: Optional[Mapping[str, str]] = None
                  ) -> list[InstructionRecord]:
  """Records (mappings or ``InstructionRecord``) checked; see
  ``check_record``. Refuses an empty list."""
  # A str is a Sequence too: it, and a single record, are refused rather
  # than iterated.
  if isinstance(records, (str, bytes, Mapping)) or not isinstance(
      records, Sequence):
    raise TypeError(f"{where} must be a list of records, got "
                    f"{type(records).__name__}")
  if not records:
    raise ValueError(f"{where} holds no record")
  return [check_record(record, f"{where}[{i}]", fields)
          for i, record in enumerate(records)]


def _json_lines(path: pathlib.Path, text: str,
                fields) -> list[InstructionRecord]:
  records = []
  for number, line in enumerate(text.splitlines(), start=1):
    # Blank lines are skipped but still counted, so a message names the line
    # an editor shows.
    if line.strip():
      where = f"{path} line {number}"
      value = parse_json(line, where, number, unique_keys=True)
      records.append(check_record(value, where, fields))
  if not records:
    raise ValueError(f"{path} holds no record")
  return records


def read_instructions(path: PathLike,
                      fields: Optional[Mapping[str, str]] = None
                      ) -> list[InstructionRecord]:
  """The records of a JSON list or JSON Lines file, checked.

  Args:
    path: a ``.json`` file holding a list of objects, or a JSON Lines file
      (``.jsonl``/``.ndjson``, or a file whose first character is ``{``).
    fields: record field -> the file's key for it (default the same
      names), e.g. ``{"input": "context", "output": "response"}``.

  Raises:
    FileNotFoundError: no such file (named).
    TypeError, ValueError: naming the file, the record (index, or line
      number) and what is wrong.
  """
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"path must be a path, got {type(path).__name__}")
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"no instruction file {path}")
  _field_names(fields)
  text = read_text(path, "instruction file")
  start = text.lstrip()[:1]
  # A file starting with "{" cannot be a JSON list: JSON Lines, whatever
  # its name says.
  if path.suffix.lower() in _JSON_LINES or start == "{":
    return _json_lines(path, text, fields)
  if start != "[":
    raise ValueError(f"instruction file {path} must hold a JSON list of "
                     "records or JSON Lines (one object per line)")
  value = parse_json(text, f"instruction file {path}", unique_keys=True)
  return check_records(value, str(path), fields)


# ------------------------------------------------------------- templates


class Template(NamedTuple):
  """A checked template: ``prompt_parts`` and ``response_suffix``.

  Attributes:
    prompt_parts: the text before ``{output}`` as ``(literal, field)``
      pairs, ``field`` one of "instruction", "input" or None.
    response_suffix: the literal text after ``{output}``.
    text: the template as given.
  """
  prompt_parts: tuple
  response_suffix: str
  text: str

  @property
  def has_input(self) -> bool:
    """Whether the prompt places the record's input."""
    return any(field == "input" for _, field in self.prompt_parts)


def parse_template(text: str) -> Template:
  """A template string checked and split (see the module docstring).

  Raises:
    TypeError: not a string.
    ValueError: unbalanced braces, a field other than the three bare
      names, a conversion or format spec, no or several ``{output}``,
      a field after ``{output}``, or no ``{instruction}``.
  """
  if not isinstance(text, str):
    raise TypeError(f"template must be a str, got {type(text).__name__}")
  try:
    # Formatter.parse only splits the string into literals and field names;
    # nothing is formatted or looked up, so no field can reach an attribute.
    pieces = list(string.Formatter().parse(text))
  except ValueError as error:
    raise ValueError(f"template is malformed ({error}); write literal "
                     "braces as {{ and }}") from None
  prompt, suffix, seen_output = [], [], False
  for literal, field, spec, conversion in pieces:
    if field is not None and (field not in ("instruction", "input", "output")
                              or spec or conversion):
      shown = "{" + field + (f"!{conversion}" if conversion else "") + (
          f":{spec}" if spec else "") + "}"
      raise ValueError(f"template field {shown!r} is not allowed: a "
                       "template may hold only {instruction}, {input} and "
                       "{output}, without attributes, indices, "
                       "conversions or format specs")
    if seen_output:
      if field is not None:
        raise ValueError(f"template has field {{{field}}} after {{output}}; "
                         "the response must end the template")
      suffix.append(literal)
    elif field == "output":
      # The literal before {output} ends the prompt; {output} itself is the
      # response.
      prompt.append((literal, None))
      seen_output = True
    else:
      prompt.append((literal, field))
  if not seen_output:
    raise ValueError("template has no {output} field")
  if not any(field == "instruction" for _, field in prompt):
    raise ValueError("template has no {instruction} field")
  return Template(tuple(prompt), "".join(suffix), text)


# Parsed at import: the built-in templates pass the same checks as a
# caller's.
ALPACA = (parse_template(ALPACA_TEMPLATE),
          parse_template(ALPACA_TEMPLATE_NO_INPUT))


def render(record: InstructionRecord, template: Optional[Template] = None,
           where: str = "record") -> tuple[str, str]:
  """(prompt, response) of a record under a parsed template.

  ``template=None``: Alpaca's, with or without input by the record.

  Raises:
    ValueError: the record has an input the template does not place.
  """
  if template is None:
    template = ALPACA[0] if record.input else ALPACA[1]
  elif record.input and not template.has_input:
    raise ValueError(f"{where} has an input but the template has no "
                     "{input} field; it would be lost")
  values = {"instruction": record.instruction, "input": record.input}
  prompt = "".join(literal + (values[field] if field else "")
                   for literal, field in template.prompt_parts)
  return prompt, record.output + template.response_suffix
