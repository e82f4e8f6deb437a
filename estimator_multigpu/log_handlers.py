"""Each log line once: absl's handler, installed when the package is imported.

The package logs through absl. absl's first log call, when the root logger
has no handler, calls `logging.basicConfig()`; TensorFlow, imported while
the root had none, has its own handler on its `tensorflow` logger, whose
records also go up to the root's: every TensorFlow warning was printed
twice. `install` (run by the package's `__init__`, so before any of its
modules logs) does what absl's `app.run` does, once, when the process has
no logging set up: absl's handler on the root logger, at WARNING until
`absl.logging.set_verbosity`. A `tensorflow` logger that already has its own
handler keeps it and stops passing its records up (they are printed once,
as TensorFlow prints them). A root logger with handlers is left alone.
"""

from __future__ import annotations

import logging

from absl import logging as absl_logging


def install() -> None:
  """absl's handler on the root logger, unless logging is set up already."""
  root = logging.getLogger()
  if root.handlers:
    return
  absl_logging.use_absl_handler()
  tensorflow = logging.getLogger("tensorflow")
  if tensorflow.handlers:
    tensorflow.propagate = False
