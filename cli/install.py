"""Is TensorFlow installed? It is an extra, so that users pick the build.

`pip install -e .` installs the library's other dependencies but not
TensorFlow (`.[cpu]`: tensorflow-cpu, `.[gpu]`: tensorflow[and-cuda]).
`check_tensorflow` runs when `cli` (every script's first import),
`datasets`, `nets` or `preprocessing` is imported, before anything imports
TensorFlow: a script then ends with one line and status 2, an import from
your own code raises `ModuleNotFoundError` with the same advice.
It only looks for the package (`importlib.util.find_spec`): importing
TensorFlow here would come before the scripts quiet its C++ logs.
"""

from __future__ import annotations

import importlib.util
import os
import sys

SCRIPTS = ("train.py", "eval.py", "export.py")
MESSAGE = ("TensorFlow is not installed: it is an extra, so that you pick "
           "the build. From this checkout run pip install -e \".[cpu,app]\" "
           "(CPU) or pip install -e \".[gpu,app]\" (CUDA GPUs), then run the "
           "command again.")


def tensorflow_missing() -> bool:
  return importlib.util.find_spec("tensorflow") is None


def running_script() -> str:
  """The script this process runs (train.py, ...), else ''."""
  name = os.path.basename(sys.argv[0]) if sys.argv else ""
  return name if name in SCRIPTS else ""


def check_tensorflow() -> None:
  """Names the extras when TensorFlow is missing; nothing otherwise.

  Raises:
    ModuleNotFoundError: TensorFlow is missing and no script runs.
    SystemExit: 2, after one line on stderr, when a script runs.
  """
  if not tensorflow_missing():
    return
  script = running_script()
  if script:
    sys.stderr.write(f"{script}: error: {MESSAGE}\n")
    sys.exit(2)
  raise ModuleNotFoundError(MESSAGE, name="tensorflow")
