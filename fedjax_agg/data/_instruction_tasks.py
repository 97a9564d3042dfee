"""A small instruction set generated offline: ``generated_instructions``.

Provenance. Every record is made by this module from fixed templates and
numbers and made-up words drawn from ``numpy.random.default_rng(seed)``;
no outside text goes in, so the set is in the public domain by
construction and needs no file or network. The same ``seed`` and
``num_records`` give the same records on every machine (numpy's PCG64
stream is stable across platforms and versions).

Categories (``INSTRUCTION_CATEGORIES``), each with an answer a few lines
of Python compute exactly:

* ``arithmetic``: "What is 37 + 58?" (sum, difference or product of two
  numbers below 100; no input);
* ``reverse``: reverse the letters of a word (the word is the input);
* ``capitalise``: capitalise the first letter of every word of a phrase;
* ``count``: how many times a letter occurs in a word;
* ``sort``: sort a list of numbers in ascending order.

Records are dealt category by category in a seeded order with
probabilities ``weights`` (default equal), so ``num_records`` of them
hold each category about ``num_records * weight`` times.
"""

from typing import Optional, Sequence

import numpy as np

from fedjax_agg.data._instructions import InstructionRecord

INSTRUCTION_CATEGORIES = ("arithmetic", "reverse", "capitalise", "count",
                          "sort")
"""The categories of ``generated_instructions``, in order."""
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"
_OPERATIONS = (("+", "sum", lambda a, b: a + b),
               ("-", "difference", lambda a, b: a - b),
               ("*", "product", lambda a, b: a * b))


def _word(rng: np.random.Generator) -> str:
  """A made-up word of 2 to 4 consonant-vowel syllables."""
  syllables = rng.integers(2, 5)
  return "".join(_CONSONANTS[rng.integers(len(_CONSONANTS))]
                 + _VOWELS[rng.integers(len(_VOWELS))]
                 for _ in range(syllables))


def _arithmetic(rng):
  a, b = (int(v) for v in rng.integers(0, 100, size=2))
  symbol, _, apply = _OPERATIONS[rng.integers(len(_OPERATIONS))]
  return f"What is {a} {symbol} {b}?", "", str(apply(a, b))


def _reverse(rng):
  word = _word(rng)
  return "Reverse the letters of this word.", word, word[::-1]


def _capitalise(rng):
  phrase = " ".join(_word(rng) for _ in range(rng.integers(2, 5)))
  return ("Capitalise the first letter of every word.", phrase,
          " ".join(w[:1].upper() + w[1:] for w in phrase.split(" ")))


def _count(rng):
  word = _word(rng)
  letter = word[rng.integers(len(word))]
  return (f"How many times does the letter '{letter}' occur in this word?",
          word, str(word.count(letter)))


def _sort(rng):
  numbers = [int(v) for v in rng.integers(0, 100, size=rng.integers(3, 7))]
  return ("Sort these numbers in ascending order.",
          ", ".join(map(str, numbers)), ", ".join(map(str, sorted(numbers))))


_MAKERS = {"arithmetic": _arithmetic, "reverse": _reverse,
           "capitalise": _capitalise, "count": _count, "sort": _sort}


def generated_instructions(num_records: int = 1000, seed: int = 0,
                            weights: Optional[Sequence[float]] = None
                            ) -> list[InstructionRecord]:
  """A generated instruction set in the five ``INSTRUCTION_CATEGORIES``.

  Args:
    num_records: how many records (>= 1).
    seed: the seed of every draw.
    weights: the probability of each category (in
      ``INSTRUCTION_CATEGORIES``' order), non-negative, finite, not all
      zero; None: equal.

  Returns:
    ``num_records`` ``InstructionRecord``s with their ``category`` set.
  """
  if isinstance(num_records, bool) or not isinstance(
      num_records, int) or num_records < 1:
    raise ValueError(f"num_records must be an int >= 1, got {num_records!r}")
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
    raise ValueError(f"seed must be an int >= 0, got {seed!r}")
  if weights is None:
    weights = np.ones(len(INSTRUCTION_CATEGORIES))
  weights = np.asarray(weights, np.float64)
  if weights.shape != (len(INSTRUCTION_CATEGORIES),) or not np.all(
      np.isfinite(weights)) or (weights < 0).any() or weights.sum() <= 0:
    raise ValueError(f"weights must be {len(INSTRUCTION_CATEGORIES)} finite "
                     f"non-negative numbers, not all 0, got {weights}")
  rng = np.random.default_rng(seed)
  # All categories are drawn before any record is made: changing how one
  # category is made changes later records' texts, never their categories.
  categories = rng.choice(len(INSTRUCTION_CATEGORIES), size=num_records,
                          p=weights / weights.sum())
  records = []
  for category in categories:
    name = INSTRUCTION_CATEGORIES[category]
    instruction, given, answer = _MAKERS[name](rng)
    records.append(InstructionRecord(instruction, given, answer, name))
  return records
