"""Ending a process at once, without leaving the model dir locked.

A process holding a gRPC server can take tens of seconds, or forever, in
TensorFlow's C++ teardown at a normal exit (clean server shutdown is not
implemented), and a step that never returns keeps a normal exit from
happening at all; so such ends leave through `os._exit`, which runs no
`finally` block and no `atexit` handler. `exit_now` first does what those
would have done: it closes (flushes) the event files, releases the model
dir locks this process holds (`model_dir_lock.release_held`) and flushes
the logs.
"""

from __future__ import annotations

import os
import sys

from absl import logging
import tensorflow as tf

from estimator_multigpu.runtime import model_dir_lock

tf1 = tf.compat.v1


def exit_now(status: int) -> None:
  """Flushes the event files and logs, releases this process's model dir
  locks, then ends the process with `status` at once."""
  tf1.summary.FileWriterCache.clear()  # closes (flushes) every event file.
  model_dir_lock.release_held()
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # pylint: disable=protected-access
