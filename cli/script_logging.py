"""Quiet logs for the scripts: progress and our own lines, each once.

By default (`--verbosity=0`) the scripts' stderr holds the absl lines of
this project (the plan, the progress lines with their ETA, warnings) and
TensorFlow's warnings and errors, each once, in absl's format:

- TensorFlow's C++ INFO lines (CPU features, MLIR, rendezvous cancellations,
  profiler sessions) are off: `TF_CPP_MIN_LOG_LEVEL=1`, which must be set
  before TensorFlow is imported (`before_tensorflow`).
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

import logging as std_logging
import os
import sys
import warnings
from typing import Optional, Sequence

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


class _DropDeprecations(std_logging.Filter):
  """Drops TensorFlow's deprecation notices."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    message = str(record.msg)
    return not any(text in message for text in DEPRECATION_TEXTS)


_FILTER = _DropDeprecations()


def configure(verbosity: int) -> None:
  """Routes TensorFlow's Python logs through absl, once, at `verbosity`.

  Call after absl parsed the flags (at the top of `main`).
  """
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
