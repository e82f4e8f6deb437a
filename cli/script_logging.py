"""Quiet logs for the scripts: progress and our own lines, each once.

By default (`--verbosity=0`) the scripts' stderr holds the absl lines of
this project (the plan, the progress lines with their ETA, warnings) and
TensorFlow's warnings and errors, each once, in absl's format:

- TensorFlow's C++ INFO lines (CPU features, MLIR, rendezvous cancellations,
  profiler sessions) are off: `TF_CPP_MIN_LOG_LEVEL=1`, which must be set
  before TensorFlow is imported (`before_tensorflow`). From TF 2.17 the
  lines written before absl's C++ `InitializeLog` (oneDNN, "Could not find
  cuda drivers", and on a machine without an NVIDIA driver "failed call to
  cuInit") ignore that variable, so until `configure` runs (TensorFlow's
  import and its device listing while the flags are parsed) the scripts'
  stderr goes to a temporary file; `configure`, or the exit, writes back
  every line but those below the level (`_StartupCapture`).
- TensorFlow's Python logger keeps WARNING and above and hands its records
  to absl's handler only: TensorFlow installs its own handler when imported
  before absl's, which printed every line twice (`INFO:tensorflow:` and absl
  format).
- Deprecation notices (TensorFlow's "is deprecated and will be removed" and
  Python's `DeprecationWarning` / deprecated-layer `UserWarning`s) are off.

`--verbosity=1` (or `-v 1`) brings everything back: TensorFlow's INFO lines
and deprecation notices, C++ INFO lines, and the per-window scaling report.
An explicit `TF_CPP_MIN_LOG_LEVEL` in the environment is always respected.
"""

from __future__ import annotations

import atexit
import logging as std_logging
import os
import re
import sys
import tempfile
from typing import Optional, Sequence
import warnings

VERBOSE = 1  # --verbosity at which TensorFlow's own lines come back.
DEPRECATION_TEXTS = ("is deprecated and will be removed",
                     "Instructions for updating")


def verbosity_from_argv(argv: Sequence[str]) -> int:
  """The `--verbosity` / `-v` value on a command line (0 when absent).

  Read before absl parses the flags, to configure TensorFlow's C++ logging,
  which is fixed when TensorFlow is imported.
  """
  value = None
  for i, arg in enumerate(argv):
    if arg == "--":
      break
    for name in ("--verbosity", "-v", "--v"):
      if arg == name and i + 1 < len(argv):
        value = argv[i + 1]
      elif arg.startswith(name + "="):
        value = arg.split("=", 1)[1]
  try:
    return int(value) if value is not None else 0
  except ValueError:
    return 0  # absl reports the bad value when it parses the flags.


def before_tensorflow(argv: Optional[Sequence[str]] = None) -> None:
  """Hides TensorFlow's C++ INFO lines unless verbose; import TF after it."""
  argv = sys.argv if argv is None else argv
  if verbosity_from_argv(argv) < VERBOSE:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    _CAPTURE.start(int(os.environ["TF_CPP_MIN_LOG_LEVEL"] or 0))


class _StartupCapture:
  """Holds fd 2 in a temporary file from TensorFlow's import to `configure`.

  Lines are written back in order, less the C++ log lines below the level
  (I=0, W=1, E=2 are dropped below 1, 2, 3), the pre-`InitializeLog`
  banner, and cuInit's failure on a machine without an NVIDIA driver.
  """
  _CPP = re.compile(rb"^([IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] ")
  _BANNER = b"WARNING: All log messages before absl::InitializeLog()"
  _NO_DRIVER = b"failed call to cuInit"

  def __init__(self):
    self.saved, self.file, self.level = None, None, 0

  def start(self, level: int) -> None:
    if self.saved is not None:
      return
    sys.stderr.flush()
    self.level, self.file = level, tempfile.TemporaryFile()
    self.saved = os.dup(2)
    os.dup2(self.file.fileno(), 2)
    atexit.register(self.stop)

  def stop(self) -> None:
    """Restores fd 2 and writes back what it should show (idempotent)."""
    if self.saved is None:
      return
    sys.stderr.flush()
    os.dup2(self.saved, 2)
    os.close(self.saved)
    self.saved = None
    self.file.seek(0)
    for line in self.file:
      if not self._hidden(line):
        os.write(2, line)
    self.file.close()

  def _hidden(self, line: bytes) -> bool:
    match = self._CPP.match(line)
    if line.startswith(self._BANNER):
      return True
    if match is None:
      return False
    rank = "IWEF".index(match.group(1).decode())
    no_driver = self._NO_DRIVER in line and not os.path.exists("/dev/nvidiactl")
    return rank < self.level or no_driver


_CAPTURE = _StartupCapture()


class _DropDeprecations(std_logging.Filter):
  """Drops TensorFlow's deprecation notices."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    message = str(record.msg)
    return not any(text in message for text in DEPRECATION_TEXTS)


_FILTER = _DropDeprecations()


def configure(verbosity: int) -> None:
  """Routes TensorFlow's Python logs through absl, once, at `verbosity`.

  Call after absl parsed the flags (at the top of `main`): TensorFlow's
  start-up lines captured since `before_tensorflow` are written back.
  """
  _CAPTURE.stop()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  logger = tf.get_logger()
  for handler in list(logger.handlers):
    logger.removeHandler(handler)  # absl's handler on the root logger stays.
  logger.propagate = True
  verbose = verbosity >= VERBOSE
  logger.setLevel(std_logging.INFO if verbose else std_logging.WARNING)
  logger.removeFilter(_FILTER)
  if not verbose:
    logger.addFilter(_FILTER)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning,
                            message=".*(deprecated|is deprecated)")
