"""cli/errors.py: whose error it is (exit status 2 or 1)."""

import pytest
import tensorflow as tf

from cli import errors


@pytest.mark.parametrize("error,status", [
    (ValueError("x"), 2), (FileNotFoundError("x"), 2), (TypeError("x"), 2),
    (TimeoutError("ps task 0 did not answer"), 1),
    (ConnectionError("reset"), 1), (RuntimeError("x"), 1),
    (tf.errors.UnavailableError(None, None, "Socket closed"), 1)])
def test_whose_error_it_is(error, status):
  message, got = errors.explain(error)
  assert got == status and message.endswith(("x", "answer", "reset",
                                             "Socket closed"))
