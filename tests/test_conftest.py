"""The suite's own configuration names what exists."""

import os

from tests import conftest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_long_modules_run_first_exist_and_are_named_once():
  assert len(set(conftest.LONG_FIRST)) == len(conftest.LONG_FIRST)
  for module in conftest.LONG_FIRST:
    assert os.path.isfile(os.path.join(ROOT, module)), module
