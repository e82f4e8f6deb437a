"""train.py's checkpoint flags, and the checks that a run can save.

`check_model_dir` fails before any step when the model dir cannot be
written or its disk is nearly full; `checkpoint_schedule` refuses a schedule
that would never save (Estimator would then write no checkpoint at all, not
even at the end or on SIGTERM).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

from absl import flags


flags.DEFINE_integer("save_checkpoints_steps", 500, "Checkpoint every N "
                     "steps (> 0; larger than --max_steps: only at the start "
                     "and the end, including a stop by SIGTERM).")
flags.DEFINE_integer("save_checkpoints_secs", None, "Checkpoint every N "
                     "seconds instead of every --save_checkpoints_steps.")
flags.DEFINE_integer("save_summary_steps", 100, "Summaries every N steps.")
flags.DEFINE_integer("min_free_disk_mb", 50, "Refuse to start when the model "
                     "dir's disk has less free space than this.")
flags.DEFINE_integer("stop_grace_secs", 60, "After SIGTERM/Ctrl-C, exit "
                     "without a final checkpoint if the current step has not "
                     "finished within this time (e.g. a synchronous step "
                     "waiting for a dead worker).")


def check_model_dir(model_dir: str, min_free_mb: int) -> None:
  """Fails before any step when checkpoints could not be written.

  Raises:
    OSError: the directory cannot be created or written, or its disk has
      less than `min_free_mb` MB free.
  """
  try:
    os.makedirs(model_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=model_dir, prefix=".write_check"):
      pass
  except OSError as error:
    reason = error.strerror or str(error)
    raise OSError(
        f"--model_dir={model_dir} cannot be written ({reason}); checkpoints "
        "would be lost. Choose a writable directory.") from error
  free_mb = shutil.disk_usage(model_dir).free / 2**20
  if free_mb < min_free_mb:
    raise OSError(
        f"--model_dir={model_dir} has {free_mb:.0f} MB free, less than "
        f"--min_free_disk_mb={min_free_mb}; checkpoints would fail. Free "
        "some space or choose another directory.")


def checkpoint_schedule(steps: Optional[int], secs: Optional[int],
                        steps_given: bool) -> tuple:
  """(save_checkpoints_steps, save_checkpoints_secs) for RunConfig.

  Raises:
    ValueError: a value that would never save (Estimator then writes no
      checkpoint at all, not even at the end), or both flags given.
  """
  if secs is not None:
    if steps_given:
      raise ValueError(
          f"--save_checkpoints_steps={steps} and --save_checkpoints_secs="
          f"{secs} both set when to save; give only one.")
    if secs <= 0:
      raise ValueError(
          f"--save_checkpoints_secs={secs} would never write a checkpoint, "
          "not even at the end or on SIGTERM; give a number of seconds > 0.")
    return None, secs
  if steps is None or steps <= 0:
    raise ValueError(
        f"--save_checkpoints_steps={steps} would never write a checkpoint, "
        "not even at the end or on SIGTERM, so a stopped run loses "
        "everything; give a number of steps > 0. To save only at the start "
        "and the end (SIGTERM included), give one larger than --max_steps.")
  return steps, None


