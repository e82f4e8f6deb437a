"""Each log line once: a handler for absl's lines, installed on import.

The package logs through absl. absl's first log call, when the root logger
has no handler, calls `logging.basicConfig()`; TensorFlow, imported while
the root had none, has its own handler on its `tensorflow` logger, whose
records also went up to the root's: every TensorFlow warning was printed
twice. `install` (run by the package's `__init__`, before any of its
modules logs), when the process has no logging set up, puts one handler on
the root logger: absl's line format, written to the current `sys.stderr`
(absl's own handler would first print "Logging before flag parsing goes to
stderr" in a script without absl flags; `absl.app.run` replaces this one
with it). The package's INFO lines show after
`absl.logging.set_verbosity(absl.logging.INFO)`. A `tensorflow` logger with
its own handler keeps it and stops passing its records up (they print once,
as TensorFlow prints them). A root logger with handlers is left alone.
"""

from __future__ import annotations

import logging
import sys

from absl import logging as absl_logging


class _StderrHandler(logging.StreamHandler):
  """absl's format, to whatever `sys.stderr` is when a line is written."""

  def __init__(self):
    logging.Handler.__init__(self)  # pylint: disable=non-parent-init-called
    self.setFormatter(absl_logging.PythonFormatter())

  @property
  def stream(self):
    return sys.stderr

  @stream.setter
  def stream(self, value):
    del value  # always the current sys.stderr.


def install() -> None:
  """One handler on the root logger, unless logging is set up already."""
  root = logging.getLogger()
  if root.handlers:
    return
  root.addHandler(_StderrHandler())
  tensorflow = logging.getLogger("tensorflow")
  if tensorflow.handlers:
    tensorflow.propagate = False
