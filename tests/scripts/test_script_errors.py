"""cli/entry_point.py: whose error it is (exit status 2 or 1)."""

import os
import sys
import types

import pytest
import tensorflow as tf

from cli import entry_point


@pytest.mark.parametrize("error,status", [
    (ValueError("x"), 2), (FileNotFoundError("x"), 2), (TypeError("x"), 2),
    (TimeoutError("ps task 0 did not answer"), 1),
    (ConnectionError("reset"), 1), (RuntimeError("x"), 1),
    (tf.errors.UnavailableError(None, None, "Socket closed"), 1)])
def test_whose_error_it_is(error, status):
  message, got = entry_point.explain(error)
  assert got == status and message.endswith(("x", "answer", "reset",
                                             "Socket closed"))


@pytest.mark.parametrize("error,status", [
    (TimeoutError("waited 3 s for ps task 0, which did not answer"), 1),
    (ValueError("--batch_size=0: expected a number >= 1"), 2)])
def test_a_cluster_task_fails_with_one_line_naming_it(error, status,
                                                      monkeypatch, capsys):
  import train  # pylint: disable=g-import-not-at-top

  def fail(task, settings):
    raise error

  monkeypatch.setattr(train, "run", fail)
  monkeypatch.delenv(entry_point.TRACEBACK_ENV, raising=False)
  task = types.SimpleNamespace(device="/job:worker/task:1")
  assert train.run_cluster_task(task, train.Settings()) == status
  lines = capsys.readouterr().err.splitlines()
  assert lines == [f"{os.path.basename(sys.argv[0])} (/job:worker/task:1): "
                   f"error: {'TimeoutError: ' if status == 1 else ''}"
                   f"{error}"]
