"""Where eval.py reads and writes: the run it evaluates, and its events.

- `check_run_dir`: a --model_dir that holds no run but lies inside one
  (e.g. `<run>/eval`, where eval.py writes its events) is refused, pointing
  at the run.
- `events_dir`: eval.py's event files (TensorBoard) go to
  --eval_events_dir, else `<model_dir>/eval`; when that cannot be written
  (a read-only model dir), to a new temporary folder, said once.
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional

from absl import logging

from estimator_multigpu.runtime import checkpoints as checkpoints_lib

from cli.model_dir import run_config

EVENTS_SUBDIR = "eval"  # Estimator.eval_dir()'s name.
TEMPORARY_PREFIX = "eval_events_"


def holds_run(folder: str) -> bool:
  """Whether train.py wrote there: run_config.json or checkpoint files."""
  return (os.path.isfile(run_config.path(folder)) or
          bool(checkpoints_lib.find_checkpoints(folder)))


def check_run_dir(model_dir: str) -> None:
  """Refuses a model dir that holds no run when its parent does.

  Raises:
    ValueError: naming the parent run and the flag that gives it.
  """
  parent = os.path.dirname(os.path.normpath(model_dir))
  if holds_run(model_dir) or not parent or not holds_run(parent):
    return
  what = (" (eval.py writes its events there)"
          if os.path.basename(os.path.normpath(model_dir)).startswith(
              EVENTS_SUBDIR) else "")
  raise ValueError(
      f"--model_dir={model_dir} holds no run, but it is a folder of the run "
      f"{parent}{what}, which holds the checkpoints; give "
      f"--model_dir={parent}.")


def events_dir(model_dir: str, flag_value: Optional[str]) -> str:
  """The folder eval.py writes its events to (see the module's doc)."""
  if flag_value:
    logging.info("Evaluation events go to --eval_events_dir=%s.", flag_value)
    return flag_value
  default = os.path.join(model_dir, EVENTS_SUBDIR)
  if _writable(default):
    return default
  folder = tempfile.mkdtemp(prefix=TEMPORARY_PREFIX)
  logging.warning("%s cannot be written (a read-only model dir?): the "
                  "evaluation's events go to %s instead; "
                  "--eval_events_dir=<folder> chooses the folder.", default,
                  folder)
  return folder


def _writable(path: str) -> bool:
  """Whether `path` can be written, or created, without creating it."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    parent = os.path.dirname(path)
    if parent == path:
      return False
    path = parent
  return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
