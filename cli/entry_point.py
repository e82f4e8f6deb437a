"""The scripts' entry point: a mistake ends with one line on stderr.

Importing this module first checks that the scripts' packages are
installed (`check_installed`), with the standard library only: `python3
train.py` from a Python without the project's environment ends with one line
naming the missing packages and the fix, status 2, before absl or
TensorFlow is imported (outside a script: `ModuleNotFoundError`, same text).
It only looks for the packages (`importlib.util.find_spec`). When a script
runs, it then sets the C++ log level (`script_logging.before_tensorflow`:
`TF_CPP_MIN_LOG_LEVEL=1` unless given) before anything imports TensorFlow
(the `--help` groups import the library, which imports TensorFlow).

`run(main, doc)` replaces `app.run(main, flags_parser=...)` in train.py,
eval.py and export.py. It keeps the grouped `--help` (cli/flags/grouped_help.py)
and turns every error into ONE line on stderr, `<script>: error: <what was
given, what was expected, how to fix it>`, with an exit status that says
whose it is:

- 2 (`USAGE`): a bad flag or input: absl's flag errors and validators
  (cli/flags/validators.py), `ValueError`/`TypeError`/`OSError` raised for the
  flags, data files or a model dir that does not fit, bad records (named by
  datasets/record_checks.py), a checkpoint path with no checkpoint.
- 1 (`FAILURE`): a failure at run time: a NaN loss, a cluster peer that
  does not answer (`TimeoutError`, `ConnectionError`), a TensorFlow error
  other than a bad record, anything unexpected.

A Ctrl-C that interrupts (a second one while the first stops training
cleanly, or one before training starts) is one line and status 130; a full
disk ("No space left on device") is one line, without TensorFlow's
out-of-memory hint, and status 1.

No traceback is shown unless `--verbosity=1` (or higher) or the environment
variable `EMG_TRACEBACK=1`. Exits by signal keep their status (`SystemExit`
passes through: 128 + signal after SIGTERM or Ctrl-C).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import re
import sys
import traceback
from typing import Callable, List, Optional, Sequence, Tuple

SCRIPTS = ("train.py", "eval.py", "export.py", "convert.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# module -> the package that installs it (setup.cfg: the library, cpu/gpu,
# app).
REQUIRED = {"absl": "absl-py", "numpy": "numpy", "tensorflow": "tensorflow",
            "tensorflow_estimator": "tensorflow-estimator",
            "tf_slim": "tf-slim", "sklearn": "scikit-learn", "tqdm": "tqdm"}
INSTALL = ('pip install -e ".[cpu,app]" (CUDA GPUs: ".[gpu,app]"; '
           "TensorFlow is an extra, so that you pick the build)")


def missing_packages() -> List[str]:
  """The packages of REQUIRED this Python cannot import, in order."""
  return [package for module, package in REQUIRED.items()
          if importlib.util.find_spec(module) is None]


def missing_message(missing: Sequence[str]) -> str:
  """What is missing, for which Python, and the fix (the checkout's .venv
  when it has one and this Python is another)."""
  verb, them = ("is", "it") if len(missing) == 1 else ("are", "them")
  venv = os.path.join(ROOT, ".venv")
  fix = f"install {them} from this checkout: {INSTALL}"
  if os.path.isdir(venv) and os.path.realpath(sys.prefix) != (
      os.path.realpath(venv)):
    fix = ("activate the checkout's environment (. .venv/bin/activate), "
           f"or {fix}")
  return (f"{', '.join(missing)} {verb} not installed for {sys.executable}: "
          f"the scripts need {them}; {fix}; then run the command again.")


def running_script() -> str:
  """The script this process runs (train.py, ...), else ''."""
  name = os.path.basename(sys.argv[0]) if sys.argv else ""
  return name if name in SCRIPTS else ""


def check_installed() -> None:
  """Nothing when every package of REQUIRED is there.

  Raises:
    ModuleNotFoundError: packages are missing and no script runs.
    SystemExit: 2, after one line on stderr, when a script runs.
  """
  missing = missing_packages()
  if not missing:
    return
  script = running_script()
  if script:
    sys.stderr.write(f"{script}: error: {missing_message(missing)}\n")
    sys.exit(2)
  raise ModuleNotFoundError(missing_message(missing), name=missing[0])


check_installed()  # before absl: a missing package is one line.

# pylint: disable=g-import-not-at-top,wrong-import-position,g-bad-import-order
from cli import script_logging

if running_script():  # before TensorFlow, which grouped_help imports.
  script_logging.before_tensorflow()

from absl import app
from absl import flags

from cli.flags import grouped_help
from cli.flags import unknown

# pylint: enable=g-import-not-at-top,wrong-import-position,g-bad-import-order

USAGE = 2
FAILURE = 1
INTERRUPTED = 130  # 128 + SIGINT: a second Ctrl-C.
NO_SPACE = "No space left on device"
TRACEBACK_ENV = "EMG_TRACEBACK"
FLAGS = flags.FLAGS
_USER_ERRORS = (ValueError, TypeError, OSError, app.UsageError, flags.Error)
_RUN_TIME = (TimeoutError, ConnectionError)  # OSErrors: a peer, not a flag.
_DECODE_ERRORS = (r"Invalid (PNG|JPEG|GIF|BMP)|jpeg::Uncompress|Unknown image "
                  r"file format")  # tf.io.decode_image's own errors.


def one_line(text: str) -> str:
  """`text` without TensorFlow's node and stack lines, on one line."""
  from datasets.record_checks import TF_NOISE  # pylint: disable=g-import-not-at-top
  kept = [line.strip() for line in str(text).splitlines()
          if line.strip() and not line.strip().startswith(TF_NOISE)]
  return re.sub(r"\s+", " ", " ".join(kept)).strip() or "(no message)"


def explain(error: BaseException) -> Tuple[str, int]:
  """(the one-line message, the exit status) for an error of a script."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if isinstance(error, tf.errors.OpError):
    return _explain_op_error(error)
  if isinstance(error, OSError) and error.errno == errno.ENOSPC:
    return no_space_line(f"{error.filename}: {NO_SPACE}"), FAILURE
  if isinstance(error, _USER_ERRORS) and not isinstance(error, _RUN_TIME):
    return one_line(str(error)), USAGE
  name = type(error).__name__
  return f"{name}: {one_line(str(error))}", FAILURE


def _explain_op_error(error) -> Tuple[str, int]:
  """TensorFlow's run-time errors; bad records and checkpoint paths are the
  user's (status 2), named; a full disk is one line without TensorFlow's
  out-of-memory hint."""
  message = _bad_record(error) or _not_a_checkpoint(error)
  if message:
    return message, USAGE
  if NO_SPACE in error.message:
    return no_space_line(error.message), FAILURE
  return f"{type(error).__name__}: {one_line(error.message)}", FAILURE


def no_space_line(message: str) -> str:
  """A full disk, named with the file being written (when the message has
  it) and the fix."""
  path = re.search(r"(\S*/[^\s;:]+)[;:]? *" + NO_SPACE, message)
  where = f" while writing {path.group(1)}" if path else ""
  return (f"{NO_SPACE}{where}: the disk is full. Free some space (or "
          "choose a --model_dir on another disk), then run the same command "
          "again: training resumes from the newest complete checkpoint.")


def _bad_record(error) -> Optional[str]:
  """A damaged record file (DataLossError) or a record check that failed
  (datasets/record_checks.py), named; else None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from datasets import record_checks  # pylint: disable=g-import-not-at-top
  if isinstance(error, tf.errors.DataLossError):
    return record_checks.find_damaged_record()
  if isinstance(error, tf.errors.InvalidArgumentError) and re.search(
      _DECODE_ERRORS, error.message):
    return record_checks.find_undecodable_image()
  found = re.search(r"assertion failed: \[(.*?)\]\s*(\n|$)", error.message,
                    re.S)
  if found and re.search(r"record \d+ in ", found.group(1)):
    return one_line(found.group(1))
  return None


def _not_a_checkpoint(error) -> Optional[str]:
  """A checkpoint path with no checkpoint (NotFoundError); else None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  missing = re.search(r"Failed to find any matching files for (\S+)",
                      error.message)
  if not isinstance(error, tf.errors.NotFoundError) or not missing:
    return None
  path = missing.group(1).rstrip(".,;")
  return (f"{path} is not a checkpoint (no {path}.index); give a checkpoint "
          "prefix such as <model_dir>/model.ckpt-<step>, or leave the flag "
          "out for the model dir's latest")


def wants_traceback(argv: Sequence[str]) -> bool:
  """--verbosity >= 1 on the command line, or EMG_TRACEBACK=1."""
  return (os.environ.get(TRACEBACK_ENV, "") not in ("", "0") or
          script_logging.verbosity_from_argv(argv) >= script_logging.VERBOSE)


def report(error: BaseException, argv: Sequence[str],
           task: Optional[str] = None) -> int:
  """Writes the error's line (after the traceback when asked); its status.

  `task`: the cluster task that failed, named in the line.
  """
  message, status = explain(error)
  if wants_traceback(argv):
    traceback.print_exception(type(error), error, error.__traceback__)
  prog = os.path.basename(argv[0]) if argv else "script"
  where = f" ({task})" if task else ""
  sys.stderr.write(f"{prog}{where}: error: {message}\n")
  sys.stderr.flush()
  return status


def report_interrupt(argv: Sequence[str]) -> int:
  """One line for Ctrl-C that was not a clean stop (a second one, or one
  before training started); its status, 130."""
  prog = os.path.basename(argv[0]) if argv else "script"
  sys.stderr.write(
      f"{prog}: interrupted (Ctrl-C): stopped at once, without a final "
      "checkpoint; the newest checkpoint in the model dir is complete and a "
      "rerun resumes from it.\n")
  sys.stderr.flush()
  return INTERRUPTED


def parser(doc: str) -> Callable[[list], list]:
  """A `flags_parser`: grouped `--help`, else absl's parse; a flag error is
  one line and exit status 2 (absl: 'FATAL Flags parsing error', 1), and
  every unknown flag is named in that line, with tf-slim's equivalents
  (cli/flags/unknown.py)."""
  help_parser = grouped_help.parser(doc)

  def parse(argv: list) -> list:
    if grouped_help.wants_help(argv):
      return help_parser(argv)
    unknown_flags = unknown.problem(argv, FLAGS)
    if unknown_flags:
      sys.exit(report(flags.Error(unknown_flags), argv))
    try:
      return FLAGS(argv)
    except flags.UnrecognizedFlagError as error:
      sys.exit(report(flags.Error(
          f"{error}; python {os.path.basename(argv[0])} --help lists the "
          "flags."), argv))
    except flags.Error as error:
      sys.exit(report(error, argv))

  return parse


def check_no_arguments(args: Sequence[str]) -> None:
  """The scripts take flags only: a word without `--` is a mistake.

  Raises:
    app.UsageError: naming the words, e.g. `model_dir=runs/a`.
  """
  if len(args) > 1:
    words = " ".join(args[1:])
    example = f"--{args[1].lstrip('-')}" if "=" in args[1] else "--name=value"
    raise app.UsageError(
        f"unexpected argument(s) {words!r}: the script takes flags only, "
        f"each starting with --, e.g. {example}.")


def guarded(main: Callable[[list], Optional[int]],
            argv: Sequence[str]) -> Callable[[list], Optional[int]]:
  """`main`, with any exception (not SystemExit) reported by `report`."""

  def run_main(args: list) -> Optional[int]:
    try:
      check_no_arguments(args)
      return main(args)
    except KeyboardInterrupt:
      sys.exit(report_interrupt(argv))
    except Exception as error:  # pylint: disable=broad-except
      sys.exit(report(error, argv))

  return run_main


def call(main: Callable[[list], Optional[int]], doc: str,
         argv: Sequence[str]) -> Optional[int]:
  """Parses `argv` and runs `main` in this process, as `run` does (tests);
  absl's `app.run` can run only once per process."""
  args = parser(doc)(list(argv))
  return guarded(main, argv)(args)


def run(main: Callable[[list], Optional[int]], doc: str) -> None:
  """The scripts' `if __name__ == "__main__":` body."""
  app.run(guarded(main, list(sys.argv)), flags_parser=parser(doc))
