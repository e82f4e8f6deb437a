"""Fixtures for tests that import the scripts' functions (train.py, ...)."""

from absl import flags
from absl.testing import flagsaver
import pytest

FLAGS = flags.FLAGS


@pytest.fixture
def parsed_flags():
  """Parsed absl flags (defaults), restored after the test."""
  if not FLAGS.is_parsed():
    FLAGS(["test"])
  with flagsaver.flagsaver():
    yield
